// LocalCommunicator: N ranks as threads of one process, for tests without mpirun and for many
// expert-parallel ranks in one process: with host buffers on CPU streams, or with device buffers
// on CUDA streams (every rank on the same GPU).
//
//   auto group = LocalGroup::create(4);               // once, shared by the rank threads
//   std::unique_ptr<Communicator> comm = group->communicator(rank);   // once per rank
//
// Each rank normally drives its communicator from its own thread and its own Stream. The
// collectives rendezvous per operation sequence number (a rank's k-th call meets every other
// rank's k-th call) and copy directly between the ranks' buffers: each rank reads its peers'
// inputs and writes only its own outputs. All ranks must issue the same operation with
// compatible sizes at each step; a mismatch raises an Error on every rank (naming the ranks and
// what each issued) instead of hanging. A rank that does not arrive within the timeout makes
// the ranks waiting for it fail, naming it.
//
// The stream passed to a call picks the path; every rank of one collective must use the same kind
// (a mix is a mismatch).
// - CPU streams: host buffers. The rendezvous and the copies run as a Stream::host_task, so one
//   thread may enqueue for several ranks; errors are raised from the stream's work.
// - CUDA streams: device buffers (memory the GPU can address: device, managed or pinned host)
//   of one GPU, the device of every rank's stream. Host callbacks cannot call CUDA, so the ranks
//   rendezvous on the host when they *enqueue* the call: a call returns only once every rank has
//   enqueued its matching call, so each rank needs its own host thread (any current device).
//   Then each rank's stream waits on its peers' "ready" events and pulls their data with
//   cudaMemcpyAsync; all_reduce_sum is one kernel summing in rank order in fp32 into a scratch
//   buffer, copied back once the peers are done reading (at most 128 ranks; bit-identical to the
//   host path). Before its later work may overwrite a buffer a peer reads, a stream waits on that
//   peer's "done" event. Nothing waits on the host, except:
//     all_to_all_v synchronizes the calling rank's stream first, once per call (like
//     NcclCommunicator): the host needs the counts, which earlier work on the stream may still
//     compute. It returns after the work enqueued before it has finished; recv_counts are filled
//     in when it returns (host or device memory; send_counts may be either too).
//     all_to_all_v_known does the same on CUDA streams (the counts still travel, and are checked
//     against the ones given when the call returns); on host streams it checks them inside the
//     stream's work before copying anything.
//   Errors are thrown by the call itself, on every rank of the collective (a rank's own error,
//   e.g. from a host task of its stream surfacing at that synchronization, fails the others too).
//   Consecutive collectives of one communicator are ordered among themselves even when they are
//   issued on different streams; the communicator's pinned staging and scratch rely on it.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "scmoe/comm/communicator.h"

namespace scmoe {

class LocalCommunicator;
namespace local_detail {
class DeviceCollectives;
}

class LocalGroup : public std::enable_shared_from_this<LocalGroup> {
  public:
    // A group of `size` ranks (>= 1). `timeout_s` bounds every wait (seconds, > 0); by default
    // SCMOE_COMM_TIMEOUT_S (300).
    static std::shared_ptr<LocalGroup> create(int size, double timeout_s = comm_timeout_seconds());
    ~LocalGroup();
    LocalGroup(const LocalGroup&) = delete;
    LocalGroup& operator=(const LocalGroup&) = delete;

    int size() const { return size_; }
    double timeout_s() const { return timeout_s_; }

    // The communicator of `rank` in [0, size). Each rank's communicator can be created once; it
    // keeps the group alive.
    std::unique_ptr<Communicator> communicator(int rank);

    // Rank `rank` of this group will make no further calls: its thread failed with `why` (e.g. a
    // host-side error mid-step while its peers' streams are inside collectives). Every collective
    // that not all ranks have joined fails at once on every rank, naming `rank` and `why`, instead
    // of waiting out the timeout; collectives every rank has joined still complete. The first call
    // wins; later ones do nothing.
    void abandon(int rank, const std::string& why);

    // The rendezvous state (scmoe/comm/local_communicator.cpp).
    struct Rendezvous;
    Rendezvous& rendezvous() { return *rendezvous_; }

  private:
    LocalGroup(int size, double timeout_s);

    int size_;
    double timeout_s_;
    std::unique_ptr<Rendezvous> rendezvous_;
    std::mutex mu_;
    std::vector<bool> rank_taken_;
};

class LocalCommunicator final : public Communicator {
  public:
    LocalCommunicator(std::shared_ptr<LocalGroup> group, int rank);
    ~LocalCommunicator() override;
    LocalCommunicator(const LocalCommunicator&) = delete;
    LocalCommunicator& operator=(const LocalCommunicator&) = delete;

    int rank() const override { return rank_; }
    int size() const override { return group_->size(); }
    std::string name() const override;
    // Host tasks on CPU streams; on CUDA streams the exchanges are cudaMemcpyAsync (copy engines).
    int kernel_sms() const override { return 0; }

    void all_to_all_v(const void* send, const std::int64_t* send_counts, void* recv, std::int64_t* recv_counts,
                      DType dtype, Stream& stream) override;
    void all_to_all_v_known(const void* send, const std::int64_t* send_counts, void* recv,
                            const std::int64_t* recv_counts, DType dtype, Stream& stream) override;
    void all_reduce_sum(void* buf, std::int64_t count, DType dtype, Stream& stream) override;
    void all_gather(const void* send, std::int64_t count_per_rank, void* recv, DType dtype, Stream& stream) override;
    void broadcast(void* buf, std::int64_t count, DType dtype, int root, Stream& stream) override;
    void barrier(Stream& stream) override;

  private:
    // The CUDA path, created at the first call on a CUDA stream.
    local_detail::DeviceCollectives& device_path();
    // all_to_all_v on host streams; `expected` (all_to_all_v_known's receive counts, or null) is
    // checked against what the peers send before anything is copied.
    void host_all_to_all_v(const void* send, const std::int64_t* send_counts, void* recv, std::int64_t* recv_counts,
                           const std::int64_t* expected, DType dtype, Stream& stream);

    std::shared_ptr<LocalGroup> group_;
    int rank_;
    std::atomic<std::uint64_t> next_seq_{0};
    std::unique_ptr<local_detail::DeviceCollectives> device_;
};

}  // namespace scmoe
