#!/usr/bin/env python3
"""The dense bf16 peak of one GPU, for the MFU of launch/gpu_check.sh: --peak-tflops X, else the
built-in spec of the GPU's model (scmoe/kernels/emu/gpu_spec.cpp: a30, a800 for A100/A800, h100 for the
H100 SXM, h200 for the H200 SXM and GH200), read back through `scmoe-bench gemm --backend emu --gpu
<spec>` (its device line is emu::describe() of the spec), so the figure is the one the spec cites and
nothing is copied here.

  python3 launch/gpu_peak.py --gpu-name NAME --bench SCMOE_BENCH [--json OUT] [--peak-tflops X]
      (launch/gpu_check.sh: gpu_report.py spec)

Prints the peak in TFLOP/s on stdout and its source on stderr; exit 1, and why on stderr, without one
(a GPU with no built-in spec, or an H100/H200 PCIe or NVL, whose peak is not the SXM part's).
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile


def spec_name_for(gpu_name):
    """The built-in spec (scmoe/kernels/emu/gpu_spec.cpp) of a GPU that nvidia-smi names, or (None, why)."""
    n = gpu_name.lower()
    for model in ("h100", "h200"):  # GH200 included: its GPU is the SXM part's
        if model in n:
            if re.search(r"pcie|nvl", n):
                return (
                    None,
                    f"{gpu_name}: the built-in {model} spec is the SXM part, whose peak this card does not have",
                )
            return model, ""
    if re.search(r"a800|a100", n):  # the A800 is the A100 with a slower NVLink: the same peaks
        return "a800", ""
    if re.search(r"\ba30\b", n):
        return "a30", ""
    return None, f"no built-in spec for '{gpu_name}' (built in: a30, a100/a800, h100 SXM, h200 SXM)"


def parse_emu_device(device):
    """The fields of emu::describe() in an emulated scmoe-bench report's device string:
    "emu: NVIDIA H100 SXM5 80GB: 132 SMs, 989 TFLOP/s bf16, 3350 GB/s, 80.0 GiB (...)"."""
    m = re.match(r"emu: (.*): (\d+) SMs, ([0-9.eE+]+) TFLOP/s bf16, ([0-9.eE+]+) GB/s", device)
    if not m:
        return None
    return {
        "description": m.group(1),
        "sms": int(m.group(2)),
        "bf16_tflops": float(m.group(3)),
        "hbm_gbps": float(m.group(4)),
    }


def cmd_spec(a):
    """`gpu_report.py spec ...` (and this file run as a script)."""
    info = {"gpu_name": a.gpu_name}
    # The built-in spec the emulator's predictions use (launch/gpu_check.sh's emu steps), also when
    # --peak-tflops gives the peak.
    info["emu_spec"], _ = spec_name_for(a.gpu_name)
    if a.peak_tflops:
        info.update(peak_tflops=a.peak_tflops, source="--peak-tflops")
    else:
        spec, why = spec_name_for(a.gpu_name)
        if spec:
            with tempfile.TemporaryDirectory() as d:
                path = os.path.join(d, "spec.json")
                run = subprocess.run(
                    [
                        a.bench,
                        "gemm",
                        "--backend",
                        "emu",
                        "--gpu",
                        spec,
                        "--tokens",
                        "8",
                        "--hidden",
                        "8",
                        "--ffn",
                        "8",
                        "--experts",
                        "2",
                        "-n",
                        "1",
                        "-w",
                        "0",
                        "-c",
                        "0",
                        "-J",
                        path,
                    ],
                    capture_output=True,
                    text=True,
                )
                parsed = None
                if run.returncode == 0 and os.path.exists(path):
                    with open(path) as f:
                        parsed = parse_emu_device(json.load(f).get("device", ""))
            if parsed:
                info.update(
                    spec=spec,
                    peak_tflops=parsed["bf16_tflops"],
                    spec_description=parsed["description"],
                    source=f"built-in spec '{spec}' ({parsed['description']}, scmoe/kernels/emu/gpu_spec.cpp)",
                )
            else:
                why = f"could not read the built-in spec '{spec}' from {a.bench} (exit {run.returncode})"
        if "peak_tflops" not in info:
            info["why_not"] = why
    if a.json:
        with open(a.json, "w") as f:
            json.dump(info, f, indent=1)
    if "peak_tflops" not in info:
        print(info["why_not"], file=sys.stderr)
        return 1
    print(info["source"], file=sys.stderr)
    print(f"{info['peak_tflops']:g}")
    return 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu-name", required=True)
    ap.add_argument("--bench", required=True)
    ap.add_argument("--json")
    ap.add_argument("--peak-tflops", type=float)
    sys.exit(cmd_spec(ap.parse_args()))
