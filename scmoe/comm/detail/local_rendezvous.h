// LocalCommunicator internals shared by its host-buffer path (scmoe/comm/local_communicator.cpp) and its
// CUDA path (scmoe/comm/local_communicator_cuda.cpp): what a rank brings to a collective, the
// rendezvous that matches the ranks' k-th calls, and the interface of the CUDA path. Private to
// comm/.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "scmoe/comm/detail/collective_util.h"
#include "scmoe/comm/local_communicator.h"

namespace scmoe {
namespace local_detail {

// What one rank asked for in one collective. Pointers are that rank's own buffers.
struct Call {
    comm_detail::CommOp op = comm_detail::CommOp::kBarrier;
    DType dtype = DType::kF32;
    const void* send = nullptr;
    void* recv = nullptr;                     // all_reduce_sum and broadcast: the in-place buffer
    std::vector<std::int64_t> send_counts{};  // all_to_all_v: snapshot of this rank's send_counts
    std::int64_t count = 0;
    int root = 0;
    std::string invalid{};  // a bad argument this rank found; fails the operation on every rank
    std::string error{};    // a failure this rank hit before joining; fails the operation on every rank
    // CUDA streams only. Peers read this rank's buffers on their own streams once `ready` (recorded
    // on this rank's stream before it joined) has completed; `done` (recorded after this rank's own
    // reads of its peers' buffers) is what a peer waits on before it may overwrite a buffer this
    // rank reads. Both are cudaEvent_t of `device`.
    bool on_device = false;
    int device = -1;
    void* ready = nullptr;
    void* done = nullptr;
};

// The CUDA path of one rank's LocalCommunicator (defined in scmoe/comm/local_communicator_cuda.cpp).
// `seq` is the rank's sequence number of the call, shared with the host path.
class DeviceCollectives {
  public:
    virtual ~DeviceCollectives() = default;
    virtual void all_to_all_v(std::uint64_t seq, const void* send, const std::int64_t* send_counts, void* recv,
                              std::int64_t* recv_counts, DType dtype, Stream& stream) = 0;
    virtual void all_reduce_sum(std::uint64_t seq, void* buf, std::int64_t count, DType dtype, Stream& stream) = 0;
    virtual void all_gather(std::uint64_t seq, const void* send, std::int64_t count_per_rank, void* recv, DType dtype,
                            Stream& stream) = 0;
    virtual void broadcast(std::uint64_t seq, void* buf, std::int64_t count, DType dtype, int root, Stream& stream) = 0;
    virtual void barrier(std::uint64_t seq, Stream& stream) = 0;
};

// The CUDA path of rank `rank` of `group`. Throws in builds without CUDA.
std::unique_ptr<DeviceCollectives> make_device_collectives(LocalGroup& group, int rank);

// "<what> = <count> (negative)" or "" when fine.
inline std::string check_count(std::int64_t count, const std::string& what) {
    return count < 0 ? what + " = " + std::to_string(count) + " (negative)" : std::string();
}

}  // namespace local_detail

// NOTES: one Op per sequence number. A rank joins (records its Call), waits until all ranks have
// joined, runs its body (reads peers' inputs, writes its own outputs), then waits until all ranks
// are out of their bodies, so no rank frees or overwrites an input a peer still reads. The first
// failure (mismatch, bad argument, a rank's own error, timeout, a body that threw, the group
// abandoned) is stored in the Op and every rank still in it, or arriving later, raises it: no rank
// waits on a dead operation. A failure before every rank joined is raised at once (no body ran or
// will run); once all have joined, even a failed operation is left only after every rank is out of
// its body (a rank whose body threw included). The host path runs it from the stream's work; the
// CUDA path from the calling thread, where the bodies only enqueue.
struct LocalGroup::Rendezvous {
    using Call = local_detail::Call;
    struct Op {
        std::vector<Call> calls;
        std::vector<bool> joined, finished;
        int num_joined = 0, num_finished = 0;
        bool started = false;  // every rank joined and none found a failure: the bodies run
        std::string failure;
    };

    int size = 1;
    double timeout_s = 1.0;
    std::mutex mu;
    std::condition_variable cv;
    std::map<std::uint64_t, std::shared_ptr<Op>> ops;
    std::string abandoned;  // set once by abandon(): fails every operation not yet joined by all

    // Joins collective `seq` with `call`, runs `body(calls of every rank)` once all have joined and
    // agree, and returns once every rank has finished its body. Throws Error on any failure.
    void run(int rank, std::uint64_t seq, Call call, const std::function<void(const std::vector<Call>&)>& body);
    // Rank `rank` will make no further calls (its thread failed with `why`): every operation that
    // not all ranks have joined, now or later, fails on every rank with that reason.
    void abandon(int rank, const std::string& why);

  private:
    [[noreturn]] void raise(int rank, comm_detail::CommOp op, std::uint64_t seq, const std::string& failure);
    // Waits until `done()` holds or (unless `until_done`) the op failed, then raises the op's
    // failure if any; on timeout records and raises the timeout, naming the ranks for which
    // `pending(q)` still holds.
    void wait(std::unique_lock<std::mutex>& lock, Op& o, int rank, comm_detail::CommOp op, std::uint64_t seq,
              const std::function<bool()>& done, const std::function<bool(int)>& pending, bool until_done);
};

}  // namespace scmoe
