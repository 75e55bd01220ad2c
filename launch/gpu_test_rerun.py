#!/usr/bin/env python3
"""The GPU tests that failed, run again one at a time so their failure can be read (launch/gpu_check.sh
calls it after ctest): first with CUDA_LAUNCH_BLOCKING=1 (every kernel launch synchronous, so the
error surfaces at the call that caused it) and SCMOE_CUTLASS_TRACE=1 (the CUTLASS providers print each
call's problem and status), then, while time allows, under compute-sanitizer's memcheck.

  python3 launch/gpu_test_rerun.py --build DIR --tests-json TESTS_JSON --raw DIR [--deadline EPOCH_S]
                                   [--max N] [--ctest CTEST] [--sanitizer compute-sanitizer]

TESTS_JSON is launch/gpu_test_skips.py's summary; the outcome of every rerun goes to RAW/reruns.json
and its output to RAW/rerun_<n>_<mode>.log. A rerun starts only while 30 s (blocking) or 120 s
(memcheck) remain before --deadline. Exit status 0 (the reruns are a diagnosis, not a verdict).
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time

ERROR_LINE = re.compile(r"error|failure|failed|invalid|illegal|out of bounds|cuda", re.I)


def first_error(text):
    for line in text.splitlines():
        if ERROR_LINE.search(line) and not line.startswith(("Test project", "      Start", "The following")):
            return line.strip()[:300]
    return ""


def run(cmd, env, timeout, log):
    start = time.time()
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        rc, text = p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired as e:
        rc = 124
        text = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        text += f"\n(timed out after {timeout:.0f} s)\n"
    with open(log, "w") as f:
        f.write("+ " + " ".join(cmd) + "\n" + text)
    return rc, text, round(time.time() - start, 1)


def test_command(ctest, build, name):
    """The command ctest runs for test `name` (ctest --show-only=json-v1)."""
    p = subprocess.run([ctest, "--test-dir", build, "--show-only=json-v1", "-R", f"^{re.escape(name)}$"],
                       capture_output=True, text=True)
    try:
        tests = json.loads(p.stdout).get("tests", [])
    except ValueError:
        return None
    return tests[0].get("command") if tests else None


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", required=True)
    ap.add_argument("--tests-json", required=True)
    ap.add_argument("--raw", required=True)
    ap.add_argument("--deadline", type=float, default=0, help="epoch seconds; 0: none")
    ap.add_argument("--max", type=int, default=6, help="at most this many failed tests are rerun (default 6)")
    ap.add_argument("--ctest", default="ctest")
    ap.add_argument("--sanitizer", default="compute-sanitizer")
    a = ap.parse_args(argv)
    try:
        with open(a.tests_json) as f:
            failed = [c["name"] for c in json.load(f).get("failed", [])]
    except (OSError, ValueError):
        failed = []

    def left():
        return a.deadline - time.time() if a.deadline else float("inf")

    reruns = []
    env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1", SCMOE_CUTLASS_TRACE="1")
    sanitizer = shutil.which(a.sanitizer)
    for i, name in enumerate(failed[: a.max]):
        if left() < 30:
            reruns.append({"name": name, "mode": "blocking", "outcome": "not run: deadline"})
            continue
        log = os.path.join(a.raw, f"rerun_{i}_blocking.log")
        rc, text, secs = run([a.ctest, "--test-dir", a.build, "-R", f"^{re.escape(name)}$", "--output-on-failure"],
                             env, min(180, left() - 10), log)
        reruns.append({"name": name, "mode": "CUDA_LAUNCH_BLOCKING=1", "outcome": "passed" if rc == 0 else "failed",
                       "rc": rc, "seconds": secs, "first_error": first_error(text), "log": os.path.basename(log)})
        print(f"rerun {name} (CUDA_LAUNCH_BLOCKING=1): {reruns[-1]['outcome']} {reruns[-1]['first_error']}")
        if not sanitizer:
            continue
        cmd = test_command(a.ctest, a.build, name)
        if not cmd or left() < 120:
            reruns.append({"name": name, "mode": "memcheck",
                           "outcome": "not run: " + ("no command from ctest" if not cmd else "deadline")})
            continue
        log = os.path.join(a.raw, f"rerun_{i}_memcheck.log")
        rc, text, secs = run([sanitizer, "--tool", "memcheck", "--error-exitcode", "99"] + cmd, env,
                             min(300, left() - 60), log)
        m = re.search(r"ERROR SUMMARY: (\d+) error", text)
        reruns.append({"name": name, "mode": "compute-sanitizer memcheck",
                       "outcome": (f"{m.group(1)} memcheck errors" if m else f"exit status {rc}"),
                       "rc": rc, "seconds": secs, "first_error": first_error(text), "log": os.path.basename(log)})
        print(f"rerun {name} (memcheck): {reruns[-1]['outcome']}")
    if len(failed) > a.max:
        reruns.append({"name": f"{len(failed) - a.max} more", "mode": "-", "outcome": f"not run (--max {a.max})"})
    with open(os.path.join(a.raw, "reruns.json"), "w") as f:
        json.dump({"reruns": reruns}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
