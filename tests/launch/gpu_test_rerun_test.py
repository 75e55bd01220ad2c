#!/usr/bin/env python3
"""launch/gpu_test_rerun.py (gpu_check.sh's second look at failed GPU tests) on a fake ctest and a fake
compute-sanitizer: each failed test runs again alone with CUDA_LAUNCH_BLOCKING=1 and SCMOE_CUTLASS_TRACE=1,
then under memcheck with the command ctest would run; the outcomes, the first error line and the memcheck
error count land in reruns.json; a rerun that the deadline leaves no room for, and tests past --max, are
recorded as not run.

  gpu_test_rerun_test.py ROOT
"""
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_check_util import check, finish, read_json, run, write  # noqa: E402

FAKE_CTEST = r"""#!/bin/sh
# A fake ctest: --show-only=json-v1 describes the test's command; a plain run fails the test and records
# the environment it saw.
log={log}
show=0
for a in "$@"; do
  [ "$a" = --show-only=json-v1 ] && show=1
  [ "$prev" = -R ] && name=$a
  prev=$a
done
if [ $show = 1 ]; then
  echo '{{"tests": [{{"name": "x", "command": ["/bin/gpu_test", "--gtest_filter=x"]}}]}}'
  exit 0
fi
echo "ctest $name CUDA_LAUNCH_BLOCKING=$CUDA_LAUNCH_BLOCKING SCMOE_CUTLASS_TRACE=$SCMOE_CUTLASS_TRACE" >> "$log"
echo "Test project /build"
echo "gpu_test.cpp:40: Failure: cublas exploded"
exit 8
"""

FAKE_SANITIZER = r"""#!/bin/sh
echo "sanitizer $*" >> {log}
echo "========= Invalid __global__ read of size 4"
echo "========= ERROR SUMMARY: 2 errors"
exit 99
"""


def rerun(root, d, tests_json, deadline_in_s, extra=()):
    raw = os.path.join(d, f"raw{deadline_in_s}")
    os.makedirs(raw)
    r = run([sys.executable, os.path.join(root, "launch", "gpu_test_rerun.py"), "--build", "/build", "--tests-json",
             tests_json, "--raw", raw, "--deadline", str(time.time() + deadline_in_s), "--ctest",
             os.path.join(d, "ctest"), "--sanitizer", os.path.join(d, "compute-sanitizer"), *extra])
    check(r.returncode == 0, f"deadline {deadline_in_s} s: exit 0 (a diagnosis, not a verdict)", r.stderr)
    return read_json(os.path.join(raw, "reruns.json"))["reruns"], raw


def main(root):
    with tempfile.TemporaryDirectory() as d:
        log = os.path.join(d, "calls.log")
        write(os.path.join(d, "ctest"), FAKE_CTEST.format(log=log), executable=True)
        write(os.path.join(d, "compute-sanitizer"), FAKE_SANITIZER.format(log=log), executable=True)
        tests_json = write(os.path.join(d, "tests.json"), json.dumps(
            {"failed": [{"name": "GpuOps.Gemm"}, {"name": "GpuAttention.Big"}, {"name": "GpuLast.One"}]}))

        reruns, raw = rerun(root, d, tests_json, 1000, ["--max", "2"])
        modes = [(x["name"], x["mode"]) for x in reruns]
        check(modes == [("GpuOps.Gemm", "CUDA_LAUNCH_BLOCKING=1"), ("GpuOps.Gemm", "compute-sanitizer memcheck"),
                        ("GpuAttention.Big", "CUDA_LAUNCH_BLOCKING=1"),
                        ("GpuAttention.Big", "compute-sanitizer memcheck"), ("1 more", "-")],
              "each failed test: blocking, then memcheck; past --max 2: one line", json.dumps(reruns))
        blocking = reruns[0]
        check(blocking["outcome"] == "failed" and "cublas exploded" in blocking["first_error"],
              "the blocking rerun's outcome and its first error line", json.dumps(blocking))
        calls = open(log).read()
        check("ctest ^GpuOps\\.Gemm$ CUDA_LAUNCH_BLOCKING=1 SCMOE_CUTLASS_TRACE=1" in calls,
              "the test ran alone (an anchored, escaped regex) with both variables", calls)
        check("sanitizer --tool memcheck --error-exitcode 99 /bin/gpu_test --gtest_filter=x" in calls,
              "memcheck ran the command ctest would run", calls)
        check(reruns[1]["outcome"] == "2 memcheck errors", "memcheck's error count", json.dumps(reruns[1]))
        check(os.path.exists(os.path.join(raw, reruns[1]["log"])), "each rerun keeps its log")

        # 60 s left: room for the blocking reruns (30 s each at least), none for memcheck (120 s).
        reruns, _ = rerun(root, d, tests_json, 60, ["--max", "1"])
        check([x["outcome"] for x in reruns[:2]] == ["failed", "not run: deadline"],
              "with 60 s left: the blocking rerun, memcheck not run", json.dumps(reruns))
        # 20 s left: nothing runs.
        reruns, _ = rerun(root, d, tests_json, 20, ["--max", "1"])
        check(reruns[0]["outcome"] == "not run: deadline", "with 20 s left: nothing reruns", json.dumps(reruns))
    finish("gpu_test_rerun_test")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(os.path.abspath(sys.argv[1]))
