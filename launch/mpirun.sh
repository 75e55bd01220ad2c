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
  SCMOE_MPIRUN_ARGS        extra mpirun arguments, split on spaces, e.g.
                           "--mca btl_tcp_if_include eth0 --mca oob_tcp_if_include eth0" to keep
                           Open MPI's own TCP traffic on the cluster network too
  NCCL_DEBUG (WARN), NCCL_SOCKET_IFNAME, NCCL_IB_HCA, CUDA_DEVICE_MAX_CONNECTIONS (8):
                           see launch/nccl_env.sh, which documents each and why

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
exec "${cmd[@]}"
