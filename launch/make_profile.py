#!/usr/bin/env python3
"""Turns `scmoe-bench gemm -J` and `scmoe-bench layer -J` reports measured on a device into an
emulated-GPU profile for `--backend emu --gpu PROFILE.json` (docs/emu.md, "Profiles"), as GPEmu
turns measured op times into its profiles.

The measured GEMM rate: with a layer report, the rate the layer's own expert GEMMs reach (routed and
shared experts, forward and backward, FLOPs over their stages' time, all rows of all layer reports
together), which is what a model runs; with gemm reports only, the best dense TFLOP/s measured.
A GPU profile's grouped_gemm_efficiency (the grouped GEMM's rate over the dense one's): with a layer
report 1, the rate already being the grouped GEMMs'; with gemm reports only, the best grouped TFLOP/s
of the provider the report lists first (the one auto picks) over the best dense.

  GPU:  python3 launch/make_profile.py --base h100 --name h100-ours layer.json > h100-ours.json
        the base's datasheet numbers, with gemm_efficiency = the measured rate / the base's bf16 peak.
  CPU:  python3 launch/make_profile.py --cpu --name vm --cores 2 --memcpy-gbps 8.5 --memory-gib 24 gemm.json
        a CPU as an emulated device: its peak = the measured rate, one "SM" per core.
"""
import argparse
import json
import sys


# (rate column, stage time column) pairs of a layer report's rows.
LAYER_GEMM_STAGES = [("experts_tflops", "experts_us"), ("experts_bwd_tflops", "experts_bwd_us"),
                     ("shared_tflops", "shared_us"), ("shared_bwd_tflops", "shared_bwd_us")]


def measured_gemm_tflops(paths):
    """Returns (TFLOP/s, what it is, sources, grouped over dense)."""
    best_dense, best_grouped, layer_flops, layer_us, sources = 0.0, 0.0, 0.0, 0.0, []
    for path in paths:
        with open(path) as f:
            report = json.load(f)
        kind = report.get("benchmark")
        if kind == "gemm":
            first = report["rows"][0].get("provider") if report["rows"] else None
            for row in report["rows"]:
                best_dense = max(best_dense, row.get("dense_tflops", 0.0))
                if row.get("provider") == first:
                    best_grouped = max(best_grouped, row.get("grouped_tflops", 0.0))
        elif kind == "layer":
            for row in report["rows"]:
                for rate, stage in LAYER_GEMM_STAGES:
                    if rate in row and stage in row and row[rate] > 0:
                        layer_flops += row[rate] * row[stage] * 1e6
                        layer_us += row[stage]
        else:
            sys.exit("make_profile.py: %s is not a scmoe-bench gemm or layer report" % path)
        sources.append("%s: %s (%s, %s)" % (path, report.get("command", "?"), report.get("device", "?"),
                                             report.get("date", "?")))
    if layer_us > 0:
        return layer_flops / (layer_us * 1e6), "the layer's expert GEMMs, forward and backward", sources, 1.0
    if best_dense > 0:
        grouped = min(1.0, best_grouped / best_dense) if best_grouped > 0 else 1.0
        return best_dense, "the best dense GEMM measured by scmoe-bench gemm", sources, grouped
    sys.exit("make_profile.py: no GEMM rate in the reports (layer: exp_TF/s columns; gemm: dense_tflops)")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("reports", nargs="+", help="scmoe-bench gemm -J and layer -J files")
    p.add_argument("--name", required=True)
    p.add_argument("--base", help="built-in GPU the profile starts from (a30, a800, h100, h200)")
    p.add_argument("--peak-tflops", type=float, help="--base's bf16 peak (default: the built-in value)")
    p.add_argument("--cpu", action="store_true", help="a CPU profile instead of a GPU one")
    p.add_argument("--cores", type=int, default=1)
    p.add_argument("--memcpy-gbps", type=float, help="CPU: memory bandwidth (scmoe-bench a2a prints it)")
    p.add_argument("--memory-gib", type=float, default=16.0)
    p.add_argument("--share", type=float, default=1.0,
                   help="CPU: the share of the measured throughput one emulated device gets, e.g. 0.5 for each of "
                        "4 ranks on 2 cores measured single-threaded (default 1)")
    a = p.parse_args()
    best, what, sources, grouped = measured_gemm_tflops(a.reports)
    if a.cpu == bool(a.base):
        sys.exit("make_profile.py: give --base GPU or --cpu")
    if a.base:
        peaks = {"a30": 165.0, "a800": 312.0, "h100": 989.0, "h200": 989.0}
        peak = a.peak_tflops or peaks.get(a.base)
        if not peak:
            sys.exit("make_profile.py: unknown --base %s" % a.base)
        profile = {"base": a.base, "name": a.name, "description": "%s (measured GEMM efficiency)" % a.name,
                   "gemm_efficiency": best / peak, "grouped_gemm_efficiency": grouped}
    else:
        if not a.memcpy_gbps:
            sys.exit("make_profile.py: --cpu needs --memcpy-gbps")
        best *= a.share
        profile = {"name": a.name, "description": "%s: a CPU as an emulated device" % a.name,
                   "bf16_tflops": best, "fp32_tflops": best, "gemm_efficiency": 1.0,
                   "hbm_gbps": a.memcpy_gbps * a.share, "bandwidth_efficiency": 1.0,
                   "host_link_gbps": a.memcpy_gbps * a.share,
                   "memory_gib": a.memory_gib, "sms": a.cores, "threads_per_sm": 1,
                   "launch_us": 0.0, "kernel_gap_us": 0.0, "host_task_us": 0.0, "sync_us": 0.0,
                   "compute_dtype": "f32"}
    profile["sources"] = ["GEMM rate: %s, times %g: %.4f TFLOP/s" % (what, a.share if a.cpu else 1.0, best)] + sources
    json.dump(profile, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
