#!/usr/bin/env python3
"""scmoe-train across namespace hosts (tests/hosts/netns_cluster.py), launched by launch/mpirun.sh over
Open MPI's TCP, and three faults injected mid-run on host 1 (issue 15):

  cut   host 1's link goes down (packets vanish, no reset): a partitioned host
  kill  one rank on host 1 gets SIGKILL: a dead peer
  stop  one rank on host 1 gets SIGSTOP: a hung peer, not a dead one

Steps: (1) single-host reference (plain mpirun, same world, no namespaces); (2) the multi-host run
uninterrupted, its losses equal to (1) to the last bit (the JSON numbers compared as written);
(3) per fault: run with checkpoints, inject once the metrics show step >= --inject-at and a
checkpoint exists, measure from the injection until every surviving rank process has exited and
until mpirun returns, read the ranks' `scmoe-train: rank R:` messages, check the last checkpoint,
clean up, run again with --resume auto to the end and compare the resumed steps' losses with (2).

Bounds asserted (seconds after the injection):
  every surviving rank exited   <= SCMOE_COMM_TIMEOUT_S + margin
  mpirun (launch/mpirun.sh) returned, non-zero   <= SCMOE_COMM_TIMEOUT_S + SCMOE_ABORT_GRACE_S + margin
The margin (default 15 s) covers: a rank may start its timed wait up to one step (+ a checkpoint)
after the injection (~0.1-1 s here), MPI_Abort's path rank -> orted -> mpirun -> orteds -> kill
(~1-2 s), and a 2-core machine shared with builds (several seconds of scheduling slack).
Also asserted: some message names the operation (all_to_all_v, all_reduce_sum, ...) and a peer rank
across the fault (for kill/stop the faulty rank, for cut a rank on the other host); the last complete
checkpoint passes tests/train/check_checkpoint.py (or, without safetensors, its own structure check);
the resumed losses equal the uninterrupted run's bitwise.

usage: host_faults_test.py --train BUILD/launch/scmoe-train [--table FILE] [--faults cut,kill,stop]
exit: 0 all passed, 1 a check failed, 77 skipped (not root, no `ip netns`, no mpirun).
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import netns_cluster  # noqa: E402

SKIP = 77
OPS = r"(all_to_all_v_known|all_to_all_v|all_reduce_sum|all_gather|broadcast|barrier)"
MESSAGE = re.compile(r"scmoe-train: rank (\d+): (.*)")
LOSS = re.compile(r'"step":(\d+),.*?"loss":([^,}]+)')
_children = []  # process groups we started: killed at exit whatever happens


def log(text):
    print(text, flush=True)


def kill_group(proc):
    if proc.poll() is not None:
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=5)
            return
        except subprocess.TimeoutExpired:
            pass


def kill_children():
    for proc in _children:
        kill_group(proc)


def losses(path):
    """{step: loss as written} from a --metrics file."""
    out = {}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                m = LOSS.search(line)
                if m:
                    out[int(m.group(1))] = m.group(2)
    return out


def last_step(path):
    steps = losses(path)
    return max(steps) if steps else 0


def latest_checkpoint(root):
    try:
        with open(os.path.join(root, "latest")) as f:
            return f.read().strip()
    except OSError:
        return None


def rank_processes(inodes, exe):
    """{world rank: pid} of the processes running `exe` in the namespaces `inodes`."""
    ranks = {}
    for pid in netns_cluster.pids_in_netns(inodes):
        try:
            if os.path.realpath(f"/proc/{pid}/exe") != os.path.realpath(exe):
                continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
            ranks[int(env[b"OMPI_COMM_WORLD_RANK"])] = pid
        except (OSError, KeyError, ValueError):
            pass
    return ranks


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def messages(text):
    """[(rank, message)] of the `scmoe-train: rank R:` lines, first per rank, in output order."""
    seen, out = set(), []
    for line in text.splitlines():
        m = MESSAGE.search(line)
        if m and int(m.group(1)) not in seen:
            seen.add(int(m.group(1)))
            out.append((int(m.group(1)), m.group(2).strip()))
    return out


def check_checkpoint(root, python):
    """(ok, description) of the checkpoint `latest` names: the directory, its state's step, every
    file of the index present, and tests/train/check_checkpoint.py where safetensors is installed."""
    name = latest_checkpoint(root)
    if not name:
        return False, "no latest"
    step_dir = os.path.join(root, name)
    try:
        with open(os.path.join(step_dir, "trainer_state.json")) as f:
            state = json.load(f)
        with open(os.path.join(step_dir, "model.safetensors.index.json")) as f:
            index = json.load(f)
    except (OSError, ValueError) as e:
        return False, f"{name}: {e}"
    if f"step-{state['step']:08d}" != name:
        return False, f"{name}: trainer_state step {state['step']}"
    for file in set(index["weight_map"].values()):
        if not os.path.isfile(os.path.join(step_dir, file)):
            return False, f"{name}: {file} missing"
    checker = os.path.join(ROOT, "tests", "train", "check_checkpoint.py")
    r = subprocess.run([python, checker, root], capture_output=True, text=True, timeout=120)
    if r.returncode == 0:
        return True, f"{name} intact (check_checkpoint.py)"
    if r.returncode == SKIP:
        return True, f"{name} intact (structure; check_checkpoint.py skipped: {r.stdout.strip()})"
    return False, f"{name}: check_checkpoint.py failed: {(r.stdout + r.stderr).strip()[-400:]}"


class Scenario:
    def __init__(self, args, cluster, work):
        self.args = args
        self.cluster = cluster
        self.work = work
        self.world = args.hosts * args.ranks_per_host
        self.model = ["--batch", "4", "--layers", "2", "--hidden", "32", "--heads", "4", "--seq", "16", "--ffn", "64",
                      "--experts", "4", "--expert-ffn", "32", "--ep", str(args.ep), "--steps", str(args.steps),
                      "--log-every", "1"]
        self.env = dict(os.environ)
        self.env.update({
            "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
            "SCMOE_COMM_TIMEOUT_S": str(args.timeout_s), "SCMOE_ABORT_GRACE_S": str(int(args.grace_s)),
            "SCMOE_MPIRUN_TIMEOUT_S": str(int(args.job_limit_s)), "SCMOE_TRAIN": args.train,
            "SCMOE_CPU_BLAS_THREADS": "1",
        })

    # --- running a job ---------------------------------------------------------------------------
    def start(self, cmd, log_path, env=None):
        out = open(log_path, "w")
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env or self.env,
                                start_new_session=True, cwd=self.work)
        out.close()
        _children.append(proc)
        return proc

    def finish(self, proc, limit_s):
        """Waits up to limit_s; returns (rc, seconds, hung). A hung job is killed (group, then
        whatever is left in the namespaces)."""
        t0 = time.monotonic()
        try:
            rc = proc.wait(timeout=limit_s)
            return rc, time.monotonic() - t0, False
        except subprocess.TimeoutExpired:
            kill_group(proc)
            self.kill_namespace_processes()
            return proc.returncode, time.monotonic() - t0, True

    def kill_namespace_processes(self):
        pids = self.cluster.processes()
        left = netns_cluster.kill_pids(pids)
        return pids, left

    def multi_host_cmd(self, extra):
        return ["bash", os.path.join(ROOT, "launch", "mpirun.sh"), "-H", self.cluster.hostfile, "-N",
                str(self.args.ranks_per_host), "--"] + self.model + extra

    def multi_host_env(self):
        env = dict(self.env)
        env["SCMOE_MPIRUN_ARGS"] = " ".join(self.cluster.mpirun_args())
        return env

    def run_clean(self, name, cmd, env=None):
        """A job that must succeed; returns its log text."""
        log_path = os.path.join(self.work, name + ".log")
        t0 = time.monotonic()
        proc = self.start(cmd, log_path, env)
        rc, _, hung = self.finish(proc, self.args.job_limit_s + 30)  # mpirun.sh's own limit first
        text = open(log_path).read()
        if hung or rc != 0:
            raise AssertionError(f"{name}: {'hung, killed' if hung else f'exit {rc}'}; log {log_path}:\n{text[-3000:]}")
        log(f"# {name}: ok in {time.monotonic() - t0:.1f} s")
        return text

    # --- the steps -------------------------------------------------------------------------------
    def reference(self):
        metrics = os.path.join(self.work, "reference.jsonl")
        cmd = ["mpirun", "-np", str(self.world), "--map-by", f"ppr:{self.world}:node", "--bind-to", "none",
               "--oversubscribe", "--allow-run-as-root", "-x", "SCMOE_COMM_TIMEOUT_S", "-x", "SCMOE_CPU_BLAS_THREADS",
               self.args.train] + self.model + ["--metrics", metrics]
        self.run_clean("reference (1 host)", cmd)
        return losses(metrics)

    def uninterrupted(self):
        metrics = os.path.join(self.work, "uninterrupted.jsonl")
        ck = os.path.join(self.work, "ck-uninterrupted")
        text = self.run_clean(f"uninterrupted ({self.args.hosts} hosts)",
                              self.multi_host_cmd(["--metrics", metrics, "--checkpoint-dir", ck, "--checkpoint-every",
                                                   str(self.args.checkpoint_every)]), self.multi_host_env())
        hosts = set(re.findall(r"^# .* on (\S+), ", text, re.M))
        if hosts != set(self.cluster.hosts):
            raise AssertionError(f"ranks ran on {sorted(hosts)}, not on every namespace host {self.cluster.hosts}")
        return losses(metrics)

    def fault(self, kind, straight, index=0):
        """Runs one fault; returns a result dict (row of the table + failures)."""
        a = self.args
        tag = f"fault{index}-{kind}"  # fresh files per fault: a stale metrics file would trigger at once
        metrics = os.path.join(self.work, tag + ".jsonl")
        ck = os.path.join(self.work, "ck-" + tag)
        log_path = os.path.join(self.work, tag + ".log")
        victim_rank = self.world - 1  # the last rank: on the last host
        victim_host = a.hosts - 1
        res = {"fault": kind, "failures": []}
        fail = res["failures"].append
        proc = self.start(self.multi_host_cmd(["--metrics", metrics, "--checkpoint-dir", ck, "--checkpoint-every",
                                               str(a.checkpoint_every)]), log_path, self.multi_host_env())
        # Wait for step >= inject_at with a checkpoint and every rank process visible.
        deadline = time.monotonic() + a.job_limit_s
        ranks, ready_at = {}, None
        while time.monotonic() < deadline and proc.poll() is None:
            if last_step(metrics) >= a.inject_at and latest_checkpoint(ck):
                ready_at = ready_at or (time.monotonic(), last_step(metrics))
                ranks = rank_processes(self.cluster.netns_inodes(), a.train)
                if len(ranks) == self.world:
                    break
            time.sleep(0.02)
        if ready_at and time.monotonic() - ready_at[0] > 0.5:
            log(f"# {tag}: ready at step {ready_at[1]}, but the rank processes took "
                f"{time.monotonic() - ready_at[0]:.1f} s to find (last seen {sorted(ranks)})")
        if proc.poll() is not None or len(ranks) != self.world:
            kill_group(proc)
            self.kill_namespace_processes()
            fail(f"no injection: job ended or never reached step {a.inject_at} (rc {proc.returncode}, "
                 f"ranks seen {sorted(ranks)}); log {log_path}")
            res.update(exited="-", mpirun="-", message="-", lost="-", checkpoint="-", resume="-")
            return res
        at_step, at_ck = last_step(metrics), latest_checkpoint(ck)
        t0 = time.monotonic()
        if kind == "cut":
            self.cluster.cut(victim_host)
            survivors = dict(ranks)
        else:
            os.kill(ranks[victim_rank], signal.SIGKILL if kind == "kill" else signal.SIGSTOP)
            survivors = {r: p for r, p in ranks.items() if r != victim_rank}
        log(f"# {tag}: injected at step {at_step} (checkpoint {at_ck}); rank pids {ranks}")
        # Watch: when each survivor exits, the first message, mpirun's return.
        exit_at, first_msg_at = {}, None
        hard = a.timeout_s + a.grace_s + a.margin_s + a.observe_extra_s
        while time.monotonic() - t0 < hard:
            now = time.monotonic() - t0
            for r, pid in ranks.items():
                if r not in exit_at and not alive(pid):
                    exit_at[r] = now
            if first_msg_at is None and "scmoe-train: rank" in open(log_path, errors="replace").read():
                first_msg_at = now
            if proc.poll() is not None and len(exit_at) == len(ranks):
                break
            time.sleep(0.05)
        mpirun_rc = proc.poll()
        mpirun_at = time.monotonic() - t0 if mpirun_rc is not None else None
        # Whatever is still there now: survivors that never exited, the stopped victim, orteds.
        leftover = [(p, open(f"/proc/{p}/comm").read().strip()) for p in self.cluster.processes() if alive(p)]
        if mpirun_rc is None:
            kill_group(proc)
        self.kill_namespace_processes()
        if kind == "cut":
            self.cluster.restore(victim_host)
        text = open(log_path, errors="replace").read()
        msgs = messages(text)
        gone = [exit_at[r] for r in survivors if r in exit_at]
        all_exited = max(gone) if len(gone) == len(survivors) else None
        res["exit_at"] = {r: round(t, 2) for r, t in sorted(exit_at.items())}
        res["exited"] = (f"{all_exited:.1f}" if all_exited is not None
                         else f"NOT ({len(survivors) - len(gone)} alive at {hard:.0f})")
        if kind == "stop":
            res["exited"] += (f"; stopped rank {victim_rank} killed at {exit_at[victim_rank]:.1f}"
                              if victim_rank in exit_at else f"; stopped rank {victim_rank} still there")
        res["mpirun"] = (f"{mpirun_at:.1f} s, rc {mpirun_rc}" if mpirun_rc is not None
                         else f"HUNG (killed at {hard:.0f} s)")
        res["first_msg_at"] = first_msg_at
        res["message"] = (f"[{first_msg_at:.1f} s] rank {msgs[0][0]}: {msgs[0][1]}" if msgs else
                          "none from scmoe-train; Open MPI: " + open_mpi_line(text))
        res["messages"] = msgs
        res["leftover"] = leftover
        # Bounds.
        if all_exited is None or all_exited > a.timeout_s + a.margin_s:
            fail(f"survivors exited at {res['exited']} s, bound {a.timeout_s + a.margin_s} s "
                 f"(timeout {a.timeout_s} + margin {a.margin_s})")
        if mpirun_rc is None or mpirun_at > a.timeout_s + a.grace_s + a.margin_s:
            fail(f"mpirun returned {res['mpirun']}, bound {a.timeout_s + a.grace_s + a.margin_s} s "
                 f"(timeout + grace {a.grace_s} + margin)")
        elif mpirun_rc == 0:
            fail("mpirun returned 0 after a fault")
        # A rank left behind would hold its device: a failure. A daemon left on a host cut off from
        # mpirun cannot be reached by any launcher: reported (and killed here), not failed.
        left_ranks = [(p, c) for p, c in leftover if p in ranks.values()]
        left_other = [(p, c) for p, c in leftover if p not in ranks.values()]
        if mpirun_rc is not None and (left_ranks or (left_other and kind != "cut")):
            fail(f"processes left in the namespaces after mpirun returned: {leftover}")
        if mpirun_rc is not None and left_other and kind == "cut":
            res["mpirun"] += f"; left on the cut host: {', '.join(c for _, c in left_other)}"
        # Messages: an operation and a peer across the fault.
        across = ({r for r in range(self.world) if r // a.ranks_per_host != victim_host} if kind == "cut"
                  else {victim_rank})
        named = []
        for rank, msg in msgs:
            peers = {int(p) for group in re.findall(r"ranks? (\d+(?:, \d+)*)", msg) for p in group.split(", ")} - {rank}
            op = re.search(OPS, msg)
            named.append((rank, op.group(1) if op else None, peers))
        for rank, msg in msgs:  # "scmoe-train: rank 2: scmoe: rank 0: ..." names a rank of a subgroup
            inner = re.match(r"(?:scmoe: )?rank (\d+):", msg)
            if inner and int(inner.group(1)) != rank:
                fail(f"world rank {rank}'s message names itself rank {inner.group(1)} (a subgroup's numbering?): {msg}")
        if not msgs and kind == "kill":
            # A rank killed by a signal: Open MPI ends the job within about a second, before any
            # collective of the survivors can time out, so no scmoe message can come. What scmoe
            # adds is launch/mpirun.sh's line naming the dead rank (from Open MPI's report).
            if not re.search(rf"mpirun\.sh: a rank died before any rank reported an error; Open MPI ended the job: "
                             rf"process rank {victim_rank} ", text):
                fail("a killed rank: no mpirun.sh line naming it: " + open_mpi_line(text))
            else:
                res["message"] += "; mpirun.sh names rank " + str(victim_rank)
        elif not msgs:
            fail("no `scmoe-train: rank R:` message")
        else:
            if not any(op for _, op, _ in named):
                fail(f"no message names the operation: {msgs}")
            if kind == "cut":
                ok = any(p for r, op, peers in named for p in peers
                         if op and (r // a.ranks_per_host == victim_host) != (p // a.ranks_per_host == victim_host))
            else:
                ok = any(op and victim_rank in peers for _, op, peers in named)
            if not ok:
                fail(f"no message names an operation and the peer across the fault ({sorted(across)}): {msgs}")
        # Checkpoint and resume.
        final_step = last_step(metrics)
        ok, desc = check_checkpoint(ck, a.python)
        res["checkpoint"] = desc
        if not ok:
            fail("checkpoint: " + desc)
        ck_step = int(latest_checkpoint(ck).split("-")[1]) if latest_checkpoint(ck) else 0
        if latest_checkpoint(ck):  # kept for a post-mortem: the resumed run deletes old checkpoints
            shutil.copytree(os.path.join(ck, latest_checkpoint(ck)), ck + "-at-fault", dirs_exist_ok=True)
        res["lost"] = f"{final_step - ck_step} (step {final_step} done, checkpoint {ck_step})"
        resumed_metrics = os.path.join(self.work, tag + "-resumed.jsonl")
        try:
            rtext = self.run_clean(f"{tag} resume", self.multi_host_cmd(
                ["--metrics", resumed_metrics, "--checkpoint-dir", ck, "--checkpoint-every", str(a.checkpoint_every),
                 "--resume", "auto"]), self.multi_host_env())
            got = losses(resumed_metrics)
            want = {s: v for s, v in straight.items() if s > ck_step}
            if not re.search(r"# resumed from .* at step " + str(ck_step), rtext):
                fail(f"resume did not start from step {ck_step}")
            if got == want and got:
                res["resume"] = f"yes (steps {min(got)}-{max(got)})"
            else:
                diff = [(s, want.get(s), got.get(s)) for s in sorted(set(got) | set(want)) if want.get(s) != got.get(s)]
                res["resume"] = f"NO ({len(diff)} steps differ)"
                fail(f"resumed losses differ from the uninterrupted run: {diff[:5]}")
        except AssertionError as e:
            res["resume"] = "FAILED"
            fail(str(e))
        return res


def open_mpi_line(text):
    """The launcher's most telling line: which process it saw die, else a peer-disconnected note."""
    lines = [line.strip() for line in text.splitlines() if not line.startswith("+")]
    for pattern in (r"noticed that process rank", r"unexpectedly disconnected", r"MPI_ABORT|error"):
        for line in lines:
            if re.search(pattern, line, re.I):
                return line[:160]
    return "none"


