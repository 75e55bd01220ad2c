#!/usr/bin/env bash
# Launches scmoe-train with Open MPI: one process per GPU on each node of a hostfile, the NCCL and
# CUDA settings of launch/nccl_env.sh exported to every rank. Prints the command, then runs it.
# Each rank takes GPU <local rank> (OMPI_COMM_WORLD_LOCAL_RANK); on CUDA the trainer builds NCCL
# communicators (world, expert-parallel group, expert-data-parallel group) from MPI split
# communicators. Run `launch/mpirun.sh --help` for the options.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# Echoes a command so it can be pasted back into a shell (quotes only the words that need it).
print_cmd() {
    local word line='+'
    for word in "$@"; do
        if [[ $word =~ ^[A-Za-z0-9_./,:=@%+-]+$ ]]; then line+=" $word"; else line+=" $(printf '%q' "$word")"; fi
    done
    echo "$line"
}

usage() {
    cat <<'EOF'
usage: launch/mpirun.sh [options] [--] [scmoe-train options...]

Launches scmoe-train under Open MPI's mpirun, one rank per GPU on every host of the hostfile:
ranks = hosts x ranks-per-node.
Everything after the options (or after --) goes to scmoe-train (scmoe-train --help lists them).

options:
  -H, --hostfile FILE      Open MPI hostfile, one node per line: "node01 slots=8"
                           (default: $SCMOE_HOSTFILE; without one, this node only)
  -N, --ranks-per-node N   ranks per node = GPUs per node (default: $SCMOE_RANKS_PER_NODE, else the
                           GPUs `nvidia-smi -L` lists on this node, else 1)
      --dry-run            print the command and exit
  -h, --help               this text

environment (defaults in parentheses):
  SCMOE_TRAIN              the scmoe-train binary ($SCMOE_BUILD_DIR/launch/scmoe-train); the same
                           path must exist on every node (a shared file system)
  SCMOE_BUILD_DIR          build directory (build)
  SCMOE_BIND_TO            mpirun --bind-to: none | core | numa | socket (none: Open MPI's default
                           binds 1-2 ranks to one core each and more ranks to a socket, which would
                           squeeze a rank's threads - CPU stream workers, BLAS, NCCL's proxy thread)
  SCMOE_ABORT_GRACE_S      (30) once a rank has reported the error that ends it (a stderr line
                           "scmoe-train: rank R: ..."; it then calls MPI_Abort), mpirun has this
                           long to return; then its process group is killed (TERM, 10 s later
                           KILL) and this script exits 3. mpirun can stay behind when it cannot
                           reach a host's daemon any more, e.g. after that host's link was cut
  SCMOE_MPIRUN_TIMEOUT_S   (0: none) the whole run's limit: mpirun's process group is killed
                           after it and this script exits 124, as timeout(1) does
  SCMOE_MPIRUN_ARGS        extra mpirun arguments, split on spaces, e.g.
                           "--mca btl_tcp_if_include eth0 --mca oob_tcp_if_include eth0" to keep
                           Open MPI's own TCP traffic on the cluster network too
  NCCL_DEBUG (WARN), NCCL_SOCKET_IFNAME, NCCL_IB_HCA, CUDA_DEVICE_MAX_CONNECTIONS (8):
                           see launch/nccl_env.sh, which documents each and why

signals:
  INT, TERM, HUP           the first goes to every rank as SIGUSR1 (through mpirun): scmoe-train
                           finishes its step, saves (with --checkpoint-dir) and exits 4, and so does
                           this script; a second kills the job at once (exit 143)

examples:
  launch/mpirun.sh -H hosts.txt -N 8 -- --preset gpt2-moe-small --ep 8 --backend cuda \
      --steps 20000 --checkpoint-dir /shared/ck/run1 --checkpoint-every 500 --resume auto \
      --metrics /shared/ck/run1/metrics.jsonl
  NCCL_DEBUG=INFO NCCL_SOCKET_IFNAME==ens1f0 launch/mpirun.sh -H hosts.txt -N 8 -- --steps 10
  launch/mpirun.sh -N 4 -- --backend cpu --steps 50        # 4 CPU processes on this node
EOF
}

