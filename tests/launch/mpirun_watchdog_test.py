"""launch/mpirun.sh's watchdog, on a fake mpirun (first on PATH) that behaves as Open MPI did after a
cut link: a rank reports its error, and mpirun never returns. Each case checks the exit status, the
messages and that no process of the fake job is left (they carry a unique marker in their argv).

  usage: mpirun_watchdog_test.py SOURCE_ROOT
"""

import os
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_check_util import check, finish, write  # noqa: E402

ERROR = "scmoe-train: rank 1: scmoe: rank 1: all_to_all_v timed out after 20 s waiting for rank 2 (SCMOE_COMM_TIMEOUT_S)"

# The fake mpirun: prints its arguments, starts a child that ignores SIGTERM (only SIGKILL ends it),
# then does what $FAKE_MODE says.
FAKE = r"""#!/usr/bin/env bash
echo "fake mpirun $*"
python3 -c 'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)' "$FAKE_MARKER" &
case $FAKE_MODE in
    hang-after-error) echo "$FAKE_ERROR" >&2; trap '' TERM; while :; do sleep 1; done ;;
    hang) trap '' TERM; trap 'echo "fake mpirun: SIGUSR1" >&2' USR1; while :; do sleep 1 & wait $!; done ;;
    abort) echo "$FAKE_ERROR" >&2; kill -9 $!; exit 3 ;;
    ok) kill -9 $!; exit 0 ;;
    died) kill -9 $!; echo "mpirun noticed that process rank 3 with PID 4242 on node h1 exited on signal 9 (Killed)." >&2
          exit 137 ;;
esac
"""


def marked(marker):
    """Pids of the processes whose command line holds `marker`."""
    pids = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    pids.append(int(pid))
        except OSError:
            pass
    return pids


def run(root, tmp, mode, env_extra, signal_after=None, again_after=None):
    """Runs mpirun.sh on the fake; returns (exit status, stdout + stderr, seconds, leftover pids)."""
    marker = f"scmoe-watchdog-test-{os.getpid()}-{mode}"
    env = dict(os.environ, PATH=tmp + os.pathsep + os.environ["PATH"], SCMOE_TRAIN="/bin/true", FAKE_MODE=mode,
               FAKE_ERROR=ERROR, FAKE_MARKER=marker, **env_extra)
    started = time.monotonic()
    p = subprocess.Popen(["bash", os.path.join(root, "launch", "mpirun.sh"), "-N", "2", "--", "--steps", "3"],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    if signal_after is not None:
        time.sleep(signal_after)
        p.send_signal(signal.SIGTERM)
        if again_after is not None:
            time.sleep(again_after)
            p.send_signal(signal.SIGTERM)
    try:
        out, _ = p.communicate(timeout=120)
    except subprocess.TimeoutExpired:  # the watchdog failed: end everything, report what came
        os.killpg(p.pid, signal.SIGKILL)
        for pid in marked(marker) + marked(os.path.join(tmp, "mpirun")):
            os.kill(pid, signal.SIGKILL)
        out, _ = p.communicate()
    elapsed = time.monotonic() - started
    time.sleep(0.5)  # the kernel reaps killed processes
    left = marked(marker)
    for pid in left:  # never leave them behind, even when the check fails
        os.kill(pid, signal.SIGKILL)
    return p.returncode, out, elapsed, left


def main():
    root = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        write(os.path.join(tmp, "mpirun"), FAKE, executable=True)

        rc, out, s, left = run(root, tmp, "hang-after-error", {"SCMOE_ABORT_GRACE_S": "1"})
        check(rc == 3, f"mpirun hangs after a rank's error: exit 3 (got {rc} after {s:.1f} s)", out)
        check(ERROR in out and "has not returned 1 s after a rank's error" in out and
              f"The error: {ERROR}" in out, "the rank's error passes through and the watchdog names it", out)
        check(not left, "every process of the job is gone, also one that ignores SIGTERM", f"left: {left}")

        rc, out, s, left = run(root, tmp, "hang", {"SCMOE_MPIRUN_TIMEOUT_S": "2"})
        check(rc == 124, f"mpirun hangs without an error: exit 124 at SCMOE_MPIRUN_TIMEOUT_S (got {rc})", out)
        check("exceeded SCMOE_MPIRUN_TIMEOUT_S=2 s" in out, "the timeout is named", out)
        check(not left, "the timed-out job's processes are gone", f"left: {left}")

        rc, out, s, left = run(root, tmp, "abort", {"SCMOE_ABORT_GRACE_S": "100"})
        check(rc == 3 and ERROR in out and "mpirun.sh:" not in out,
              "mpirun returning after MPI_Abort: its status, untouched, and no watchdog message", out)

        rc, out, s, left = run(root, tmp, "ok", {})
        check(rc == 0 and "fake mpirun -np 2" in out, "a run that succeeds: exit 0, mpirun's output passed on", out)

        rc, out, s, left = run(root, tmp, "died", {})
        check(rc == 137 and "mpirun.sh: a rank died before any rank reported an error; Open MPI ended the job: "
              "process rank 3 with PID 4242 on node h1 exited on signal 9 (Killed)." in out,
              "a rank killed by a signal: mpirun's status, and one line saying which rank died where", out)

        # A first SIGTERM asks the ranks to stop cleanly (SIGUSR1 through mpirun, which forwards it); a
        # second one kills the job.
        rc, out, s, left = run(root, tmp, "hang", {}, signal_after=1.0, again_after=1.5)
        check("mpirun.sh: SIGTERM: asking every rank to finish its step" in out and "fake mpirun: SIGUSR1" in out,
              "a first SIGTERM to mpirun.sh goes to mpirun as SIGUSR1", out)
        check(rc == 143 and "mpirun.sh: SIGTERM again: killing mpirun's process group" in out,
              f"a second SIGTERM to mpirun.sh ends the job (exit {rc})", out)
        check(not left, "after the second SIGTERM to mpirun.sh the job's processes are gone", f"left: {left}")

        for bad in ("SCMOE_ABORT_GRACE_S", "SCMOE_MPIRUN_TIMEOUT_S"):
            rc, out, s, left = run(root, tmp, "ok", {bad: "soon"})
            check(rc == 2 and f"{bad}='soon'" in out, f"a bad {bad} is a usage error (exit 2)", out)
    finish("mpirun_watchdog")


if __name__ == "__main__":
    main()
