#!/usr/bin/env python3
"""Turns `scmoe-bench gemm -J` reports measured on a device into an emulated-GPU profile for
`--backend emu --gpu PROFILE.json` (docs/emu.md, "Profiles"), as GPEmu turns measured op times into
its profiles.

  GPU:  python3 launch/make_profile.py --base h100 --name h100-ours gemm.json > h100-ours.json
        the base's datasheet numbers, with gemm_efficiency = the best dense TFLOP/s measured / the
        base's bf16 peak.
  CPU:  python3 launch/make_profile.py --cpu --name vm --cores 2 --memcpy-gbps 8.5 --memory-gib 24 gemm.json
        a CPU as an emulated device: its peak = the best dense TFLOP/s measured, one "SM" per core.
"""
import argparse
import json
import sys


def best_dense_tflops(paths):
    best, sources = 0.0, []
    for path in paths:
        with open(path) as f:
            report = json.load(f)
        if report.get("benchmark") != "gemm":
            sys.exit("make_profile.py: %s is not a scmoe-bench gemm report" % path)
        for row in report["rows"]:
            best = max(best, row.get("dense_tflops", 0.0))
        sources.append("%s: %s (%s, %s)" % (path, report.get("command", "?"), report.get("device", "?"),
                                             report.get("date", "?")))
    if best <= 0:
        sys.exit("make_profile.py: no dense_tflops in the reports")
    return best, sources


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("reports", nargs="+", help="scmoe-bench gemm -J files")
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
    best, sources = best_dense_tflops(a.reports)
    if a.cpu == bool(a.base):
        sys.exit("make_profile.py: give --base GPU or --cpu")
    if a.base:
        peaks = {"a30": 165.0, "a800": 312.0, "h100": 989.0, "h200": 989.0}
        peak = a.peak_tflops or peaks.get(a.base)
        if not peak:
            sys.exit("make_profile.py: unknown --base %s" % a.base)
        profile = {"base": a.base, "name": a.name, "description": "%s (measured GEMM efficiency)" % a.name,
                   "gemm_efficiency": best / peak}
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
    profile["sources"] = ["best dense GEMM measured by scmoe-bench gemm, times %g: %.4f TFLOP/s"
                          % (a.share if a.cpu else 1.0, best)] + sources
    json.dump(profile, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
