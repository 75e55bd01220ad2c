// LocalCommunicator on CUDA streams: device buffers of one GPU, ranks as host threads. The
// protocol is described in scmoe/comm/local_communicator.h; built only with CUDA.
//
// NOTES: each rank owns three events, re-recorded every collective.
//   ready  recorded before it joins: its inputs and counts are in place; peers wait on it first.
//   done   recorded after it has enqueued its reads of peers' buffers; a rank whose buffer a peer
//          reads waits on that peer's done before its later work may overwrite the buffer.
//   tail   recorded last; the next collective waits on it whatever its stream, so the pinned
//          counts and the reduction scratch are never used by two collectives at once.
// Re-recording is safe: peers wait on this rank's ready and done of collective k before they leave
// k, and this rank records them again only in k+1, which it enters after every rank has finished
// k's body and records done in only after every rank has joined k+1. cudaStreamWaitEvent captures
// the record current at the call, so a later record never changes an earlier wait.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>
#include <thread>

#include "scmoe/comm/detail/collective_util.h"
#include "scmoe/comm/detail/cuda_util.h"
#include "scmoe/comm/detail/local_reduce_cuda.h"
#include "scmoe/comm/detail/local_rendezvous.h"
#include "scmoe/kernels/error.h"

namespace scmoe::local_detail {
namespace {

using comm_detail::comm_op_name;
using comm_detail::CommOp;
using Clock = std::chrono::steady_clock;
using Prepare = std::function<void(cudaStream_t, Call&)>;
using Body = std::function<void(cudaStream_t, const std::vector<Call>&)>;
using Finish = std::function<void(cudaStream_t)>;

// "" when the GPU `device` can read and write `ptr` in stream order (device memory of `device`,
// managed or pinned host memory); else the reason, for Call::invalid. Pageable host memory is
// refused: copies from it would not be stream-ordered and kernels cannot read it.
std::string unaddressable(const void* ptr, int device, const std::string& what) {
    const cudaPointerAttributes attr = comm_detail::pointer_attributes(ptr);
    if (attr.type == cudaMemoryTypeUnregistered) return what + " in pageable host memory (not on a CUDA stream)";
    if (attr.type == cudaMemoryTypeDevice && attr.device != device)
        return what + " on cuda:" + std::to_string(attr.device) + ", not cuda:" + std::to_string(device);
    return "";
}

cudaEvent_t as_event(void* event) { return static_cast<cudaEvent_t>(event); }

Call make_call(CommOp op, DType dtype, const void* send, void* recv, std::int64_t count = 0, int root = 0) {
    Call call;
    call.op = op;
    call.dtype = dtype;
    call.send = send;
    call.recv = recv;
    call.count = count;
    call.root = root;
    return call;
}

class CudaCollectives final : public DeviceCollectives {
  public:
    CudaCollectives(LocalGroup& group, int rank)
        : rv_(group.rendezvous()), rank_(rank), size_(group.size()), timeout_s_(group.timeout_s()) {}
    ~CudaCollectives() override;
    CudaCollectives(const CudaCollectives&) = delete;
    CudaCollectives& operator=(const CudaCollectives&) = delete;

    void all_to_all_v(std::uint64_t seq, const void* send, const std::int64_t* send_counts, void* recv,
                      std::int64_t* recv_counts, DType dtype, Stream& stream) override;
    void all_reduce_sum(std::uint64_t seq, void* buf, std::int64_t count, DType dtype, Stream& stream) override;
    void all_gather(std::uint64_t seq, const void* send, std::int64_t count_per_rank, void* recv, DType dtype,
                    Stream& stream) override;
    void broadcast(std::uint64_t seq, void* buf, std::int64_t count, DType dtype, int root, Stream& stream) override;
    void barrier(std::uint64_t seq, Stream& stream) override;

