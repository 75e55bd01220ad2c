"""Helpers of the launch/gpu_check.sh tests: checks, files, the fake nvidia-smi, and JUnit files as
ctest 3.25's --output-junit writes them."""

import json
import os
import stat
import subprocess
import sys

sys.dont_write_bytecode = True  # importing launch/gpu_report.py leaves no __pycache__ in the source tree
failures = []


def paths(root):
    """(gpu_check.sh, gpu_report.py) of the checkout at `root`."""
    root = os.path.abspath(root)
    return os.path.join(root, "launch", "gpu_check.sh"), os.path.join(root, "launch", "gpu_report.py")


def check(cond, what, detail=""):
    print(("ok:   " if cond else "FAIL: ") + what + ("" if cond else f"\n      {detail}"), flush=True)
    if not cond:
        failures.append(what)


def finish(name):
    if failures:
        sys.exit(f"{name}: {len(failures)} check(s) failed: " + "; ".join(failures))
    print(f"{name}: all passed")


def write(path, text, executable=False):
    with open(path, "w") as f:
        f.write(text)
    if executable:
        os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def read_json(path):
    with open(path) as f:
        return json.load(f)


def read_text(path):
    with open(path) as f:
        return f.read()


def fake_smi(d, listing, rc=0):
    """An nvidia-smi whose -L prints `listing` and exits `rc`; its queries describe an H100 SXM."""
    return write(
        os.path.join(d, "nvidia-smi"),
        f"""#!/bin/sh
case "$1" in
  -L) printf '{listing}'; exit {rc} ;;
  --query-gpu=*) echo "0, NVIDIA H100 80GB HBM3, 580.65.06, 9.0, 81559 MiB" ;;
  *) echo "| NVIDIA-SMI 580.65.06    Driver Version: 580.65.06    CUDA Version: 13.0 |" ;;
esac
""",
        executable=True,
    )


H100_LISTING = "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-fake)\\n"


def run(args, env=None, cwd=None):
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run(args, capture_output=True, text=True, env=e, cwd=cwd)


# ---- JUnit files ---------------------------------------------------------------------------------------


def _escape(text):
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def ctest_case(name, status, body, skipped=False):
    """A test case as ctest 3.25's --output-junit writes it: a GTEST_SKIP is status="notrun" with a
    <skipped> element, and the output is gtest's."""
    out = f"Running main() from gtest_main.cc\nNote: Google Test filter = {name}\n[ RUN      ] {name}\n{body}"
    sk = '\n\t\t<skipped message="SKIP_REGULAR_EXPRESSION_MATCHED"/>' if skipped else ""
    return (
        f'\t<testcase name="{name}" classname="{name}" time="0.01" status="{status}">{sk}\n'
        f"\t\t<system-out>{_escape(out)}</system-out>\n\t</testcase>\n"
    )


def junit(*cases):
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n<testsuite name="(empty)" tests="%d" failures="0" disabled="0" '
        'skipped="0" hostname="" time="0" timestamp="2026-01-01T00:00:00">\n%s</testsuite>\n'
        % (len(cases), "".join(cases))
    )


def passed(name):
    return ctest_case(name, "run", f"[       OK ] {name} (1 ms)\n")


def skipped_no_cuda(name):
    """The skip of a GPU test on a machine where CUDA has no device: a failure of the check."""
    body = f"gpu_test.cpp:10: Skipped\nno CUDA device: GPU test skipped (no device)\n[  SKIPPED ] {name} (0 ms)\n"
    return ctest_case(name, "notrun", body, skipped=True)


def skipped_expected(name):
    """The skip of a test that covers machines without a GPU (GpuDevice.MakeCudaWithoutDeviceThrows)."""
    body = (
        "gpu_device_test.cpp:21: Skipped\na CUDA device is present: the no-device error path cannot be hit\n"
        f"[  SKIPPED ] {name} (0 ms)\n"
    )
    return ctest_case(name, "notrun", body, skipped=True)


def failed(name):
    return ctest_case(name, "fail", f"gpu_test.cpp:40: Failure\nExpected equality\n[  FAILED  ] {name} (3 ms)\n")
