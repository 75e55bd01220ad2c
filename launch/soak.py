#!/usr/bin/env python3
"""Soak test of scmoe-train: does a long run hold its resident memory, threads and open files flat?

Starts scmoe-train (in-process ranks, or under `mpirun -np N`) with --metrics to a file, polls that
file every 50 ms for the newest step, and every --every steps samples each rank process from /proc:
VmRSS and Threads (/proc/PID/status) and the number of /proc/PID/fd entries. Under mpirun the rank
processes are the scmoe-train descendants of mpirun, told apart by OMPI_COMM_WORLD_RANK in their
environment. A sample is taken when the metrics file first shows a step >= the sample's step, so it
is aligned to the step to within one step.

Writes the samples (JSON lines, --samples; default soak-samples.jsonl), prints one line per sample
and a summary: RSS at steps 500, 1000, 2000 and the last (the nearest samples) per process, threads
and fds min/max after warm-up, and the RSS growth from the warm-up sample (--warmup, step 500) to
the last sample. Exit status: 0 pass; 1 the RSS grew by >= --max-growth % or the threads or fds
changed after warm-up (they must be exactly constant); 2 bad command line; 3 scmoe-train failed or
no sample was taken.

  launch/soak.py --train build/launch/scmoe-train --steps 5000 --ranks 4
  launch/soak.py --train build/launch/scmoe-train --steps 5000 --mpi 2 -- --batch 4
"""
import argparse
import json
import os
import shlex
import subprocess
import sys
import time

POLL_S = 0.05
REPORT_STEPS = (500, 1000, 2000)


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="soak.py",
        description="Run scmoe-train for many steps and check that resident memory, threads and open files "
        "stay flat after warm-up (scmoe-train's own flags go after --).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n"
        "  launch/soak.py --train build/launch/scmoe-train --steps 5000 --ranks 4\n"
        "  launch/soak.py --train build/launch/scmoe-train --steps 5000 --mpi 2 -- --batch 4\n"
        "exit status: 0 pass, 1 RSS grew >= --max-growth %% or threads/fds changed after warm-up, "
        "2 bad command line, 3 scmoe-train failed or no sample",
    )
    p.add_argument("--train", default="build/launch/scmoe-train", help="the scmoe-train executable (%(default)s)")
    p.add_argument("--steps", type=int, default=5000, help="training steps (%(default)s)")
    p.add_argument("--every", type=int, default=100, help="sample every N steps (%(default)s)")
    p.add_argument("--warmup", type=int, default=500,
                   help="the step whose sample is the baseline; threads and fds must not change after it (%(default)s)")
    p.add_argument("--max-growth", type=float, default=2.0,
                   help="fail when the RSS grows by this %% or more from warm-up to the last sample (%(default)s)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--ranks", type=int, default=4, help="in-process ranks (%(default)s)")
    where.add_argument("--mpi", type=int, metavar="NP", help="run under mpirun -np NP instead of in-process ranks")
    p.add_argument("--mpirun", default="mpirun --oversubscribe --bind-to none" +
                   (" --allow-run-as-root" if os.geteuid() == 0 else ""),
                   help="the mpirun command before -np (%(default)s)")
    p.add_argument("--out", default=".", help="folder for the metrics and sample files (%(default)s)")
    p.add_argument("--samples", default="soak-samples.jsonl", help="sample file name in --out (%(default)s)")
    p.add_argument("--metrics", help="scmoe-train's --metrics file (default: soak-metrics.jsonl in --out)")
    p.add_argument("--log", default="soak-train.log", help="scmoe-train's output, in --out (%(default)s)")
    p.add_argument("train_args", nargs="*", help="after --: passed to scmoe-train")
    a = p.parse_args(argv)
    if a.steps <= 0 or a.every <= 0 or a.warmup < 0:
        p.error("--steps and --every must be > 0, --warmup >= 0")
    if a.warmup >= a.steps:
        p.error("--warmup must be before the last step")
    if a.mpi is not None and a.mpi <= 0:
        p.error("--mpi must be > 0")
    return a


def read_status(pid):
    """(rss_kib, threads) from /proc/PID/status, or None if the process is gone."""
    rss = threads = None
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1])
                elif line.startswith("Threads:"):
                    threads = int(line.split()[1])
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    if rss is None or threads is None:
        return None
    return rss, threads, fds