  private:
    // One collective, on the calling thread with the stream's device current:
    //   prepare(s, call)  this rank's checks and work before it joins (sets call.invalid on a bad
    //                     argument; anything it throws fails the collective on every rank);
    //   body(s, calls)    once every rank has joined and agreed: enqueue this rank's reads;
    //   finish(s)         once every rank has run its body (their done events are recorded).
    void collective(std::uint64_t seq, Stream& stream, Call call, const Prepare& prepare, const Body& body,
                    const Finish& finish);
    void init(int device, CommOp op);
    void check(cudaError_t e, CommOp op, const char* call) const;
    // Polls `query` until it stops answering cudaErrorNotReady; a timeout names `what` waited for.
    void poll(const std::function<cudaError_t()>& query, CommOp op, const char* what) const;
    void wait_event(cudaStream_t s, void* event, CommOp op) const;
    // The reduction scratch, at least `bytes` (grows only; the old one is freed once unused).
    void* scratch(std::size_t bytes, CommOp op);

    LocalGroup::Rendezvous& rv_;
    int rank_, size_;
    double timeout_s_;
    int device_ = -1;
    cudaEvent_t ready_ = nullptr, done_ = nullptr, tail_ = nullptr;
    bool tail_recorded_ = false;
    std::int64_t* counts_host_ = nullptr;  // pinned [2 * size]: send counts as read, received counts
    void* scratch_ = nullptr;
    std::size_t scratch_bytes_ = 0;
};

CudaCollectives::~CudaCollectives() {
    if (device_ < 0) return;
    int previous = -1;
    if (cudaGetDevice(&previous) != cudaSuccess) previous = -1;
    cudaSetDevice(device_);
    // NOTES: errors ignored: a destructor cannot throw. The last collective's work may still use
    // the staging and the scratch, so it is waited for first.
    if (tail_recorded_) cudaEventSynchronize(tail_);
    for (cudaEvent_t e : {ready_, done_, tail_})
        if (e != nullptr) cudaEventDestroy(e);
    if (scratch_ != nullptr) cudaFree(scratch_);
    if (counts_host_ != nullptr) cudaFreeHost(counts_host_);
    if (previous >= 0) cudaSetDevice(previous);
}

void CudaCollectives::check(cudaError_t e, CommOp op, const char* call) const {
    if (e == cudaSuccess) return;
    SCMOE_FAIL("rank " << rank_ << ": " << comm_op_name(op) << ": " << call << " failed: " << cudaGetErrorName(e)
                       << ": " << cudaGetErrorString(e));
}

void CudaCollectives::init(int device, CommOp op) {
    device_ = device;  // first, so that the destructor frees what the lines below create
    check(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), op, "cudaEventCreateWithFlags");
    check(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), op, "cudaEventCreateWithFlags");
    check(cudaEventCreateWithFlags(&tail_, cudaEventDisableTiming), op, "cudaEventCreateWithFlags");
    check(cudaMallocHost(reinterpret_cast<void**>(&counts_host_),
                         2 * static_cast<std::size_t>(size_) * sizeof(std::int64_t)),
          op, "cudaMallocHost");
}

void CudaCollectives::poll(const std::function<cudaError_t()>& query, CommOp op, const char* what) const {
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(std::min(timeout_s_, 1e9)));
    while (true) {
        const cudaError_t e = query();
        if (e == cudaSuccess) return;
        if (e != cudaErrorNotReady) check(e, op, what);
        if (Clock::now() >= deadline)
            SCMOE_COMM_FAIL("rank " << rank_ << ": " << comm_op_name(op) << " timed out after "
                               << comm_detail::format_seconds(timeout_s_) << " s waiting for " << what
                               << " (SCMOE_COMM_TIMEOUT_S)");
        std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
}

void CudaCollectives::wait_event(cudaStream_t s, void* event, CommOp op) const {
    check(cudaStreamWaitEvent(s, as_event(event), 0), op, "cudaStreamWaitEvent");
}

void* CudaCollectives::scratch(std::size_t bytes, CommOp op) {
    if (bytes <= scratch_bytes_) return scratch_;
    const std::size_t grown = std::max(bytes, 2 * scratch_bytes_);
    if (scratch_ != nullptr) {
        if (tail_recorded_) poll([this] { return cudaEventQuery(tail_); }, op, "the previous collective's work");
        check(cudaFree(scratch_), op, "cudaFree(scratch)");
        scratch_ = nullptr;
        scratch_bytes_ = 0;
    }
    check(cudaMalloc(&scratch_, grown), op, "cudaMalloc(scratch)");
    scratch_bytes_ = grown;
    return scratch_;
}