hostfile=${SCMOE_HOSTFILE:-}
ranks_per_node=${SCMOE_RANKS_PER_NODE:-}
dry_run=0
while [ $# -gt 0 ]; do
    case $1 in
        -H | --hostfile) hostfile=${2:?"$1 needs a file"}; shift 2 ;;
        -N | --ranks-per-node) ranks_per_node=${2:?"$1 needs a number"}; shift 2 ;;
        --dry-run) dry_run=1; shift ;;
        -h | --help) usage; exit 0 ;;
        --) shift; break ;;
        *) break ;;  # the first scmoe-train option
    esac
done

if [ -z "$ranks_per_node" ]; then
    ranks_per_node=$( (nvidia-smi -L 2>/dev/null || true) | grep -c '^GPU' || true)
    [ "$ranks_per_node" != 0 ] || ranks_per_node=1
fi
case $ranks_per_node in
    '' | *[!0-9]* | 0) echo "error: ranks per node '$ranks_per_node' is not a positive count" >&2; exit 2 ;;
esac
nodes=1
if [ -n "$hostfile" ]; then
    [ -r "$hostfile" ] || { echo "error: cannot read hostfile '$hostfile'" >&2; exit 2; }
    nodes=$(awk '!/^[[:space:]]*(#|$)/ {print $1}' "$hostfile" | sort -u | wc -l)
    [ "$nodes" -gt 0 ] || { echo "error: no hosts in '$hostfile'" >&2; exit 2; }
fi

