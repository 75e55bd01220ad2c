#!/usr/bin/env python3
"""Stop signals end to end (issue 26, item 3), with real signals and real processes.

Each trial trains a small model and signals it; it passes when the run stopped the way
launch/stop_signals.h says, and `--resume auto` from what it left continues bitwise: every step's
loss, router loss, lr and grad norm, and the final held-out eval loss (which reads the final
weights), equal a straight run's, digit for digit as written in the metrics.

modes:
  step         SIGTERM once the run has logged a random number of steps (2 in-process ranks):
               exit 4, "SIGTERM: finished step M, saved .../step-M", latest = step-M
  save         SIGTERM inside the save of step 8 (tests/train/signal_shim.c sends it at a file
               the save writes): the save completes, the run stops at step 8 with exit 4
  second       two SIGTERMs inside the save of step 8: the process dies by SIGTERM at once, step 8
               is not completed, latest still names step 4, and the resume from step 4 is bitwise
  options      --stop-signals SIGHUP,SIGTERM and SIGHUP: a clean stop naming SIGHUP; --stop-signals
               none and SIGTERM: death by SIGTERM, no line; no --checkpoint-dir: exit 4 and "nothing
               saved (no --checkpoint-dir)"
  mpi-step     under mpirun -np 2: SIGTERM to both rank processes (as Slurm signals each task),
               or, at random, to one of them only (the ranks still agree and both stop)
  mpi-usr1     under mpirun -np 2: SIGUSR1 to mpirun itself, which forwards it to every rank
  mpi-second   under mpirun -np 2, two SIGTERMs inside each rank's save of step 8 (the shim, in both
               processes): mpirun fails, "SIGTERM again" is printed, latest still names step 4, and
               the resume from it under mpirun is bitwise
  mpirun-sh    launch/mpirun.sh -N 2: SIGTERM to the script, which passes SIGUSR1 to mpirun: exit 4
               from the script, and a resume through it continues bitwise
  slurm        launch/slurm.sbatch with a fake srun and scontrol on PATH: SIGUSR1 to the script
               (Slurm's --signal=B:USR1@300): it passes it to the task, which stops and saves (exit
               4); the script calls `scontrol requeue <job>` once; run again (the requeued job), it
               resumes bitwise, completes and requeues nothing

--trials N runs N trials (a random point each, from --seed); it prints one line per trial and a
count: "signal_stop_test: N of N trials passed (mode: what each showed)". A trial whose run ended
before the signal could be sent fails with that message. Exit 0 only when every trial passed.
"""
import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time

SHAPE = ["--batch", "4", "--layers", "2", "--hidden", "32", "--heads", "4", "--seq", "16", "--ffn", "64",
         "--experts", "4", "--expert-ffn", "32", "--log-every", "1000000", "--eval-data", "default"]
COMPARED = ("loss", "router_loss", "lr", "grad_norm")


# What a passing trial showed, per mode (the count line).
PASSES = {"step": "stopped after the step, saved, resumed bitwise",
          "save": "the save completed, the run stopped at that step, resumed bitwise",
          "second": "died at once by the second signal, the previous checkpoint intact and resumed bitwise",
          "options": "a listed SIGHUP stopped cleanly, 'none' left SIGTERM's default, no --checkpoint-dir was said",
          "mpi-step": "every rank stopped after the same step, saved, resumed bitwise",
          "mpi-usr1": "every rank stopped after the same step, saved, resumed bitwise",
          "mpi-second": "every rank died at once by the second signal, the previous checkpoint resumed bitwise",
          "mpirun-sh": "the script passed the stop to every rank, they saved, resumed bitwise",
          "slurm": "the batch script stopped the tasks, requeued once, the requeued job resumed bitwise"}


class TrialFailed(Exception):
    pass


def read_metrics(path):
    """(steps, eval): step -> the compared fields as written; the last eval line's fields."""
    steps, evals = {}, None
    if not os.path.exists(path):
        return steps, evals
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            # The numbers as written (17 significant digits), compared as text: bit for bit.
            record = json.loads(line, parse_float=str, parse_int=str)
            if "step" in record and "loss" in record and "grad_norm" in record:
                steps[int(record["step"])] = tuple(record.get(k) for k in COMPARED)
            elif "eval_loss" in record:
                evals = record["eval_loss"]
    return steps, evals


