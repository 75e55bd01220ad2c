# shellcheck shell=bash
# The environment of a multi-process scmoe-train launch, sourced by launch/mpirun.sh and
# launch/slurm.sbatch. A variable already set by the caller is kept; otherwise the default below is
# what we choose, and the comment says why. After sourcing, SCMOE_FORWARD_ENV lists the variables to
# hand to every rank (mpirun -x NAME; srun forwards the whole environment by default).
#
# NCCL's reference: https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html

# NCCL_DEBUG (default here: WARN; NCCL's own default prints nothing)
#   VERSION | WARN | INFO | TRACE. WARN prints NCCL's warnings and errors, which a failed or hung
#   communicator creation otherwise hides. For diagnosing, run once with NCCL_DEBUG=INFO: each rank
#   logs the interface and transport NCCL picked (NET/IB or NET/Socket between nodes, P2P/NVLink or
#   SHM inside one), the rings/trees and its GPU/NIC topology. NCCL_DEBUG_SUBSYS=INIT,NET narrows
#   it; NCCL_DEBUG_FILE=nccl.%h.%p writes one file per process instead of interleaving on stderr.
: "${NCCL_DEBUG:=WARN}"
export NCCL_DEBUG

# NCCL_SOCKET_IFNAME (default: unset, NCCL chooses)
#   The IP interface(s) NCCL uses for its bootstrap (every communicator creation exchanges
#   addresses over TCP) and, when there is no InfiniBand/RoCE NIC, for the inter-node data itself
#   (the Socket transport). A comma list of name prefixes; '=' matches a name exactly, a leading '^'
#   excludes: "eth0", "=ens1f0", "^docker,lo". Left unset, NCCL takes ib* interfaces first, then any
#   other except docker* and lo, then docker*, then lo — fine on most clusters, and a hang in
#   communicator creation when the first it finds is up but cannot reach the other nodes (a second
#   Ethernet port, a VPN or bridge interface). Then set it to the cluster network's NIC. It must
#   never be lo or a docker bridge on more than one node: those do not leave the machine.
if [ -n "${NCCL_SOCKET_IFNAME:-}" ]; then export NCCL_SOCKET_IFNAME; fi

# NCCL_IB_HCA (default: unset, NCCL uses every InfiniBand/RoCE port it finds)
#   Which RDMA adapters and ports NCCL uses between nodes: "mlx5_0:1,mlx5_1:1", "=mlx5_0", or
#   "^mlx5_4" to leave out, for example, the storage network's adapter. NCCL_IB_DISABLE=1 forces
#   the Socket transport (slow; for telling an IB problem from anything else).
if [ -n "${NCCL_IB_HCA:-}" ]; then export NCCL_IB_HCA; fi

# CUDA_DEVICE_MAX_CONNECTIONS (default here: 8, the CUDA driver's default; range 1..32)
#   The number of hardware work queues ("connections") between the host and the GPU per CUDA
#   context. Streams are spread over them; work in one queue starts in the order it was enqueued,
#   and a queue whose head waits (for an event, or for the previous kernel of its stream) holds
#   back everything behind it, whatever stream that work belongs to.
#   Megatron-LM requires 1 for its tensor/sequence-parallel overlap: with one queue the GPU runs
#   kernels in launch order, so the communication kernel it launches first is resident before the
#   GEMM after it takes every SM. The cost is that independent streams stop being independent;
#   Megatron's own data-parallel gradient overlap and MoE all-to-all overlap are reported to need
#   more than 1 (NVIDIA/Megatron-LM issues #1468, #2180; PR #2719).
#   scmoe's LayerScheduler issues each MoE branch on its own stream ahead of the backbone segments
#   that are to hide it: pre + dispatch before the segments up to the expert slot, then (at the
#   slot) the event waits, collect and combine before the segments after it. With one queue,
#   those waits and combine's dependence on collect would stall the backbone segments queued
#   behind them — exactly the compute that is meant to hide the all-to-all (our reading of the
#   issue order in scmoe/moe/layer_scheduler.cpp; not yet measured on a GPU). So we keep separate
#   queues: 8 (two streams per rank need only 2; NCCL may add its own). The trade-off we accept:
#   with several queues the GPU may start a backbone GEMM before the all-to-all kernel has its
#   SMs, delaying the transfer's start. Set CUDA_DEVICE_MAX_CONNECTIONS=1 to compare, and look at
#   scmoe-train --trace (the per-rank timeline of both streams) and the exposed-comm % it prints.
#   It is read when the CUDA context is created: set it in the environment, not in the program.
: "${CUDA_DEVICE_MAX_CONNECTIONS:=8}"
export CUDA_DEVICE_MAX_CONNECTIONS

# NCCL_LAUNCH_ORDER_IMPLICIT (default here: 1; NCCL >= 2.26 knows it, older releases ignore it)
#   Each rank drives several communicators on its GPU at once: the expert-parallel all-to-alls
#   and the world / expert-data-parallel gradient all-reduces, on two streams. NCCL's user guide
#   ("Using multiple NCCL communicators concurrently"): before 2.26 the operations of all
#   communicators had to be serialized into one global order or they could deadlock; with this
#   variable NCCL orders them as the host issues them, and the host order must match on every GPU.
#   scmoe-train issues in one deterministic order on every rank (the block schedule is agreed over
#   the world). NcclCommunicator sets it too when it is unset; set 0 here to turn it off.
: "${NCCL_LAUNCH_ORDER_IMPLICIT:=1}"
export NCCL_LAUNCH_ORDER_IMPLICIT

# The variables each rank needs (those set). PATH and LD_LIBRARY_PATH: remote ranks start from a
# non-interactive shell that may lack the CUDA/NCCL/MPI library paths of this one.
SCMOE_FORWARD_ENV=()
for _scmoe_name in PATH LD_LIBRARY_PATH CUDA_DEVICE_MAX_CONNECTIONS NCCL_LAUNCH_ORDER_IMPLICIT \
    NCCL_DEBUG NCCL_DEBUG_SUBSYS NCCL_DEBUG_FILE NCCL_SOCKET_IFNAME NCCL_IB_HCA NCCL_IB_DISABLE \
    SCMOE_COMM_TIMEOUT_S SCMOE_CPU_BLAS_THREADS SCMOE_GROUPED_GEMM_PROVIDER; do
    if [ -n "${!_scmoe_name:-}" ]; then SCMOE_FORWARD_ENV+=("$_scmoe_name"); fi
done
unset _scmoe_name

# scmoe_check_socket_ifname NODES: refuses NCCL_SOCKET_IFNAME=lo / docker* for a multi-node job.
scmoe_check_socket_ifname() {
    local nodes=$1 item
    local -a items
    if [ "$nodes" -le 1 ] || [ -z "${NCCL_SOCKET_IFNAME:-}" ]; then return 0; fi
    case $NCCL_SOCKET_IFNAME in ^*) return 0 ;; esac  # an exclusion list
    IFS=, read -ra items <<<"$NCCL_SOCKET_IFNAME"
    for item in "${items[@]}"; do
        item=${item#=}
        case $item in
            lo* | docker*)
                echo "error: NCCL_SOCKET_IFNAME=$NCCL_SOCKET_IFNAME names '$item', which does not leave the node;" \
                    "a $nodes-node job needs the cluster network's interface (ip -br addr lists them)" >&2
                return 1
                ;;
        esac
    done
}
