// NcclCommunicator: device-buffer collectives over NCCL (CUDA backend). Built only when scmoe is
// built with CUDA (SCMOE_WITH_CUDA=1); otherwise this header is empty.
//
//   auto comm = NcclCommunicator::from_mpi(MPI_COMM_WORLD, /*device=*/local_rank);   // (a)
//   auto comm = NcclCommunicator::from_file("/shared/job42.ncclid", rank, size, dev);  // (b)
//   auto comm = NcclCommunicator::borrow(trainer_comm, dev);                           // (c)
//
// Beyond Communicator's conventions (communicator.h):
// - Buffers are device memory of `device` (or memory NCCL can address). Streams must be CUDA
//   streams of that device. send_counts and recv_counts may be host or device memory.
// - all_to_all_v first exchanges the counts (an all-to-all of one int64 per peer, grouped
//   ncclSend/ncclRecv), copies them to pinned host memory and waits for the stream, once per call:
//   the host needs the counts to post the data's grouped ncclSend/ncclRecv. So all_to_all_v
//   returns only after the work enqueued before it on `stream` has finished; recv_counts are
//   filled in when it returns. The data exchange itself is enqueued, not waited for.
// - all_to_all_v_known posts the grouped ncclSend/ncclRecv at once from the host counts given (read
//   when the call is made): no count exchange, no wait. A receive count that differs from what the
//   peer sends cannot be detected here (a wrong result or a hang, as with ncclSend/ncclRecv).
// - all_reduce_sum is ncclAllReduce: for a given communicator, topology, count and NCCL version
//   the result is reproducible run to run and identical on every rank, but the summation order is
//   NCCL's (ring/tree), not rank order 0..n-1, so it is not bit-identical to the CPU
//   communicators; bf16 is summed as NCCL sums bf16, not in fp32 rounded once.
// - NCCL calls must be issued in the same order on every rank, from one host thread per GPU.
// - No silent hangs: wait() and the counts exchange poll cudaStreamQuery and
//   ncclCommGetAsyncError against the timeout (SCMOE_COMM_TIMEOUT_S); on an asynchronous error or
//   a timeout the communicator is aborted (ncclCommAbort) and an Error naming the rank and the
//   operation is thrown. Communicators this class creates are non-blocking (ncclConfig_t
//   blocking = 0), so their initialisation is bounded by the timeout too. Stream::synchronize()
//   has no timeout; call wait(stream) where a hang must become an error.
// - After an error the communicator is unusable (every later call throws).
#pragma once

#if SCMOE_WITH_CUDA

#include <nccl.h>

#include <cstdint>
#include <memory>
#include <string>

#include "scmoe/comm/communicator.h"

#if SCMOE_WITH_MPI
#include <mpi.h>
#endif

namespace scmoe {

class NcclCommunicator final : public Communicator {
  public:
#if SCMOE_WITH_MPI
    // Collective over `comm`: rank 0 creates the ncclUniqueId and MPI_Bcasts it; ranks and size
    // are `comm`'s. `device` is this rank's CUDA device index. `timeout_s` (seconds, > 0) bounds
    // the initialisation and every wait.
    static std::unique_ptr<NcclCommunicator> from_mpi(MPI_Comm comm, int device,
                                                      double timeout_s = comm_timeout_seconds());
#endif
    // Rendezvous through a file every rank can read (a shared filesystem across nodes): rank 0
    // writes the ncclUniqueId to `path` atomically (a temporary file, then rename) and removes it
    // once every rank has joined; the others poll for it for up to `timeout_s`. `path` must not
    // exist when the job starts (use a job-unique name): a stale id would be read.
    static std::unique_ptr<NcclCommunicator> from_file(const std::string& path, int rank, int size, int device,
                                                       double timeout_s = comm_timeout_seconds());
    // Uses `comm` (e.g. a host trainer's), which must outlive this object and is not destroyed by
    // it. `device` must be the comm's device.
    static std::unique_ptr<NcclCommunicator> borrow(ncclComm_t comm, int device,
                                                    double timeout_s = comm_timeout_seconds());

    ~NcclCommunicator() override;
    NcclCommunicator(const NcclCommunicator&) = delete;
    NcclCommunicator& operator=(const NcclCommunicator&) = delete;

    int rank() const override { return rank_; }
    int size() const override { return size_; }
    std::string name() const override;
    ncclComm_t native_comm() const { return comm_; }
    int device() const { return device_; }

    void all_to_all_v(const void* send, const std::int64_t* send_counts, void* recv, std::int64_t* recv_counts,
                      DType dtype, Stream& stream) override;
    void all_to_all_v_known(const void* send, const std::int64_t* send_counts, void* recv,
                            const std::int64_t* recv_counts, DType dtype, Stream& stream) override;
    void all_reduce_sum(void* buf, std::int64_t count, DType dtype, Stream& stream) override;
    void all_gather(const void* send, std::int64_t count_per_rank, void* recv, DType dtype, Stream& stream) override;
    void broadcast(void* buf, std::int64_t count, DType dtype, int root, Stream& stream) override;
    void barrier(Stream& stream) override;

    // Waits for `stream` like Stream::synchronize, but polls NCCL's asynchronous error and honours
    // the timeout: on an error or a timeout aborts the communicator and throws an Error naming
    // the rank. Rethrows errors of the stream's host tasks as synchronize does.
    void wait(Stream& stream);

  private:
    NcclCommunicator(ncclComm_t comm, bool owned, int device, double timeout_s);
    static std::unique_ptr<NcclCommunicator> init(const ncclUniqueId& id, int rank, int size, int device,
                                                  double timeout_s);

    struct Staging;  // device and pinned host buffers for the counts exchange and the barrier
    void check_usable(const char* op) const;
    void* native_stream(Stream& stream, const char* op) const;
    // Polls `stream` (a cudaStream_t) to completion within the timeout; see wait().
    void wait_native(void* stream, const char* op);
    // The data of an all-to-all: grouped ncclSend/ncclRecv of the host counts, packed by rank.
    void post_exchange(const void* send, const std::int64_t* send_counts, void* recv, const std::int64_t* recv_counts,
                       DType dtype, void* stream, const char* op);
    // Polls a non-blocking communicator until its last call has left ncclInProgress.
    void settle(const char* op);
    // Aborts the communicator and throws "rank r: op: what".
    [[noreturn]] void abort_and_fail(const char* op, const std::string& what);
    // Throws (after aborting when the communicator may be left mid-operation) if `result` failed.
    void check_nccl(ncclResult_t result, const char* op, const char* call);

    ncclComm_t comm_ = nullptr;
    bool owned_ = false;
    bool broken_ = false;
    std::string first_failure_;  // the failure that aborted it: later refusals name it
    int device_ = 0;
    int rank_ = 0;
    int size_ = 1;
    double timeout_s_;
    std::unique_ptr<Staging> staging_;
};

}  // namespace scmoe

#endif  // SCMOE_WITH_CUDA