def count_lines(path):
    try:
        with open(path, "rb") as f:
            return f.read().count(b"\n")
    except FileNotFoundError:
        return 0


class Runner:
    def __init__(self, args):
        self.args = args
        self.mpirun = args.mpirun.split() if args.mpirun else []
        self.straight = {}

    def command(self, mpi, steps, work, metrics, extra):
        cmd = [self.args.train, "--steps", str(steps)] + SHAPE + ["--metrics", metrics] + extra
        if work:
            cmd += ["--checkpoint-dir", os.path.join(work, "ck")]
        if mpi:
            return self.mpirun + cmd
        return cmd[:1] + ["--ranks", "2"] + cmd[1:]

    def run(self, cmd, env=None):
        p = subprocess.run(cmd, capture_output=True, text=True, env=env)
        return p.returncode, p.stdout, p.stderr

    def straight_run(self, mpi, steps):
        key = (mpi, steps)
        if key not in self.straight:
            d = os.path.join(self.args.work, f"straight-{'mpi' if mpi else 'local'}-{steps}")
            shutil.rmtree(d, ignore_errors=True)
            os.makedirs(d)
            rc, out, err = self.run(self.command(mpi, steps, None, os.path.join(d, "m.jsonl"), []))
            if rc != 0:
                raise TrialFailed(f"the straight run failed ({rc}):\n{err[-2000:]}")
            self.straight[key] = read_metrics(os.path.join(d, "m.jsonl"))
        return self.straight[key]

    def resume_and_compare(self, mpi, steps, work, stopped_at, note, cmd=None, env=None):
        """--resume auto from work/ck (or `cmd`, writing work/resumed.jsonl): from step `stopped_at`,
        bitwise the straight run's steps after it."""
        metrics = os.path.join(work, "resumed.jsonl")
        rc, out, err = self.run(cmd or self.command(mpi, steps, work, metrics, ["--resume", "auto"]), env=env)
        if rc != 0:
            raise TrialFailed(f"{note}: the resume failed ({rc}):\n{err[-2000:]}")
        m = re.search(r"resumed from \S+ at step (\d+)", out)
        if not m or int(m.group(1)) != stopped_at:
            raise TrialFailed(f"{note}: expected a resume at step {stopped_at}; the resume said: "
                              f"{m.group(0) if m else '(no resumed line)'}")
        want_steps, want_eval = self.straight_run(mpi, steps)
        got_steps, got_eval = read_metrics(metrics)
        for s in range(stopped_at + 1, steps + 1):
            if got_steps.get(s) != want_steps.get(s):
                raise TrialFailed(f"{note}: step {s} after the resume differs from the straight run:\n"
                                  f"  straight {dict(zip(COMPARED, want_steps.get(s) or ()))}\n"
                                  f"  resumed  {dict(zip(COMPARED, got_steps.get(s) or ()))}")
        if got_eval is None or got_eval != want_eval:
            raise TrialFailed(f"{note}: the final eval loss differs: straight {want_eval}, resumed {got_eval}")
        return f"resumed at step {stopped_at}: steps {stopped_at + 1}..{steps} and the final eval loss bitwise"

    def check_stopped(self, rc, err, work, signame, note, at_least=None, exactly=None):
        """Exit 4 and the line naming the signal and the checkpoint; latest names that step. The step."""
        if rc != 4:
            raise TrialFailed(f"{note}: exit {rc}, expected 4 (stopped by a signal after saving):\n{err[-2000:]}")
        m = re.search(rf"scmoe-train: {signame}: finished step (\d+), saved (\S+), exiting with status 4", err)
        if not m:
            raise TrialFailed(f"{note}: no line 'scmoe-train: {signame}: finished step M, saved DIR, exiting with "
                              f"status 4' on stderr:\n{err[-2000:]}")
        step = int(m.group(1))
        latest = open(os.path.join(work, "ck", "latest")).read().strip()
        if latest != f"step-{step:08d}" or not m.group(2).endswith(latest):
            raise TrialFailed(f"{note}: the run said it saved {m.group(2)} at step {step}; latest is {latest}")
        if at_least is not None and step < at_least:
            raise TrialFailed(f"{note}: stopped at step {step}, before the signal (sent after step {at_least})")
        if exactly is not None and step != exactly:
            raise TrialFailed(f"{note}: stopped at step {step}, expected step {exactly}")
        return step

    def fresh(self, name):
        work = os.path.join(self.args.work, name)
        shutil.rmtree(work, ignore_errors=True)
        os.makedirs(work)
        return work

    # A run signalled once it has logged `after` steps; `send(proc)` sends the signal(s).
    def signal_after(self, mpi, steps, work, after, send):
        metrics = os.path.join(work, "stopped.jsonl")
        cmd = self.command(mpi, steps, work, metrics, ["--checkpoint-every", "50"])
        with open(os.path.join(work, "out.txt"), "w") as out, open(os.path.join(work, "err.txt"), "w") as err:
            proc = subprocess.Popen(cmd, stdout=out, stderr=err)
            while count_lines(metrics) < after and proc.poll() is None:
                time.sleep(0.001)
            if proc.poll() is not None:
                raise TrialFailed(f"the run ended (exit {proc.returncode}) before it logged {after} steps, before "
                                  f"the signal was sent:\n{open(err.name).read()[-2000:]}")
            what = send(proc)
            rc = proc.wait()
        return rc, open(os.path.join(work, "err.txt")).read(), what

    def trial_step(self, rng, index, mpi=False):
        steps = 200
        after = rng.randint(1, steps // 2)
        work = self.fresh(f"{'mpi-step' if mpi else 'step'}-{index}")

        def send(proc):
            if not mpi:
                os.kill(proc.pid, signal.SIGTERM)
                return "SIGTERM to the process"
            ranks = rank_pids(proc.pid)
            if len(ranks) != 2:
                raise TrialFailed(f"expected 2 rank processes under mpirun {proc.pid}, found {ranks}")
            chosen = ranks if rng.random() < 0.5 else [rng.choice(ranks)]
            for pid in chosen:
                os.kill(pid, signal.SIGTERM)
            return "SIGTERM to " + ("both ranks" if len(chosen) == 2 else f"one rank (pid {chosen[0]})")

        rc, err, what = self.signal_after(mpi, steps, work, after, send)
        note = f"trial {index}: {what} after step {after}"
        stopped = self.check_stopped(rc, err, work, "SIGTERM", note, at_least=after)
        return f"{note}: stopped at step {stopped}, exit 4; " + self.resume_and_compare(mpi, steps, work, stopped, note)

    def trial_mpirun_sh(self, rng, index):
        """launch/mpirun.sh -N 2, SIGTERM to the script: it passes SIGUSR1 to mpirun, which forwards it."""
        steps = 1000  # the script polls mpirun once a second: a longer run, so the signal lands before its end
        after = rng.randint(1, 200)
        work = self.fresh(f"mpirun-sh-{index}")
        env = dict(os.environ, SCMOE_TRAIN=self.args.train,
                   SCMOE_MPIRUN_ARGS=" ".join(w for w in self.mpirun[1:] if w.startswith("--")
                                              and w not in ("--np", "-np", "-n")))
        def job(metrics, extra):
            return ([self.args.mpirun_sh, "-N", "2", "--", "--steps", str(steps)] + SHAPE +
                    ["--metrics", metrics, "--checkpoint-dir", os.path.join(work, "ck")] + extra)
        metrics = os.path.join(work, "stopped.jsonl")
        with open(os.path.join(work, "out.txt"), "w") as out, open(os.path.join(work, "err.txt"), "w") as err:
            proc = subprocess.Popen(job(metrics, ["--checkpoint-every", "50"]), stdout=out, stderr=err, env=env)
            while count_lines(metrics) < after and proc.poll() is None:
                time.sleep(0.001)
            if proc.poll() is not None:
                raise TrialFailed(f"the job ended (exit {proc.returncode}) before it logged {after} steps, before "
                                  f"the signal was sent:\n{open(err.name).read()[-2000:]}")
            os.kill(proc.pid, signal.SIGTERM)
            rc = proc.wait()
        err = open(os.path.join(work, "err.txt")).read()
        note = f"trial {index}: SIGTERM to launch/mpirun.sh after step {after}"
        if "mpirun.sh: SIGTERM: asking every rank to finish its step" not in err:
            raise TrialFailed(f"{note}: no line 'mpirun.sh: SIGTERM: asking every rank ...':\n{err[-2000:]}")
        stopped = self.check_stopped(rc, err, work, "SIGUSR1", note, at_least=after)
        line = self.resume_and_compare(True, steps, work, stopped, note,
                                       cmd=job(os.path.join(work, "resumed.jsonl"), ["--resume", "auto"]), env=env)
        return f"{note}: stopped at step {stopped}, exit 4; " + line

    def trial_options(self, rng, index):
        """--stop-signals and --checkpoint-dir: SIGHUP when listed stops cleanly; with 'none' SIGTERM
        kills at once (the default action); without --checkpoint-dir the stop says nothing was saved."""
        steps = 200
        after = rng.randint(1, steps // 2)
        cases = [("SIGHUP listed", ["--stop-signals", "SIGHUP,SIGTERM"], signal.SIGHUP, True),
                 ("--stop-signals none", ["--stop-signals", "none"], signal.SIGTERM, True),
                 ("no --checkpoint-dir", [], signal.SIGTERM, False)]
        done = []
        for what, flags, sig, checkpoints in cases:
            work = self.fresh(f"options-{index}-{len(done)}")
            metrics = os.path.join(work, "stopped.jsonl")
            cmd = self.command(False, steps, work if checkpoints else None, metrics, flags)
            with open(os.path.join(work, "err.txt"), "w") as err:
                proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
                while count_lines(metrics) < after and proc.poll() is None:
                    time.sleep(0.001)
                if proc.poll() is not None:
                    raise TrialFailed(f"{what}: the run ended (exit {proc.returncode}) before it logged {after} steps")
                os.kill(proc.pid, sig)
                rc = proc.wait()
            err = open(os.path.join(work, "err.txt")).read()
            note = f"trial {index}: {what}: {signal.Signals(sig).name} after step {after}"
            if what == "SIGHUP listed":
                stopped = self.check_stopped(rc, err, work, "SIGHUP", note, at_least=after)
                done.append(f"{what}: stopped at step {stopped}, saved, exit 4")
            elif what == "--stop-signals none":
                if rc != -signal.SIGTERM or "scmoe-train: SIGTERM" in err:
                    raise TrialFailed(f"{note}: exit {rc}, expected death by SIGTERM without a line:\n{err[-2000:]}")
                done.append(f"{what}: died by SIGTERM")
            else:
                m = re.search(r"scmoe-train: SIGTERM: finished step (\d+), nothing saved \(no --checkpoint-dir\), "
                              r"exiting with status 4", err)
                if rc != 4 or not m or int(m.group(1)) < after:
                    raise TrialFailed(f"{note}: exit {rc}, expected 4 and 'SIGTERM: finished step M, nothing saved "
                                      f"(no --checkpoint-dir)':\n{err[-2000:]}")
                done.append(f"{what}: stopped at step {m.group(1)}, said nothing was saved, exit 4")
        return f"trial {index}: " + "; ".join(done)

    def trial_mpi_usr1(self, rng, index):
        steps = 200
        after = rng.randint(1, steps // 2)
        work = self.fresh(f"mpi-usr1-{index}")

        def send(proc):
            os.kill(proc.pid, signal.SIGUSR1)
            return "SIGUSR1 to mpirun"

        rc, err, what = self.signal_after(True, steps, work, after, send)
        note = f"trial {index}: {what} after step {after}"
        stopped = self.check_stopped(rc, err, work, "SIGUSR1", note, at_least=after)
        return f"{note}: stopped at step {stopped}, exit 4; " + self.resume_and_compare(True, steps, work, stopped, note)

    def shim_env(self, signals, nth):
        env = dict(os.environ)
        env["LD_PRELOAD"] = self.args.shim
        env["SCMOE_TEST_SIGNAL_PATH"] = "step-00000008"
        env["SCMOE_TEST_SIGNAL_NTH"] = str(nth)
        env["SCMOE_TEST_SIGNAL"] = signals
        return env

    def trial_save(self, rng, index, second, mpi=False):
        steps = 12
        # The save's first, second or third file-system call on step 8's files (under mpirun: each
        # process's own; rank 1 writes fewer files, its first).
        nth = 1 if mpi else rng.randint(1, 3)
        work = self.fresh(f"{'mpi-' if mpi else ''}{'second' if second else 'save'}-{index}")
        cmd = self.command(mpi, steps, work, os.path.join(work, "stopped.jsonl"), ["--checkpoint-every", "4"])
        if mpi:
            names = ["LD_PRELOAD", "SCMOE_TEST_SIGNAL_PATH", "SCMOE_TEST_SIGNAL_NTH", "SCMOE_TEST_SIGNAL"]
            cmd = self.mpirun + [w for n in names for w in ("-x", n)] + cmd[len(self.mpirun):]
        rc, out, err = self.run(cmd, env=self.shim_env("TERM,TERM" if second else "TERM", nth))
        sent = re.search(r"signal_shim: sending \S+ at .*", err)
        if not sent:
            raise TrialFailed(f"trial {index}: the shim never sent its signal (no file-system call on "
                              f"step-00000008 number {nth}):\n{err[-2000:]}")
        note = f"trial {index}: {sent.group(0)[len('signal_shim: '):]}"
        if not second:
            stopped = self.check_stopped(rc, err, work, "SIGTERM", note, exactly=8)
            return f"{note}: stopped at step {stopped}, exit 4; " + self.resume_and_compare(False, steps, work, 8, note)
        if (rc in (0, 4)) if mpi else rc != -signal.SIGTERM:
            raise TrialFailed(f"{note}: exit {rc}, expected death by SIGTERM (the second signal; under mpirun, "
                              f"mpirun's failure status):\n{err[-2000:]}")
        if not re.search(r"scmoe-train: SIGTERM again( on rank \d)?: exiting at once", err):
            raise TrialFailed(f"{note}: no line 'scmoe-train: SIGTERM again: exiting at once' on stderr:\n{err[-2000:]}")
        latest = open(os.path.join(work, "ck", "latest")).read().strip()
        if latest != "step-00000004":
            raise TrialFailed(f"{note}: latest is {latest}, expected the last complete checkpoint step-00000004")
        return (f"{note}: died by SIGTERM mid-save (exit {rc}), latest still step-00000004; " +
                self.resume_and_compare(mpi, steps, work, 4, note))


    def trial_slurm(self, rng, index):
        """launch/slurm.sbatch under a fake srun (runs the task in place) and a fake scontrol (logs its
        arguments): USR1 to the script, as Slurm's --signal=B:USR1@300 sends it before the time limit."""
        steps = 200
        after = rng.randint(1, steps // 2)
        work = self.fresh(f"slurm-{index}")
        bin_dir = os.path.join(work, "bin")
        os.makedirs(bin_dir)
        fakes = {"srun": '#!/bin/sh\n# srun\'s own options, then the task\n'
                         'while [ $# -gt 0 ]; do case $1 in -*) shift ;; *) break ;; esac; done\nexec "$@"\n',
                 "scontrol": '#!/bin/sh\necho "$*" >> "$SCONTROL_LOG"\n'}
        for name, text in fakes.items():
            with open(os.path.join(bin_dir, name), "w") as f:
                f.write(text)
            os.chmod(os.path.join(bin_dir, name), 0o755)
        log = os.path.join(work, "scontrol.log")
        env = dict(os.environ, PATH=bin_dir + os.pathsep + os.environ["PATH"], SLURM_JOB_ID="4242",
                   SLURM_JOB_NAME="signal-test", SLURM_NTASKS_PER_NODE="2", SLURM_JOB_NUM_NODES="1",
                   SLURM_SUBMIT_DIR=os.path.dirname(os.path.dirname(os.path.abspath(self.args.sbatch))),
                   SCMOE_TRAIN=self.args.train, SCMOE_CHECKPOINT_DIR=os.path.join(work, "ck"), SCONTROL_LOG=log)
        # The script's flags first, then these: the last of a repeated flag wins.
        def job(metrics):
            return (["bash", self.args.sbatch, "--preset", "tiny", "--backend", "cpu", "--ranks", "2", "--steps",
                     str(steps)] + SHAPE + ["--checkpoint-every", "50", "--metrics", metrics])
        metrics = os.path.join(work, "stopped.jsonl")
        with open(os.path.join(work, "out.txt"), "w") as out, open(os.path.join(work, "err.txt"), "w") as err:
            proc = subprocess.Popen(job(metrics), stdout=out, stderr=err, env=env)
            while count_lines(metrics) < after and proc.poll() is None:
                time.sleep(0.001)
            if proc.poll() is not None:
                raise TrialFailed(f"the job ended (exit {proc.returncode}) before it logged {after} steps, before "
                                  f"the signal was sent:\n{open(err.name).read()[-2000:]}")
            os.kill(proc.pid, signal.SIGUSR1)
            rc = proc.wait()
        out, err = (open(os.path.join(work, n)).read() for n in ("out.txt", "err.txt"))
        note = f"trial {index}: SIGUSR1 to the batch script after step {after}"
        stopped = self.check_stopped(rc, err, work, "SIGUSR1", note, at_least=after)
        requeues = open(log).read().splitlines() if os.path.exists(log) else []
        if requeues != ["requeue 4242"] or "requeueing job 4242" not in out:
            raise TrialFailed(f"{note}: expected one 'scontrol requeue 4242' and the line saying so; scontrol got "
                              f"{requeues}; the script said:\n{out[-2000:]}")
        env["SLURM_RESTART_COUNT"] = "1"
        line = self.resume_and_compare(False, steps, work, stopped, note,
                                       cmd=job(os.path.join(work, "resumed.jsonl")), env=env)
        requeues = open(log).read().splitlines()
        if requeues != ["requeue 4242"]:
            raise TrialFailed(f"{note}: the requeued job, complete, requeued again: scontrol got {requeues}")
        return f"{note}: stopped at step {stopped}, exit 4, requeued once; the requeued job " + line


def rank_pids(mpirun_pid):
    """The scmoe-train processes under mpirun (its children, or their children through an orted)."""
    children = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            comm = stat[stat.index("(") + 1:stat.rindex(")")]
            ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        except (OSError, ValueError):
            continue
        children.setdefault(ppid, []).append((int(entry), comm))
    found, todo = [], [mpirun_pid]
    while todo:
        for pid, comm in children.get(todo.pop(), []):
            if comm.startswith("scmoe-train"):
                found.append(pid)
            else:
                todo.append(pid)
    return sorted(found)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--train", required=True, help="the scmoe-train binary")
    p.add_argument("--work", required=True, help="a scratch folder (emptied)")
    p.add_argument("--mode", required=True, choices=["step", "save", "second", "options", "mpi-step", "mpi-usr1", "mpi-second", "mpirun-sh",
                                                     "slurm"])
    p.add_argument("--trials", type=int, default=1)
    p.add_argument("--seed", type=int, help="for the random points (default: drawn, and printed)")
    p.add_argument("--shim", help="signal_shim.so (modes save, second)")
    p.add_argument("--mpirun", help="the mpirun command, words separated by spaces (mpi modes)")
    p.add_argument("--sbatch", help="launch/slurm.sbatch (mode slurm)")
    p.add_argument("--mpirun-sh", help="launch/mpirun.sh (mode mpirun-sh; its mpirun flags are taken from --mpirun)")
    args = p.parse_args()
    if args.mode in ("save", "second", "mpi-second") and not args.shim:
        p.error(f"--mode {args.mode} needs --shim")
    if args.mode == "slurm" and not args.sbatch:
        p.error("--mode slurm needs --sbatch")
    if args.mode == "mpirun-sh" and not args.mpirun_sh:
        p.error("--mode mpirun-sh needs --mpirun-sh")
    if args.mode.startswith("mpi") and not args.mpirun:
        p.error(f"--mode {args.mode} needs --mpirun")
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    print(f"signal_stop_test: mode {args.mode}, {args.trials} trial(s), seed {seed} (--seed {seed} repeats them)")
    rng = random.Random(seed)
    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    runner = Runner(args)
    passed = 0
    for i in range(1, args.trials + 1):
        try:
            if args.mode == "step":
                line = runner.trial_step(rng, i)
            elif args.mode == "mpi-step":
                line = runner.trial_step(rng, i, mpi=True)
            elif args.mode == "mpi-usr1":
                line = runner.trial_mpi_usr1(rng, i)
            elif args.mode == "options":
                line = runner.trial_options(rng, i)
            elif args.mode == "mpirun-sh":
                line = runner.trial_mpirun_sh(rng, i)
            elif args.mode == "slurm":
                line = runner.trial_slurm(rng, i)
            elif args.mode == "mpi-second":
                line = runner.trial_save(rng, i, second=True, mpi=True)
            else:
                line = runner.trial_save(rng, i, second=args.mode == "second")
            passed += 1
            print("PASS " + line, flush=True)
        except TrialFailed as e:
            print(f"FAIL {e}", flush=True)
    print(f"signal_stop_test: {passed} of {args.trials} trials passed ({args.mode}: {PASSES[args.mode]})")
    return 0 if passed == args.trials else 1


if __name__ == "__main__":
    sys.exit(main())
