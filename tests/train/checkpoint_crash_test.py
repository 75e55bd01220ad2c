#!/usr/bin/env python3
"""A crash at every file-system call of a checkpoint save (issue 26, item 2), with real processes.

crash_shim.so (LD_PRELOAD) kills scmoe-train with SIGKILL at the N-th file-system call of the save
of step 4 (2 in-process ranks; counting starts at the first call on step-00000004.tmp and covers
every call under the checkpoint root from there: the files, their fsyncs and renames, the step
directory's rename or exchange, the root's fsync, `latest`, the deletion of old steps). For every N
from 1 to the number of calls a save makes, then `--resume auto` runs to the end; the case passes
when the resume exits 0 from a step at least the previous checkpoint's and every step's loss, lr and
grad norm from there on, and the final eval loss, equal a straight run's digit for digit, with each
step logged once.

scenarios:
  fresh    the first save of step 4 (step 2 saved before, --keep 1: step 2 is deleted after it)
  resave   step 4 saved again after a rollback to step 2 (steps 2, 4 and 6 saved by an earlier run):
           the old step 4 is exchanged with the new one; before the fix the old directory was
           deleted before the new one was renamed in, and some crashes left `latest` naming a
           missing or half-deleted step

  resave-noexchange  the same on a file system without renameat2(RENAME_EXCHANGE) (NFS; the shim
           makes it fail with EINVAL): the old step 4 moves aside to step-00000004.old first, and a
           crash between the two renames resumes from it
  lock     two trainers on one checkpoint directory (real processes): the second is refused at
           start, naming the holder's host, pid and run id; after the first is killed (SIGKILL), a
           third takes the lock over with a note naming the dead holder and resumes

Prints one line per case and "checkpoint_crash_test: N of N crash points resumed bitwise
(<scenario>): PASS"; exit 0 only when every case passed.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time

SHAPE = ["--ranks", "2", "--steps", "6", "--batch", "4", "--layers", "2", "--hidden", "32", "--heads", "4",
         "--seq", "16", "--ffn", "64", "--experts", "4", "--expert-ffn", "32", "--log-every", "1000000",
         "--eval-data", "default"]
COMPARED = ("loss", "router_loss", "lr", "grad_norm")


def read_metrics(path):
    steps, evals = {}, {}
    if not os.path.exists(path):
        return steps, evals, []
    order = []
    with open(path) as f:
        for line in f:
            j = json.loads(line, parse_float=str)  # compare digits, not parsed floats
            if "eval_loss" in j:
                evals[j["step"]] = j["eval_loss"]
            else:
                order.append(j["step"])
                steps[j["step"]] = tuple(j[k] for k in COMPARED)
    return steps, evals, order


def run(cmd, env=None):
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    return p.returncode, p.stdout + p.stderr


def lock_scenario(a):
    ck = os.path.join(a.work, "ck")
    long_run = [a.train] + SHAPE[:2] + ["--steps", "100000"] + SHAPE[4:] + ["--checkpoint-dir", ck,
                                                                           "--checkpoint-every", "1000000"]
    first = subprocess.Popen(long_run, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    problems = []
    try:
        deadline = time.monotonic() + 60
        holder = ""
        while time.monotonic() < deadline and first.poll() is None:
            if os.path.exists(os.path.join(ck, "lock")):
                holder = open(os.path.join(ck, "lock")).read()
                if f"pid={first.pid} " in holder:
                    break
            time.sleep(0.05)
        m = re.match(r"host=(\S+) pid=(\d+) run=([0-9a-f]+) since=(\S+)", holder)
        if not m or first.poll() is not None:
            sys.exit(f"the first trainer never held the lock (lock file: {holder!r})")
        host, pid, run_id, since = m.groups()
        rc, out = run(long_run + ["--resume", "auto"])
        want = f"the checkpoint directory is locked by host {host}, pid {pid}, run {run_id} (since {since})"
        print(out.strip().splitlines()[-1] if out.strip() else "(no output)")
        if rc != 3 or want not in out:
            problems.append(f"the second trainer: exit {rc}, expected 3 and '{want}'")
        if re.search(r"^step ", out, re.M):
            problems.append("the second trainer trained")
    finally:
        first.kill()
        first.wait()
    rc, out = run([a.train] + SHAPE + ["--checkpoint-dir", ck, "--resume", "auto", "--stop-at", "1"])
    want = f"took over the lock of {ck} left by host {host}, pid {pid}, run {run_id} (since {since}), which ended"
    print(next((l for l in out.splitlines() if "took over" in l), "(no take-over line)"))
    if rc != 0 or want not in out:
        problems.append(f"after SIGKILL of the holder: exit {rc}, expected 0 and '{want}'")
    for p in problems:
        print("FAIL " + p)
    print("checkpoint_crash_test: the second trainer was refused naming the holder, a dead holder's lock taken "
          "over (lock)" + (": FAIL" if problems else ": PASS"))
    return 1 if problems else 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", required=True)
    ap.add_argument("--shim", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--scenario", choices=("fresh", "resave", "resave-noexchange", "lock"), required=True)
    a = ap.parse_args()
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    if a.scenario == "lock":
        return lock_scenario(a)

    straight_metrics = os.path.join(a.work, "straight.jsonl")
    rc, out = run([a.train] + SHAPE + ["--metrics", straight_metrics])
    if rc != 0:
        sys.exit(f"the straight run failed ({rc}):\n{out[-2000:]}")
    straight, straight_eval, _ = read_metrics(straight_metrics)

    def case_dir(n):
        d = os.path.join(a.work, f"case-{n}")
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        return d

    def crash_run(d, n):
        """Runs the save of step 4 under the shim (crash at call n; 0: count); returns (rc, output)."""
        ck = os.path.join(d, "ck")
        metrics = os.path.join(d, "m.jsonl")
        env = dict(os.environ, LD_PRELOAD=a.shim, SCMOE_TEST_CRASH_ROOT=ck, SCMOE_TEST_CRASH_ARM="step-00000004.tmp",
                   SCMOE_TEST_CRASH_NTH=str(n))
        if a.scenario == "resave-noexchange":
            env["SCMOE_TEST_CRASH_NO_EXCHANGE"] = "1"
        if a.scenario == "fresh":
            cmd = [a.train] + SHAPE + ["--metrics", metrics, "--checkpoint-dir", ck, "--checkpoint-every", "2",
                                       "--keep", "1", "--stop-at", "4"]
        else:
            rc, out = run([a.train] + SHAPE + ["--metrics", metrics, "--checkpoint-dir", ck, "--checkpoint-every",
                                               "2", "--keep", "0"])
            if rc != 0:
                raise RuntimeError(f"the run before the rollback failed ({rc}):\n{out[-2000:]}")
            cmd = [a.train] + SHAPE + ["--metrics", metrics, "--checkpoint-dir", ck, "--checkpoint-every", "2",
                                       "--keep", "0", "--stop-at", "4", "--resume", os.path.join(ck, "step-00000002")]
        return run(cmd, env)

    rc, out = crash_run(case_dir(0), 0)
    m = re.search(r"crash_shim: (\d+) counted calls", out)
    if rc != 0 or not m:
        sys.exit(f"the counting run failed ({rc}):\n{out[-3000:]}")
    calls = int(m.group(1))
    print(f"checkpoint_crash_test: {a.scenario}: the save of step 4 makes {calls} counted file-system calls")

    passed = 0
    for n in range(1, calls + 1):
        d = case_dir(n)
        ck = os.path.join(d, "ck")
        metrics = os.path.join(d, "m.jsonl")
        problems = []
        rc, out = crash_run(d, n)
        where = re.search(r"crash_shim: SIGKILL at call \d+, (.*)", out)
        if rc != -9 or not where:
            problems.append(f"the crash run was not killed at call {n} (exit {rc})")
        rc, rout = run([a.train] + SHAPE + ["--metrics", metrics, "--checkpoint-dir", ck, "--resume", "auto",
                                             "--checkpoint-every", "2"])
        resumed_at = re.search(r"# resumed from (\S+) at step (\d+)", rout)
        if rc != 0:
            problems.append(f"--resume auto failed ({rc}): {rout.strip().splitlines()[-1] if rout.strip() else ''}")
        elif not resumed_at:
            problems.append("--resume auto did not resume (started fresh)")
        else:
            step = int(resumed_at.group(2))
            if step < 2:
                problems.append(f"resumed at step {step}: the previous checkpoint (step 2) was lost")
            got, got_eval, order = read_metrics(metrics)
            for s in range(1, 7):
                if order.count(s) != 1:
                    problems.append(f"step {s} logged {order.count(s)} times")
                elif got[s] != straight[s]:
                    problems.append(f"step {s}: {got[s]} != straight {straight[s]}")
            if got_eval.get(6) != straight_eval.get(6):
                problems.append(f"final eval {got_eval.get(6)} != straight {straight_eval.get(6)}")
        call = where.group(1) if where else "?"
        if problems:
            print(f"FAIL call {n}: {call}: " + "; ".join(problems[:4]))
            print(rout[-1500:])
        else:
            passed += 1
            print(f"ok   call {n}: {call}: resumed at step {resumed_at.group(2)}, bitwise")
            shutil.rmtree(d, ignore_errors=True)
    ok = passed == calls and calls > 0
    print(f"checkpoint_crash_test: {passed} of {calls} crash points resumed bitwise ({a.scenario})"
          + (": PASS" if ok else ": FAIL"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
