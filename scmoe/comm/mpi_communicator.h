// MpiCommunicator: host-buffer collectives across processes and nodes over MPI (CPU backend).
// Built only when scmoe is built with MPI (SCMOE_WITH_MPI=1); otherwise this header is empty.
//
// The collectives run on the Stream's worker thread, not the caller's, so MPI must have been
// initialised by the caller with MPI_Init_thread at MPI_THREAD_SERIALIZED or better (the
// constructor checks and throws otherwise). With MPI_THREAD_SERIALIZED the caller must not make
// MPI calls of its own while communicator work is pending on a stream (synchronize first);
// MPI_THREAD_MULTIPLE has no such restriction.
//
// Non-blocking point-to-point messages completed by MPI_Test polling, so every wait honours the
// timeout (SCMOE_COMM_TIMEOUT_S, see scmoe/comm/communicator.h) and a dead or stuck peer gives a
// CommError naming it rather than a hang. Errors from MPI itself are returned (MPI_ERRORS_RETURN
// on the duplicated communicator) and raised as CommError. Failure messages name ranks of
// MPI_COMM_WORLD, also on a sub-communicator (an expert-parallel group): the ranks mpirun and
// scmoe-train's lines name. The first failure is kept: a later call names it when it refuses to
// run. Each message is limited to INT_MAX bytes.
#pragma once

#if SCMOE_WITH_MPI

#include <mpi.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "scmoe/comm/communicator.h"

namespace scmoe {

class MpiCommunicator final : public Communicator {
  public:
    // Duplicates `comm` (collective over `comm`: every rank constructs at the same time). The
    // duplicate is freed by the destructor, which must run before MPI_Finalize and after the
    // streams used with this communicator have been synchronized. `timeout_s` bounds every wait
    // (seconds, > 0); by default SCMOE_COMM_TIMEOUT_S (300).
    explicit MpiCommunicator(MPI_Comm comm, double timeout_s = comm_timeout_seconds());
    ~MpiCommunicator() override;
    MpiCommunicator(const MpiCommunicator&) = delete;
    MpiCommunicator& operator=(const MpiCommunicator&) = delete;

    int rank() const override { return rank_; }
    int size() const override { return size_; }
    std::string name() const override;
    int kernel_sms() const override { return 0; }  // host buffers, MPI on the host
    MPI_Comm native_comm() const { return comm_; }

    void all_to_all_v(const void* send, const std::int64_t* send_counts, void* recv, std::int64_t* recv_counts,
                      DType dtype, Stream& stream) override;
    void all_to_all_v_known(const void* send, const std::int64_t* send_counts, void* recv,
                            const std::int64_t* recv_counts, DType dtype, Stream& stream) override;
    void all_reduce_sum(void* buf, std::int64_t count, DType dtype, Stream& stream) override;
    void all_gather(const void* send, std::int64_t count_per_rank, void* recv, DType dtype, Stream& stream) override;
    void broadcast(void* buf, std::int64_t count, DType dtype, int root, Stream& stream) override;
    void barrier(Stream& stream) override;

  private:
    // all_to_all_v as a stream host task; `expected` (all_to_all_v_known's receive counts, or null)
    // is checked against the exchanged counts before the data is posted.
    void host_all_to_all_v(const void* send, const std::int64_t* send_counts, void* recv, std::int64_t* recv_counts,
                           const std::int64_t* expected, DType dtype, Stream& stream);
    struct Exchange;
    // Posts the receives and sends of `ex` and polls them to completion within the timeout.
    void complete(Exchange& ex);
    // MPI_COMM_WORLD's rank of this communicator's rank `p`: failure messages name those.
    int world_rank(int p) const { return world_of_[static_cast<std::size_t>(p)]; }
    // Throws a CommError naming the first failure if an earlier operation failed.
    void check_usable(const char* op) const;
    // Marks the communicator unusable, remembers the first failure, throws CommError(message).
    [[noreturn]] void fail(const std::string& message);

    MPI_Comm comm_ = MPI_COMM_NULL;
    int rank_ = 0;
    int size_ = 1;
    double timeout_s_;
    // Set once an operation failed part-way: messages may still be in flight, so later calls
    // refuse to run rather than match them up wrongly.
    std::atomic<bool> broken_{false};
    std::vector<int> world_of_;  // [size_] MPI_COMM_WORLD's rank of each rank
    mutable std::mutex failure_mutex_;
    std::string first_failure_;  // the first failure's message: later refusals name it
};

}  // namespace scmoe

#endif  // SCMOE_WITH_MPI