void CudaCollectives::collective(std::uint64_t seq, Stream& stream, Call call, const Prepare& prepare, const Body& body,
                                 const Finish& finish) {
    const CommOp op = call.op;
    auto* s = static_cast<cudaStream_t>(stream.native_handle());
    std::optional<comm_detail::DeviceScope> scope;
    call.on_device = true;
    // NOTES: whatever fails before the rendezvous still joins it (as call.error), so that the
    // peers fail at once instead of waiting for this rank until the timeout.
    try {
        int device = -1;
        check(cudaStreamGetDevice(s, &device), op, "cudaStreamGetDevice");
        call.device = device;
        scope.emplace(device);
        if (device_ < 0) init(device, op);
        SCMOE_CHECK(device == device_, "rank " << rank_ << ": " << comm_op_name(op) << ": a stream of cuda:" << device
                                               << ", but this rank's earlier collectives ran on cuda:" << device_);
        call.ready = ready_;
        call.done = done_;
        if (tail_recorded_) wait_event(s, tail_, op);
        prepare(s, call);
        check(cudaEventRecord(ready_, s), op, "cudaEventRecord(ready)");
    } catch (const std::exception& e) {
        if (call.invalid.empty()) call.error = e.what();
    }
    rv_.run(rank_, seq, std::move(call), [&](const std::vector<Call>& calls) {
        body(s, calls);
        check(cudaEventRecord(done_, s), op, "cudaEventRecord(done)");
    });
    finish(s);
    check(cudaEventRecord(tail_, s), op, "cudaEventRecord(tail)");
    tail_recorded_ = true;
}

void CudaCollectives::all_to_all_v(std::uint64_t seq, const void* send, const std::int64_t* send_counts, void* recv,
                                   std::int64_t* recv_counts, DType dtype, Stream& stream) {
    constexpr CommOp kOp = CommOp::kAllToAllV;
    const int n = size_;
    const std::size_t counts_bytes = static_cast<std::size_t>(n) * sizeof(std::int64_t);
    const std::size_t esize = dtype_size(dtype);
    std::vector<void*> readers;  // done events of the peers that read this rank's send buffer
    Call call = make_call(kOp, dtype, send, recv);
    const auto prepare = [&](cudaStream_t s, Call& c) {
        if (send_counts == nullptr || recv_counts == nullptr) {
            c.invalid = "null send_counts or recv_counts to all_to_all_v";
            return;
        }
        const bool counts_on_device = comm_detail::is_device_pointer(send_counts);
        if (counts_on_device)
            check(cudaMemcpyAsync(counts_host_, send_counts, counts_bytes, cudaMemcpyDefault, s), kOp,
                  "cudaMemcpyAsync(send_counts)");
        // NOTES: the one host synchronization of the CUDA path: earlier work on the stream may still
        // compute the counts (MoeLayer fills them in a host task). Host-task errors surface here.
        poll([s] { return cudaStreamQuery(s); }, kOp, "its stream (the work enqueued before the call)");
        try {
            stream.synchronize();  // idle now: returns at once, rethrowing a host task's error
        } catch (const std::exception& e) {
            SCMOE_FAIL("earlier work on its stream failed: " << e.what());
        }
        if (!counts_on_device) std::memcpy(counts_host_, send_counts, counts_bytes);
        c.send_counts.assign(counts_host_, counts_host_ + n);
        std::int64_t total = 0;
        for (int p = 0; p < n && c.invalid.empty(); ++p) {
            c.invalid = check_count(counts_host_[p], "all_to_all_v send_counts[" + std::to_string(p) + "]");
            total += counts_host_[p];
        }
        if (c.invalid.empty() && total > 0 && send == nullptr) c.invalid = "a null send buffer to all_to_all_v";
        if (c.invalid.empty() && total > 0) c.invalid = unaddressable(send, device_, "an all_to_all_v send buffer");
        if (c.invalid.empty() && recv != nullptr)
            c.invalid = unaddressable(recv, device_, "an all_to_all_v recv buffer");
    };
    const auto body = [&](cudaStream_t s, const std::vector<Call>& calls) {
        const Call& mine = calls[static_cast<std::size_t>(rank_)];
        std::int64_t offset = 0;
        for (int q = 0; q < n; ++q) {
            const Call& c = calls[static_cast<std::size_t>(q)];
            std::int64_t src_offset = 0;
            for (int p = 0; p < rank_; ++p) src_offset += c.send_counts[static_cast<std::size_t>(p)];
            const std::int64_t count = c.send_counts[static_cast<std::size_t>(rank_)];
            if (count > 0) {
                SCMOE_CHECK(recv != nullptr, "all_to_all_v: null recv buffer but rank " << q << " sends " << count);
                if (q != rank_) wait_event(s, c.ready, kOp);
                check(cudaMemcpyAsync(static_cast<char*>(recv) + static_cast<std::size_t>(offset) * esize,
                                      static_cast<const char*>(c.send) + static_cast<std::size_t>(src_offset) * esize,
                                      static_cast<std::size_t>(count) * esize, cudaMemcpyDefault, s),
                      kOp, "cudaMemcpyAsync");
            }
            counts_host_[n + q] = count;
            offset += count;
            if (q != rank_ && mine.send_counts[static_cast<std::size_t>(q)] > 0) readers.push_back(c.done);
        }
    };
    const auto finish = [&](cudaStream_t s) {
        for (void* e : readers) wait_event(s, e, kOp);
        if (comm_detail::is_device_pointer(recv_counts)) {
            check(cudaMemcpyAsync(recv_counts, counts_host_ + n, counts_bytes, cudaMemcpyDefault, s), kOp,
                  "cudaMemcpyAsync(recv_counts)");
        } else {
            std::memcpy(recv_counts, counts_host_ + n, counts_bytes);  // the stream was idle at the call
        }
    };
    collective(seq, stream, std::move(call), prepare, body, finish);
}

