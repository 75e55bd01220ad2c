#!/usr/bin/env python3
"""launch/make_profile.py on hand-made reports: the GEMM rate it takes from each kind of report and
the profile fields that follow. Usage: make_profile_test.py PATH/TO/make_profile.py"""
import json
import os
import subprocess
import sys
import tempfile

SCRIPT = sys.argv[1]


def write(dirname, name, report):
    path = os.path.join(dirname, name)
    with open(path, "w") as f:
        json.dump(report, f)
    return path


def profile(*args):
    out = subprocess.run([sys.executable, SCRIPT] + list(args), capture_output=True, text=True)
    return out.returncode, (json.loads(out.stdout) if out.returncode == 0 else out.stderr)


def check(cond, what):
    if not cond:
        sys.exit("FAIL: " + what)
    print("ok:", what)


with tempfile.TemporaryDirectory() as d:
    gemm = write(d, "gemm.json", {"benchmark": "gemm", "rows": [
        {"provider": "cutlass-grouped", "grouped_tflops": 80.0, "dense_tflops": 100.0},
        {"provider": "loop", "grouped_tflops": 390.0, "dense_tflops": 400.0},
        {"provider": "cutlass-grouped", "grouped_tflops": 300.0, "dense_tflops": 400.0}]})
    # Two rows: 1e9 FLOPs in 10 us (100 TFLOP/s) and 3e9 FLOPs in 10 us (300); together 4e9 in 20 us
    # = 200 TFLOP/s, not the mean of the rates' best (300) nor their plain mean per stage.
    layer = write(d, "layer.json", {"benchmark": "layer", "rows": [
        {"experts_tflops": 100.0, "experts_us": 10.0, "experts_bwd_tflops": 0.0, "experts_bwd_us": 5.0},
        {"experts_tflops": 300.0, "experts_us": 10.0}]})
    other = write(d, "other.json", {"benchmark": "a2a", "rows": []})

    rc, p = profile("--base", "h100", "--name", "g", gemm)
    check(rc == 0 and abs(p["gemm_efficiency"] - 400.0 / 989.0) < 1e-12, "gemm reports: the best dense rate / the base's peak")
    check(abs(p["grouped_gemm_efficiency"] - 300.0 / 400.0) < 1e-12,
          "gemm reports: the first-listed provider's best grouped rate / the best dense (not another provider's)")
    rc, p = profile("--base", "h100", "--name", "l", gemm, layer)
    check(rc == 0 and abs(p["gemm_efficiency"] - 200.0 / 989.0) < 1e-12,
          "a layer report: its expert GEMMs' FLOPs over their time, ahead of the gemm report")
    check("layer's expert GEMMs" in p["sources"][0], "the profile says where its rate comes from")
    check(p["grouped_gemm_efficiency"] == 1.0, "a layer report: its rate is the grouped GEMMs' already (factor 1)")
    rc, p = profile("--cpu", "--name", "c", "--memcpy-gbps", "10", "--share", "0.5", layer)
    check(rc == 0 and abs(p["bf16_tflops"] - 100.0) < 1e-9 and abs(p["hbm_gbps"] - 5.0) < 1e-12
          and p["compute_dtype"] == "f32", "CPU: rate and bandwidth times the share, f32")
    rc, err = profile("--cpu", "--name", "c", "--memcpy-gbps", "10", other)
    check(rc != 0 and "not a scmoe-bench gemm or layer report" in err, "another benchmark's report is refused")
print("make_profile_test: all passed")