def children_map():
    """{ppid: [pid, ...]} for every process."""
    kids = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # The command name is in parentheses and may hold spaces: the ppid is the 2nd field after it.
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        kids.setdefault(ppid, []).append(int(name))
    return kids


def descendants(root):
    kids, out, todo = children_map(), [], [root]
    while todo:
        pid = todo.pop()
        for child in kids.get(pid, []):
            out.append(child)
            todo.append(child)
    return out


def rank_of(pid):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read().split(b"\0")
    except OSError:
        return None
    for item in env:
        if item.startswith(b"OMPI_COMM_WORLD_RANK="):
            return int(item.split(b"=", 1)[1])
    return None


def rank_processes(proc, args, exe):
    """{label: pid} of the processes to sample: 'proc' in-process, 'rank<r>' under mpirun."""
    if args.mpi is None:
        return {"proc": proc.pid}
    found = {}
    for pid in descendants(proc.pid):
        try:
            if os.path.realpath(f"/proc/{pid}/exe") != exe:
                continue
        except OSError:
            continue
        r = rank_of(pid)
        if r is not None:
            found[f"rank{r}"] = pid
    return found


def last_step(path, state):
    """The largest training step in the metrics file so far (reads only what is new)."""
    try:
        with open(path, "rb") as f:
            f.seek(state["offset"])
            data = f.read()
    except FileNotFoundError:
        return state["step"]
    end = data.rfind(b"\n")
    if end < 0:
        return state["step"]
    state["offset"] += end + 1
    for line in data[: end + 1].splitlines():
        try:
            j = json.loads(line)
        except ValueError:
            continue
        if "step" in j and "loss" in j:  # eval lines have no "loss"
            state["step"] = max(state["step"], int(j["step"]))
    return state["step"]


def nearest(samples, step):
    return min(samples, key=lambda s: (abs(s["step"] - step), s["step"]))


def summarize(samples, args, labels):
    """Prints the summary; returns the failure reasons (empty: pass)."""
    failures = []
    last = max(s["step"] for s in samples)
    print(f"# summary: {len(samples)} samples, steps {min(s['step'] for s in samples)}..{last}, "
          f"warm-up to step {args.warmup}, max growth {args.max_growth}%")
    want = [s for s in REPORT_STEPS if s < last] + [last]
    print("# process  " + "  ".join(f"rss@{s:<6}" for s in want) + "  threads(min..max)  fds(min..max)  growth")
    for label in labels:
        mine = [s for s in samples if s["process"] == label]
        if not mine:
            failures.append(f"{label}: no sample")
            continue
        base_candidates = [s for s in mine if s["step"] >= args.warmup]
        if not base_candidates:
            failures.append(f"{label}: no sample at or after warm-up step {args.warmup}")
            continue
        base = min(base_candidates, key=lambda s: s["step"])
        after = [s for s in mine if s["step"] >= base["step"]]
        end = max(mine, key=lambda s: s["step"])
        growth = 100.0 * (end["rss_kib"] - base["rss_kib"]) / base["rss_kib"]
        threads = (min(s["threads"] for s in after), max(s["threads"] for s in after))
        fds = (min(s["fds"] for s in after), max(s["fds"] for s in after))
        rss = "  ".join(f"{nearest(mine, s)['rss_kib'] / 1024:7.1f}M" + " " * 2 for s in want)
        print(f"  {label:<8} {rss}  {threads[0]:>3}..{threads[1]:<3}           {fds[0]:>3}..{fds[1]:<3}      "
              f"{growth:+.2f}% (step {base['step']} {base['rss_kib']} KiB -> step {end['step']} {end['rss_kib']} KiB)")
        if growth >= args.max_growth:
            failures.append(f"{label}: RSS grew {growth:.2f}% >= {args.max_growth}% after warm-up")
        if threads[0] != threads[1]:
            failures.append(f"{label}: threads changed after warm-up ({threads[0]}..{threads[1]}; must be constant)")
        if fds[0] != fds[1]:
            failures.append(f"{label}: open fds changed after warm-up ({fds[0]}..{fds[1]}; must be constant)")
    return failures