void CudaCollectives::all_reduce_sum(std::uint64_t seq, void* buf, std::int64_t count, DType dtype, Stream& stream) {
    constexpr CommOp kOp = CommOp::kAllReduceSum;
    std::size_t bytes = 0;
    void* sum = nullptr;
    std::vector<void*> peers_done;
    Call call = make_call(kOp, dtype, nullptr, buf, count);
    const auto prepare = [&](cudaStream_t, Call& c) {
        c.invalid = check_count(count, "all_reduce_sum count");
        if (!c.invalid.empty() || count == 0) return;
        if (buf == nullptr) {
            c.invalid = "a null buffer to all_reduce_sum";
        } else if (size_ > comm_detail::kMaxDeviceSumInputs) {
            c.invalid = "all_reduce_sum on CUDA streams to a group of " + std::to_string(size_) + " ranks (at most " +
                        std::to_string(comm_detail::kMaxDeviceSumInputs) + ")";
        } else {
            c.invalid = unaddressable(buf, device_, "an all_reduce_sum buffer");
        }
        if (!c.invalid.empty()) return;
        bytes = static_cast<std::size_t>(count) * dtype_size(dtype);
        sum = scratch(bytes, kOp);
    };
    const auto body = [&](cudaStream_t s, const std::vector<Call>& calls) {
        if (bytes == 0) return;
        std::vector<const void*> inputs;
        for (int q = 0; q < size_; ++q) {
            const Call& c = calls[static_cast<std::size_t>(q)];
            inputs.push_back(c.recv);
            if (q == rank_) continue;
            wait_event(s, c.ready, kOp);
            peers_done.push_back(c.done);
        }
        comm_detail::sum_in_rank_order_cuda(inputs.data(), size_, sum, count, dtype, s);
    };
    const auto finish = [&](cudaStream_t s) {
        if (bytes == 0) return;
        // Every peer reads buf until its done: only then may the sum overwrite it.
        for (void* e : peers_done) wait_event(s, e, kOp);
        check(cudaMemcpyAsync(buf, sum, bytes, cudaMemcpyDefault, s), kOp, "cudaMemcpyAsync(sum)");
    };
    collective(seq, stream, std::move(call), prepare, body, finish);
}