def table(results, args, code_state):
    bound_r = args.timeout_s + args.margin_s
    bound_m = args.timeout_s + args.grace_s + args.margin_s
    lines = [f"SCMOE_COMM_TIMEOUT_S={args.timeout_s}, SCMOE_ABORT_GRACE_S={args.grace_s}, margin {args.margin_s} s; "
             f"{args.hosts} hosts x {args.ranks_per_host} ranks, ep {args.ep}, {args.steps} steps, checkpoint every "
             f"{args.checkpoint_every}, fault at step >= {args.inject_at} on host {args.hosts - 1} "
             f"(rank {args.hosts * args.ranks_per_host - 1} for kill/stop); code: {code_state}", "",
             f"| fault | every surviving rank exited (s after the fault, bound {bound_r}) | mpirun.sh returned (bound {bound_m}) | "
             "first scmoe message | data lost (steps) | checkpoint | resume bitwise | result |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results:
        msg = r.get("message", "-").replace("|", "\\|")
        lines.append(f"| {r['fault']} | {r.get('exited', '-')} | {r.get('mpirun', '-')} | {msg} | {r.get('lost', '-')} | "
                     f"{r.get('checkpoint', '-')} | {r.get('resume', '-')} | "
                     f"{'pass' if not r['failures'] else 'FAIL'} |")
    return "\n".join(lines) + "\n"


def code_state():
    try:
        head = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout
        dirty = subprocess.run(["git", "-C", ROOT, "diff", "--stat", "HEAD", "--", "scmoe/models/trainer.cpp",
                                "launch/train_main.cpp", "comm", "launch/mpirun.sh"], capture_output=True,
                               text=True).stdout.strip().splitlines()
        return f"HEAD {head.strip()}" + (f" + uncommitted: {dirty[-1].strip()}" if dirty else "")
    except OSError:
        return "unknown"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog=__doc__[__doc__.index("Bounds"):], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--train", required=True, help="the scmoe-train binary (built with MPI)")
    p.add_argument("--faults", default="cut,kill,stop", help="comma list of cut, kill, stop (all)")
    p.add_argument("--table", help="also write the markdown table to this file")
    p.add_argument("--hosts", type=int, default=2)
    p.add_argument("--ranks-per-host", type=int, default=2)
    p.add_argument("--ep", type=int, default=2, help="expert-parallel size (2: ep within a host, dp across)")
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--checkpoint-every", type=int, default=4)
    p.add_argument("--inject-at", type=int, default=14, help="inject once the metrics show this step (14: 2 steps after a checkpoint)")
    p.add_argument("--timeout-s", type=float, default=10, help="SCMOE_COMM_TIMEOUT_S (10)")
    p.add_argument("--grace-s", type=int, default=10, help="SCMOE_ABORT_GRACE_S for launch/mpirun.sh (10)")
    p.add_argument("--margin-s", type=float, default=15, help="slack on both bounds (15)")
    p.add_argument("--observe-extra-s", type=float, default=20,
                   help="how long past the mpirun bound to keep watching before killing a hung job (20)")
    p.add_argument("--job-limit-s", type=int, default=180, help="limit of a job that must succeed (180)")
    p.add_argument("--work", help="work directory, emptied first (default: a temp dir, removed when everything passed)")
    p.add_argument("--python", default=sys.executable, help="Python for tests/train/check_checkpoint.py")
    args = p.parse_args()
    args.timeout_s = int(args.timeout_s) if args.timeout_s == int(args.timeout_s) else args.timeout_s
    faults = [f for f in args.faults.split(",") if f]
    if set(faults) - {"cut", "kill", "stop"}:
        p.error(f"--faults: unknown {sorted(set(faults) - {'cut', 'kill', 'stop'})}")
    if not shutil.which("mpirun"):
        print("SKIPPED: no mpirun on PATH")
        return SKIP
    if not os.access(args.train, os.X_OK):
        p.error(f"--train {args.train}: not executable")
    args.train = os.path.abspath(args.train)
    if args.work:
        shutil.rmtree(args.work, ignore_errors=True)  # a previous run's logs and checkpoints
    work = args.work or tempfile.mkdtemp(prefix="scmoe-hosts-work-")
    os.makedirs(work, exist_ok=True)
    state = code_state()
    log(f"# host faults: work dir {work}; {state}")
    results, failures = [], []
    try:
        netns_cluster.check_can_run()
        cleaned, _ = netns_cluster.down_prefix("scmoe-")  # leftovers of runs killed before their teardown
        if cleaned:
            log(f"# removed leftovers of earlier runs: {cleaned}")
        with netns_cluster.Cluster(args.hosts, slots=args.ranks_per_host) as cluster:
            log(f"# cluster {cluster.tag}: hosts {cluster.hosts}, subnet {cluster.subnet}")
            sc = Scenario(args, cluster, work)
            ref = sc.reference()
            straight = sc.uninterrupted()
            if not straight or ref != straight:
                diff = [(s, ref.get(s), straight.get(s)) for s in sorted(set(ref) | set(straight))
                        if ref.get(s) != straight.get(s)]
                failures.append(f"multi-host losses differ from the single-host run: {diff[:5]} ({len(diff)} steps)")
                log(f"# FAIL: multi-host vs single-host: {len(diff)} steps differ, e.g. {diff[:3]}")
            else:
                log(f"# multi-host losses equal the single-host run bitwise ({len(straight)} steps)")
            for index, kind in enumerate(faults):
                r = sc.fault(kind, straight, index)
                results.append(r)
                log(f"# fault {kind}: survivors exited at {r.get('exit_at')}; mpirun {r.get('mpirun')}; "
                    f"leftover at the end of watching: {r.get('leftover')}")
                for rank, msg in r.get("messages", []):
                    log(f"#   rank {rank}: {msg}")
                for f in r["failures"]:
                    log(f"# FAIL ({kind}): {f}")
                failures += [f"{kind}: {f}" for f in r["failures"]]
    except netns_cluster.Skip as e:
        print(f"SKIPPED: {e}")
        return SKIP
    finally:
        kill_children()
    out = table(results, args, state)
    bitwise = "equal" if not any("single-host" in f for f in failures) else "DIFFERENT"
    out = f"multi-host vs single-host losses: {bitwise}\n\n" + out
    print("\n" + out)
    if args.table:
        with open(args.table, "w") as f:
            f.write(out)
    if failures:
        log(f"{len(failures)} check(s) failed; logs in {work}")
        return 1
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    log("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