def main(argv):
    args = parse_args(argv)
    exe = os.path.realpath(args.train)
    if not os.access(exe, os.X_OK):
        print(f"soak.py: --train {args.train}: not an executable", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    metrics = args.metrics or os.path.join(args.out, "soak-metrics.jsonl")
    samples_path = os.path.join(args.out, args.samples)
    log_path = os.path.join(args.out, args.log)
    if os.path.exists(metrics):
        os.remove(metrics)
    train = [exe, "--steps", str(args.steps), "--metrics", metrics] + args.train_args
    if args.mpi is None:
        cmd = train[:1] + ["--ranks", str(args.ranks)] + train[1:]
    else:
        cmd = shlex.split(args.mpirun) + ["-np", str(args.mpi)] + train
    print("# " + " ".join(shlex.quote(c) for c in cmd), flush=True)
    env = dict(os.environ)
    env.setdefault("SCMOE_COMM_TIMEOUT_S", "600")
    started = time.monotonic()
    samples, labels = [], []
    with open(log_path, "w") as log, open(samples_path, "w") as out:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        state = {"offset": 0, "step": 0}
        # Sample at every --every steps and near the end. Steps are numbered from 1. Once the metrics show
        # step steps - 1, rank 0 may have begun the last step, and after that step's last collective the
        # other ranks tear down (threads end, files close) while rank 0 still writes its line. So the last
        # sample is taken at step steps - 2, and a sample is kept only when the metrics still show at most
        # step steps - 2 after /proc was read: then no rank can have finished the last step.
        end_step = max(1, args.steps - 2)
        targets = sorted({min(t, end_step) for t in list(range(args.every, args.steps + 1, args.every)) +
                          [args.steps]})
        targets = [t for t in targets if t > 0]
        next_index = 0
        try:
            while True:
                done = proc.poll() is not None
                step = last_step(metrics, state)
                if next_index < len(targets) and targets[next_index] <= step <= end_step and not done:
                    pids = rank_processes(proc, args, exe)
                    expected = 1 if args.mpi is None else args.mpi
                    if len(pids) < expected:
                        print(f"# step {step}: found {len(pids)} of {expected} rank processes", flush=True)
                    read = [(label, pid, read_status(pid)) for label, pid in sorted(pids.items())]
                    if last_step(metrics, state) > end_step:
                        # The run reached its last step while /proc was read: the numbers may show teardown.
                        print(f"# step {step}: sample dropped, the run reached its last step meanwhile", flush=True)
                        next_index = len(targets)
                        continue
                    parts = []
                    for label, pid, got in read:
                        if got is None:
                            continue
                        s = {"step": step, "process": label, "pid": pid, "rss_kib": got[0], "threads": got[1],
                             "fds": got[2], "elapsed_s": round(time.monotonic() - started, 1)}
                        samples.append(s)
                        if label not in labels:
                            labels.append(label)
                        out.write(json.dumps(s) + "\n")
                        parts.append(f"{label} rss {got[0] / 1024:.1f} MiB threads {got[1]} fds {got[2]}")
                    out.flush()
                    print(f"step {step:>6}/{args.steps}  {time.monotonic() - started:7.1f} s  " + "; ".join(parts),
                          flush=True)
                    while next_index < len(targets) and targets[next_index] <= step:
                        next_index += 1
                if done:
                    break
                time.sleep(POLL_S)
        except KeyboardInterrupt:
            proc.terminate()
            proc.wait()
            raise
    rc = proc.returncode
    print(f"# scmoe-train exited {rc} after {time.monotonic() - started:.1f} s (output: {log_path}; "
          f"samples: {samples_path})")
    if rc != 0:
        with open(log_path) as f:
            tail = f.readlines()[-20:]
        sys.stdout.write("".join(tail))
        print("soak: FAIL (scmoe-train failed)")
        return 3
    if not samples:
        print("soak: FAIL (no sample taken: the run was shorter than --every?)")
        return 3
    failures = summarize(samples, args, labels)
    for f in failures:
        print("# " + f)
    print("soak: " + ("PASS" if not failures else "FAIL") + f" ({len(labels)} process(es), {len(samples)} samples; "
          f"threads and fds must be exactly constant after warm-up, RSS growth < {args.max_growth}%)")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