void CudaCollectives::all_gather(std::uint64_t seq, const void* send, std::int64_t count_per_rank, void* recv,
                                 DType dtype, Stream& stream) {
    constexpr CommOp kOp = CommOp::kAllGather;
    const std::size_t bytes = count_per_rank > 0 ? static_cast<std::size_t>(count_per_rank) * dtype_size(dtype) : 0;
    std::vector<void*> peers_done;
    Call call = make_call(kOp, dtype, send, recv, count_per_rank);
    const auto prepare = [&](cudaStream_t, Call& c) {
        c.invalid = check_count(count_per_rank, "all_gather count_per_rank");
        if (!c.invalid.empty() || count_per_rank == 0) return;
        if (send == nullptr || recv == nullptr) {
            c.invalid = "a null buffer to all_gather";
            return;
        }
        c.invalid = unaddressable(send, device_, "an all_gather send buffer");
        if (c.invalid.empty()) c.invalid = unaddressable(recv, device_, "an all_gather recv buffer");
    };
    const auto body = [&](cudaStream_t s, const std::vector<Call>& calls) {
        if (bytes == 0) return;
        for (int q = 0; q < size_; ++q) {
            const Call& c = calls[static_cast<std::size_t>(q)];
            char* dst = static_cast<char*>(recv) + static_cast<std::size_t>(q) * bytes;
            if (q != rank_) peers_done.push_back(c.done);  // every peer reads this rank's send
            if (c.send == dst) continue;                   // in place
            if (q != rank_) wait_event(s, c.ready, kOp);
            check(cudaMemcpyAsync(dst, c.send, bytes, cudaMemcpyDefault, s), kOp, "cudaMemcpyAsync");
        }
    };
    const auto finish = [&](cudaStream_t s) {
        for (void* e : peers_done) wait_event(s, e, kOp);
    };
    collective(seq, stream, std::move(call), prepare, body, finish);
}

void CudaCollectives::broadcast(std::uint64_t seq, void* buf, std::int64_t count, DType dtype, int root,
                                Stream& stream) {
    constexpr CommOp kOp = CommOp::kBroadcast;
    const std::size_t bytes = count > 0 ? static_cast<std::size_t>(count) * dtype_size(dtype) : 0;
    std::vector<void*> peers_done;
    Call call = make_call(kOp, dtype, nullptr, buf, count, root);
    const auto prepare = [&](cudaStream_t, Call& c) {
        c.invalid = check_count(count, "broadcast count");
        if (c.invalid.empty() && (root < 0 || root >= size_))
            c.invalid = "broadcast root " + std::to_string(root) + " outside [0, " + std::to_string(size_) + ")";
        if (c.invalid.empty() && count > 0 && buf == nullptr) c.invalid = "a null buffer to broadcast";
        if (c.invalid.empty() && count > 0) c.invalid = unaddressable(buf, device_, "a broadcast buffer");
    };
    const auto body = [&](cudaStream_t s, const std::vector<Call>& calls) {
        if (bytes == 0) return;
        if (rank_ != root) {
            const Call& from = calls[static_cast<std::size_t>(root)];
            wait_event(s, from.ready, kOp);
            check(cudaMemcpyAsync(buf, from.recv, bytes, cudaMemcpyDefault, s), kOp, "cudaMemcpyAsync");
            return;
        }
        for (int q = 0; q < size_; ++q)
            if (q != rank_) peers_done.push_back(calls[static_cast<std::size_t>(q)].done);
    };
    const auto finish = [&](cudaStream_t s) {
        for (void* e : peers_done) wait_event(s, e, kOp);
    };
    collective(seq, stream, std::move(call), prepare, body, finish);
}

void CudaCollectives::barrier(std::uint64_t seq, Stream& stream) {
    constexpr CommOp kOp = CommOp::kBarrier;
    Call call = make_call(kOp, DType::kF32, nullptr, nullptr);
    const auto body = [&](cudaStream_t s, const std::vector<Call>& calls) {
        for (int q = 0; q < size_; ++q)
            if (q != rank_) wait_event(s, calls[static_cast<std::size_t>(q)].ready, kOp);
    };
    collective(
        seq, stream, std::move(call), [](cudaStream_t, Call&) {}, body, [](cudaStream_t) {});
}

}  // namespace

std::unique_ptr<DeviceCollectives> make_device_collectives(LocalGroup& group, int rank) {
    return std::make_unique<CudaCollectives>(group, rank);
}

}  // namespace scmoe::local_detail