train=${SCMOE_TRAIN:-${SCMOE_BUILD_DIR:-build}/launch/scmoe-train}
case $train in /*) ;; *) train=$root/$train ;; esac
[ -x "$train" ] || { echo "error: no scmoe-train at $train (build it: cmake --build build --target scmoe-train)" >&2; exit 2; }

# shellcheck source=launch/nccl_env.sh
source "$root/launch/nccl_env.sh"
scmoe_check_socket_ifname "$nodes"

bind_to=${SCMOE_BIND_TO:-none}
cmd=(mpirun -np $((nodes * ranks_per_node)) --map-by "ppr:$ranks_per_node:node" --bind-to "$bind_to")
[ "$bind_to" = none ] || cmd+=(--report-bindings)
[ -z "$hostfile" ] || cmd+=(--hostfile "$hostfile")
for name in "${SCMOE_FORWARD_ENV[@]}"; do cmd+=(-x "$name"); done
# shellcheck disable=SC2206  # SCMOE_MPIRUN_ARGS is a list of words on purpose
[ -z "${SCMOE_MPIRUN_ARGS:-}" ] || cmd+=(${SCMOE_MPIRUN_ARGS})
cmd+=("$train" "$@")

echo "# $nodes node(s) x $ranks_per_node rank(s); NCCL_DEBUG=$NCCL_DEBUG NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-(NCCL chooses)}" \
    "NCCL_IB_HCA=${NCCL_IB_HCA:-(all)} CUDA_DEVICE_MAX_CONNECTIONS=$CUDA_DEVICE_MAX_CONNECTIONS"
print_cmd "${cmd[@]}"
[ "$dry_run" = 1 ] && exit 0

# The watchdog. mpirun runs in its own session (setsid), so its process group - mpirun and what it
# started on this host: ranks, rsh agents - can be killed as one. Its stderr passes through a
# filter (reading a FIFO) that passes every line on and notes the first rank error line, with its
# time, and Open MPI's line naming a rank that died; this shell polls mpirun once a second
# against the grace period and the overall limit.
grace=${SCMOE_ABORT_GRACE_S:-30}
limit=${SCMOE_MPIRUN_TIMEOUT_S:-0}
case $grace in '' | *[!0-9]*) echo "error: SCMOE_ABORT_GRACE_S='$grace' is not a whole number of seconds" >&2; exit 2 ;; esac
case $limit in '' | *[!0-9]*) echo "error: SCMOE_MPIRUN_TIMEOUT_S='$limit' is not a whole number of seconds" >&2; exit 2 ;; esac
state=$(mktemp -d "${TMPDIR:-/tmp}/scmoe-mpirun.XXXXXX")
trap 'rm -rf "$state"' EXIT
fatal=$state/fatal died=$state/died
mkfifo "$state/stderr"
while IFS= read -r line; do
    printf '%s\n' "$line" >&2
    case $line in
        *"scmoe-train: rank "[0-9]*)  # anywhere: mpirun may splice another rank's chunk before it
            [ -e "$fatal" ] || { printf '%s\n%s\n' "$(date +%s)" "$line" >"$fatal.new" && mv "$fatal.new" "$fatal"; } ;;
        *"mpirun noticed that process rank "*) [ -e "$died" ] || printf '%s\n' "$line" >"$died" ;;
    esac
done <"$state/stderr" &
filter_pid=$!
setsid "${cmd[@]}" 2>"$state/stderr" &
mpirun_pid=$!
# setsid runs mpirun in place (a background job of a script leads no process group), so the
# group's id is mpirun's pid; if it ever is not, only mpirun itself can be killed.
# (The child may not have called setsid yet: look a few times.)
group=$mpirun_pid
for _ in $(seq 40); do
    [ "$(ps -o pgid= -p "$mpirun_pid" 2>/dev/null | tr -d ' ')" = "$mpirun_pid" ] && { group=-$mpirun_pid; break; }
    kill -0 "$mpirun_pid" 2>/dev/null || break
    sleep 0.05
done
# Kills the job's process group: TERM, then KILL after 10 s if anything is left.
kill_job() {
    kill -CONT -- "$group" 2>/dev/null || true  # a stopped process takes TERM only once continued
    kill -TERM -- "$group" 2>/dev/null || true
    local i
    for i in $(seq 10); do
        kill -0 -- "$group" 2>/dev/null || return 0
        sleep 1
    done
    kill -KILL -- "$group" 2>/dev/null || true
}
# A signal to this script (INT, TERM or HUP): the first asks every rank to stop cleanly. It goes to
# mpirun as SIGUSR1, which mpirun forwards to every rank (its own INT and TERM would end the job:
# TERM, then KILL a second later); scmoe-train's default --stop-signals include SIGUSR1, so each
# rank finishes its step, they save (with --checkpoint-dir) and exit 4, and so does this script. A
# second signal kills the job's process group at once (exit 143); the last complete checkpoint stays.
stop_asked=0
# shellcheck disable=SC2317  # called by the traps below
# (No `return` here: in a trap, bash returns the status of the command the signal interrupted,
# and set -e would end the script with it.)
on_signal() {
    if [ "$stop_asked" = 0 ]; then
        stop_asked=1
        echo "mpirun.sh: $1: asking every rank to finish its step, save and exit (SIGUSR1 to mpirun $mpirun_pid);" \
            "a second signal kills the job at once" >&2
        kill -USR1 "$mpirun_pid" 2>/dev/null || true
    else
        echo "mpirun.sh: $1 again: killing mpirun's process group $mpirun_pid" >&2
        kill_job
        exit 143
    fi
}
trap 'on_signal SIGINT' INT
trap 'on_signal SIGTERM' TERM
trap 'on_signal SIGHUP' HUP
started=$SECONDS
verdict=
while kill -0 "$mpirun_pid" 2>/dev/null; do
    if [ -e "$fatal" ] && [ $(($(date +%s) - $(head -1 "$fatal"))) -ge "$grace" ]; then
        echo "mpirun.sh: mpirun has not returned ${grace} s after a rank's error (SCMOE_ABORT_GRACE_S):" \
            "killing its process group $mpirun_pid. The error: $(sed -n 2p "$fatal")" >&2
        verdict=3
        kill_job
        break
    fi
    if [ "$limit" -gt 0 ] && [ $((SECONDS - started)) -ge "$limit" ]; then
        echo "mpirun.sh: the run exceeded SCMOE_MPIRUN_TIMEOUT_S=$limit s: killing mpirun's process group $mpirun_pid" >&2
        verdict=124
        kill_job
        break
    fi
    sleep 1 &
    wait $! || true  # unlike a plain sleep, a trapped signal ends the wait at once
done
status=0
wait "$mpirun_pid" || status=$?
# The filter ends at the end of mpirun's stderr (unless a process left behind holds it open).
for _ in $(seq 20); do kill -0 "$filter_pid" 2>/dev/null || break; sleep 0.1; done
if [ -e "$died" ] && [ ! -e "$fatal" ]; then
    # What Open MPI reports is all there is: it ended the job before any rank's collective failed.
    echo "mpirun.sh: a rank died before any rank reported an error; Open MPI ended the job:" \
        "$(sed 's/^.*mpirun noticed that //' "$died")" >&2
fi
if [ -n "$verdict" ]; then
    echo "mpirun.sh: exit $verdict (mpirun itself: $status)" >&2
    exit "$verdict"
fi
exit "$status"
