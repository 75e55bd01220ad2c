// Communicator: the collectives expert parallelism needs, stream-ordered like every op in scmoe.
//
// Conventions for every call:
// - The stream is the last argument. The call only enqueues the collective on `stream` (for the
//   host-buffer communicators: as a Stream::host_task); buffers must stay valid, and inputs
//   unchanged, until that work has run (Stream::synchronize or an Event). Outputs, including the
//   counts all_to_all_v fills in, are readable only after that point. (The device-buffer paths,
//   NcclCommunicator and LocalCommunicator on CUDA streams, synchronize the stream inside
//   all_to_all_v to read the counts; their headers say so.)
// - Buffers are host memory for MpiCommunicator and for LocalCommunicator on CPU streams; device
//   memory for NcclCommunicator and for LocalCommunicator on CUDA streams.
// - Counts are in elements of `dtype`, never bytes.
// - Every rank of the group issues the same collectives in the same order; the k-th call on one
//   rank matches the k-th call on every other rank. Do not issue calls on one communicator from
//   two streams at once.
// - Errors (a timeout, a mismatched call, bad arguments) are raised as scmoe::Error from the
//   stream's work, so Stream::synchronize() rethrows them; the device-buffer paths, which match
//   the ranks' calls on the host when they are issued, throw them from the call itself. The message names the rank, the
//   operation and, for a timeout, the peer waited for. After an error the communicator may be
//   unusable; treat it like a failed NCCL communicator and tear the job down.
// - Reductions are deterministic: contributions are summed in rank order 0..size-1 whatever order
//   they arrive in, so every rank gets bit-identical results, run after run.
//
// Environment:
//   SCMOE_COMM_TIMEOUT_S  (default 300) seconds any blocking wait inside a collective may take
//                         before it raises an error. Read once, at the first use; a value that is
//                         not a positive number is an error.
#pragma once

#include <cstdint>
#include <string>

#include "scmoe/kernels/device.h"
#include "scmoe/kernels/dtype.h"

namespace scmoe {

// The timeout, in seconds, from SCMOE_COMM_TIMEOUT_S (default 300). Parsed once; throws Error if
// the variable is set to something other than a positive number.
double comm_timeout_seconds();

class Communicator {
  public:
    virtual ~Communicator() = default;

    // This process's (or thread's) rank in [0, size()).
    virtual int rank() const = 0;
    // Number of ranks in the group.
    virtual int size() const = 0;
    // "local(rank 1 of 4)", "mpi(rank 0 of 8)".
    virtual std::string name() const = 0;

    // Variable all-to-all. Counts are exchanged first, so receivers need not know them in advance.
    //   send         [sum(send_counts)] elements, packed by destination rank in rank order: the
    //                send_counts[0] elements for rank 0 first, then those for rank 1, ...
    //   send_counts  [size()] elements this rank sends to each peer (>= 0; zero is fine). Read
    //                when the work runs, so earlier work on `stream` may compute them.
    //   recv         packed by source rank in rank order; must hold the total this rank receives
    //                (sum over peers of what they send to it). The caller sizes it (e.g. for the
    //                worst-case token count); nothing checks its capacity.
    //   recv_counts  [size()] out: recv_counts[p] = elements received from rank p.
    virtual void all_to_all_v(const void* send, const std::int64_t* send_counts, void* recv, std::int64_t* recv_counts,
                              DType dtype, Stream& stream) = 0;

    // all_to_all_v when this rank already knows what it receives (e.g. the reverse of an exchange it
    // made: collect after dispatch). No count exchange, so NcclCommunicator and the emulated NCCL
    // neither exchange counts nor make the host wait: the call enqueues the data exchange and returns.
    //   recv_counts  [size()] in: elements received from each peer; must equal what each peer sends
    //                to this rank.
    // When the counts are read: NcclCommunicator and the emulated NCCL read both count arrays when
    // the call is made (they must hold their values then); the host-task communicators when the work
    // runs. A mismatch with what the peers send is an error (raised like any collective error) where
    // the transport can see it: LocalCommunicator and MpiCommunicator check it (they still exchange
    // the counts, as a check, inside their stream work), the emulated NCCL too; NcclCommunicator
    // cannot, and a wrong count there is a wrong result or a hang, as with ncclSend/ncclRecv.
    virtual void all_to_all_v_known(const void* send, const std::int64_t* send_counts, void* recv,
                                    const std::int64_t* recv_counts, DType dtype, Stream& stream) = 0;

    // In place: buf [count] becomes the element-wise sum over all ranks, added in rank order
    // (f32: fp32 adds; bf16: fp32 accumulation rounded once to bf16; i32: wrapping adds).
    // `count` and `dtype` must match on every rank.
    virtual void all_reduce_sum(void* buf, std::int64_t count, DType dtype, Stream& stream) = 0;

    // send [count_per_rank] from every rank lands in recv [size() * count_per_rank] at offset
    // rank * count_per_rank. `count_per_rank` and `dtype` must match on every rank. In place is
    // allowed: send == recv + rank() * count_per_rank.
    virtual void all_gather(const void* send, std::int64_t count_per_rank, void* recv, DType dtype, Stream& stream) = 0;

    // buf [count] of rank `root` is copied into buf on every other rank. `count`, `dtype` and
    // `root` must match on every rank.
    virtual void broadcast(void* buf, std::int64_t count, DType dtype, int root, Stream& stream) = 0;

    // The stream's later work starts only after every rank's stream has reached its barrier.
    virtual void barrier(Stream& stream) = 0;

    // The SMs one of this communicator's collectives occupies on each GPU while it runs (NCCL: one
    // CTA per channel), when it knows them: the emulated NCCL's, from its topology; 0 for transports
    // that use none (host tasks, MPI, copy engines); -1 = not known (NcclCommunicator: NCCL picks its
    // channels at run time). scmoe/comm/comm_sms.h turns it into the SMs compute leaves free for an exchange.
    virtual int kernel_sms() const { return -1; }
};

// Sums `count` host values (f32 or i32) element-wise over the group, in place, for small agreements
// (a loss, a failure flag, measured times). `scratch` is stream memory of at least count elements
// (the collective runs on it, since the device-buffer communicators need device memory).
// Synchronizes `stream`; every rank gets the same result.
void all_reduce_sum_host(Communicator& comm, float* values, std::int64_t count, void* scratch, Stream& stream);
void all_reduce_sum_host(Communicator& comm, std::int32_t* values, std::int64_t count, void* scratch, Stream& stream);

}  // namespace scmoe
