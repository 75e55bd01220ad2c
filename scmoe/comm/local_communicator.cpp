#include "scmoe/comm/local_communicator.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <sstream>

#include "scmoe/comm/detail/collective_util.h"
#include "scmoe/comm/detail/local_rendezvous.h"
#include "scmoe/kernels/error.h"

namespace scmoe {
namespace {

using comm_detail::comm_op_name;
using comm_detail::CommOp;
using local_detail::Call;
using local_detail::check_count;
using Clock = std::chrono::steady_clock;

std::string describe(const Call& c) {
    std::ostringstream os;
    os << comm_op_name(c.op) << "(";
    switch (c.op) {
        case CommOp::kAllToAllV:
        case CommOp::kAllToAllVKnown:
            os << dtype_name(c.dtype);
            break;
        case CommOp::kAllReduceSum:
        case CommOp::kAllGather:
            os << "count=" << c.count << ", " << dtype_name(c.dtype);
            break;
        case CommOp::kBroadcast:
            os << "count=" << c.count << ", " << dtype_name(c.dtype) << ", root=" << c.root;
            break;
        case CommOp::kBarrier:
            break;
    }
    if (c.on_device) os << (c.op == CommOp::kBarrier ? "" : ", ") << "cuda:" << c.device;
    os << ")";
    return os.str();
}

bool compatible(const Call& a, const Call& b) {
    if (a.op != b.op || a.on_device != b.on_device || a.device != b.device) return false;
    switch (a.op) {
        case CommOp::kAllToAllV:
        case CommOp::kAllToAllVKnown:
            return a.dtype == b.dtype;
        case CommOp::kAllReduceSum:
        case CommOp::kAllGather:
            return a.dtype == b.dtype && a.count == b.count;
        case CommOp::kBroadcast:
            return a.dtype == b.dtype && a.count == b.count && a.root == b.root;
        case CommOp::kBarrier:
            return true;
    }
    return false;
}

Clock::duration to_duration(double seconds) {
    // Clamped so that now() + timeout cannot overflow for absurdly large settings.
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(std::min(seconds, 1e9)));
}

}  // namespace

void LocalGroup::Rendezvous::raise(int rank, CommOp op, std::uint64_t seq, const std::string& failure) {
    SCMOE_COMM_FAIL("rank " << rank << ": " << comm_op_name(op) << " (collective #" << seq << ") failed: " << failure);
}

void LocalGroup::Rendezvous::wait(std::unique_lock<std::mutex>& lock, Op& o, int rank, CommOp op, std::uint64_t seq,
                                  const std::function<bool()>& done, const std::function<bool(int)>& pending,
                                  bool until_done) {
    const auto deadline = Clock::now() + to_duration(timeout_s);
    while ((until_done || o.failure.empty()) && !done()) {
        if (cv.wait_until(lock, deadline) != std::cv_status::timeout) continue;
        if ((!until_done && !o.failure.empty()) || done()) break;
        std::vector<int> peers;
        for (int peer = 0; peer < size; ++peer)
            if (pending(peer)) peers.push_back(peer);
        const std::string message = comm_detail::timeout_message(rank, op, timeout_s, peers);
        if (o.failure.empty()) o.failure = message;
        cv.notify_all();
        SCMOE_COMM_FAIL(message);
    }
    if (!o.failure.empty()) raise(rank, op, seq, o.failure);
}

void LocalGroup::Rendezvous::abandon(int rank, const std::string& why) {
    std::scoped_lock lock(mu);
    if (!abandoned.empty()) return;
    abandoned = "rank " + std::to_string(rank) + " left the group: " + why;
    // Operations every rank has joined run to the end (their bodies only copy); the others can
    // never complete.
    for (auto& [seq, op] : ops)
        if (!op->started && op->failure.empty()) op->failure = abandoned;
    cv.notify_all();
}

void LocalGroup::Rendezvous::run(int rank, std::uint64_t seq, Call call,
                                 const std::function<void(const std::vector<Call>&)>& body) {
    const CommOp kind = call.op;
    std::shared_ptr<Op> op;
    {
        std::unique_lock lock(mu);
        auto& slot = ops[seq];
        if (!slot) {
            slot = std::make_shared<Op>();
            slot->calls.resize(static_cast<std::size_t>(size));
            slot->joined.assign(static_cast<std::size_t>(size), false);
            slot->finished.assign(static_cast<std::size_t>(size), false);
        }
        op = slot;
        Op& o = *op;
        const auto r = static_cast<std::size_t>(rank);
        if (o.failure.empty()) {
            if (!abandoned.empty()) {
                o.failure = abandoned;
            } else if (!call.invalid.empty()) {
                o.failure = "rank " + std::to_string(rank) + " passed " + call.invalid;
            } else if (!call.error.empty()) {
                o.failure = "rank " + std::to_string(rank) + ": " + call.error;
            } else {
                for (std::size_t q = 0; q < o.calls.size(); ++q) {
                    if (q == r || !o.joined[q]) continue;
                    if (!compatible(o.calls[q], call)) {
                        o.failure = "mismatched collectives: rank " + std::to_string(q) + " issued " +
                                    describe(o.calls[q]) + ", rank " + std::to_string(rank) + " issued " +
                                    describe(call);
                    }
                    break;
                }
            }
        }
        o.calls[r] = std::move(call);
        o.joined[r] = true;
        if (++o.num_joined == size && o.failure.empty()) o.started = true;
        cv.notify_all();
        try {
            wait(
                lock, o, rank, kind, seq, [&] { return o.started; },
                [&](int q) { return !o.joined[static_cast<std::size_t>(q)]; }, false);
        } catch (const CommError&) {
            // Failed before it started: no rank ran, or will run, a body. A failure after (a peer's
            // body threw) still needs the barrier below before this rank leaves.
            if (!o.started) throw;
        }
    }
    // Every rank has joined, agreeing; calls no longer change, so the body reads them unlocked. A
    // rank leaves only once every rank is out of its body, even when the operation failed: a peer's
    // body may still be reading this rank's buffers, which it frees or overwrites once it returns.
    std::string body_error;
    bool run_body;
    {
        std::scoped_lock lock(mu);
        run_body = op->failure.empty();
    }
    if (run_body) {
        try {
            body(op->calls);
        } catch (const std::exception& e) {
            body_error = e.what();
        }
    }
    std::unique_lock lock(mu);
    Op& o = *op;
    if (!body_error.empty() && o.failure.empty()) o.failure = "rank " + std::to_string(rank) + ": " + body_error;
    o.finished[static_cast<std::size_t>(rank)] = true;
    if (++o.num_finished == size) ops.erase(seq);
    cv.notify_all();
    wait(
        lock, o, rank, kind, seq, [&] { return o.num_finished == size; },
        [&](int q) { return !o.finished[static_cast<std::size_t>(q)]; }, true);
}

LocalGroup::LocalGroup(int size, double timeout_s)
    : size_(size),
      timeout_s_(timeout_s),
      rendezvous_(std::make_unique<Rendezvous>()),
      rank_taken_(static_cast<std::size_t>(size), false) {
    rendezvous_->size = size;
    rendezvous_->timeout_s = timeout_s;
}

LocalGroup::~LocalGroup() = default;

void LocalGroup::abandon(int rank, const std::string& why) {
    SCMOE_CHECK(rank >= 0 && rank < size_,
                "LocalGroup::abandon: rank " << rank << " is outside the group of " << size_);
    rendezvous_->abandon(rank, why);
}

std::shared_ptr<LocalGroup> LocalGroup::create(int size, double timeout_s) {
    SCMOE_CHECK(size >= 1, "LocalGroup size " << size << " must be at least 1");
    SCMOE_CHECK(timeout_s > 0.0, "LocalGroup timeout " << timeout_s << " s must be positive");
    return std::shared_ptr<LocalGroup>(new LocalGroup(size, timeout_s));
}

std::unique_ptr<Communicator> LocalGroup::communicator(int rank) {
    SCMOE_CHECK(rank >= 0 && rank < size_, "rank " << rank << " is outside the local group of " << size_);
    {
        std::scoped_lock lock(mu_);
        SCMOE_CHECK(!rank_taken_[static_cast<std::size_t>(rank)],
                    "the communicator of local rank " << rank << " was already created");
        rank_taken_[static_cast<std::size_t>(rank)] = true;
    }
    return std::make_unique<LocalCommunicator>(shared_from_this(), rank);
}

LocalCommunicator::LocalCommunicator(std::shared_ptr<LocalGroup> group, int rank)
    : group_(std::move(group)), rank_(rank) {}

LocalCommunicator::~LocalCommunicator() = default;

local_detail::DeviceCollectives& LocalCommunicator::device_path() {
    if (!device_) device_ = local_detail::make_device_collectives(*group_, rank_);
    return *device_;
}

#if !SCMOE_WITH_CUDA
std::unique_ptr<local_detail::DeviceCollectives> local_detail::make_device_collectives(LocalGroup&, int rank) {
    SCMOE_FAIL("rank " << rank << ": LocalCommunicator got a CUDA stream in a build without CUDA");
}
#endif

std::string LocalCommunicator::name() const {
    return "local(rank " + std::to_string(rank_) + " of " + std::to_string(size()) + ")";
}

void LocalCommunicator::all_to_all_v(const void* send, const std::int64_t* send_counts, void* recv,
                                     std::int64_t* recv_counts, DType dtype, Stream& stream) {
    if (stream.backend() == Backend::kCuda)
        return device_path().all_to_all_v(next_seq_++, send, send_counts, recv, recv_counts, dtype, stream);
    host_all_to_all_v(send, send_counts, recv, recv_counts, nullptr, dtype, stream);
}

void LocalCommunicator::all_to_all_v_known(const void* send, const std::int64_t* send_counts, void* recv,
                                           const std::int64_t* recv_counts, DType dtype, Stream& stream) {
    SCMOE_CHECK(recv_counts != nullptr, "rank " << rank_ << ": all_to_all_v_known: null recv_counts");
    if (stream.backend() == Backend::kCuda) {
        // The CUDA path exchanges the counts (and synchronizes) as all_to_all_v does; checked after.
        std::vector<std::int64_t> received(static_cast<std::size_t>(size()));
        device_path().all_to_all_v(next_seq_++, send, send_counts, recv, received.data(), dtype, stream);
        comm_detail::check_known_counts(rank_, size(), recv_counts, received.data());
        return;
    }
    host_all_to_all_v(send, send_counts, recv, nullptr, recv_counts, dtype, stream);
}

void LocalCommunicator::host_all_to_all_v(const void* send, const std::int64_t* send_counts, void* recv,
                                          std::int64_t* recv_counts, const std::int64_t* expected, DType dtype,
                                          Stream& stream) {
    const std::uint64_t seq = next_seq_++;
    const int rank = rank_;
    const int n = size();
    LocalGroup::Rendezvous& rv = group_->rendezvous();
    stream.host_task([=, &rv] {
        Call call{.op = CommOp::kAllToAllV, .dtype = dtype, .send = send, .recv = recv};
        if (send_counts == nullptr || (recv_counts == nullptr && expected == nullptr)) {
            call.invalid = "null send_counts or recv_counts to all_to_all_v";
        } else {
            call.send_counts.assign(send_counts, send_counts + n);
            std::int64_t total = 0;
            for (int p = 0; p < n && call.invalid.empty(); ++p) {
                call.invalid = check_count(send_counts[p], "all_to_all_v send_counts[" + std::to_string(p) + "]");
                total += send_counts[p];
            }
            if (call.invalid.empty() && total > 0 && send == nullptr)
                call.invalid = "a null send buffer to all_to_all_v";
        }
        rv.run(rank, seq, std::move(call), [&](const std::vector<Call>& calls) {
            const std::size_t esize = dtype_size(dtype);
            if (expected != nullptr) {
                std::vector<std::int64_t> sent_here(static_cast<std::size_t>(n));
                for (int s = 0; s < n; ++s)
                    sent_here[static_cast<std::size_t>(s)] =
                        calls[static_cast<std::size_t>(s)].send_counts[static_cast<std::size_t>(rank)];
                comm_detail::check_known_counts(rank, n, expected, sent_here.data());
            }
            std::int64_t offset = 0;
            for (int s = 0; s < n; ++s) {
                const Call& c = calls[static_cast<std::size_t>(s)];
                std::int64_t src_offset = 0;
                for (int p = 0; p < rank; ++p) src_offset += c.send_counts[static_cast<std::size_t>(p)];
                const std::int64_t count = c.send_counts[static_cast<std::size_t>(rank)];
                if (count > 0) {
                    SCMOE_CHECK(recv != nullptr, "all_to_all_v: null recv buffer but rank " << s << " sends " << count);
                    std::memcpy(static_cast<char*>(recv) + static_cast<std::size_t>(offset) * esize,
                                static_cast<const char*>(c.send) + static_cast<std::size_t>(src_offset) * esize,
                                static_cast<std::size_t>(count) * esize);
                }
                if (recv_counts != nullptr) recv_counts[s] = count;
                offset += count;
            }
        });
    });
}

void LocalCommunicator::all_reduce_sum(void* buf, std::int64_t count, DType dtype, Stream& stream) {
    const std::uint64_t seq = next_seq_++;
    if (stream.backend() == Backend::kCuda) return device_path().all_reduce_sum(seq, buf, count, dtype, stream);
    const int rank = rank_;
    LocalGroup::Rendezvous& rv = group_->rendezvous();
    stream.host_task([=, &rv] {
        Call call{.op = CommOp::kAllReduceSum, .dtype = dtype, .recv = buf, .count = count};
        call.invalid = check_count(count, "all_reduce_sum count");
        if (call.invalid.empty() && count > 0 && buf == nullptr) call.invalid = "a null buffer to all_reduce_sum";
        // Peers read `buf` until everyone has finished, so the sum is built aside and stored after.
        std::vector<unsigned char> sum(count > 0 ? static_cast<std::size_t>(count) * dtype_size(dtype) : 0);
        rv.run(rank, seq, std::move(call), [&](const std::vector<Call>& calls) {
            std::vector<const void*> inputs;
            for (const Call& c : calls) inputs.push_back(c.recv);
            if (count > 0)
                comm_detail::sum_in_rank_order(inputs.data(), static_cast<int>(inputs.size()), sum.data(), count,
                                               dtype);
        });
        if (!sum.empty()) std::memcpy(buf, sum.data(), sum.size());
    });
}

void LocalCommunicator::all_gather(const void* send, std::int64_t count_per_rank, void* recv, DType dtype,
                                   Stream& stream) {
    const std::uint64_t seq = next_seq_++;
    if (stream.backend() == Backend::kCuda)
        return device_path().all_gather(seq, send, count_per_rank, recv, dtype, stream);
    const int rank = rank_;
    LocalGroup::Rendezvous& rv = group_->rendezvous();
    stream.host_task([=, &rv] {
        Call call{.op = CommOp::kAllGather, .dtype = dtype, .send = send, .recv = recv, .count = count_per_rank};
        call.invalid = check_count(count_per_rank, "all_gather count_per_rank");
        if (call.invalid.empty() && count_per_rank > 0 && (send == nullptr || recv == nullptr))
            call.invalid = "a null buffer to all_gather";
        rv.run(rank, seq, std::move(call), [&](const std::vector<Call>& calls) {
            const std::size_t bytes = static_cast<std::size_t>(count_per_rank) * dtype_size(dtype);
            for (std::size_t s = 0; s < calls.size(); ++s) {
                char* dst = static_cast<char*>(recv) + s * bytes;
                if (bytes > 0 && calls[s].send != dst) std::memcpy(dst, calls[s].send, bytes);
            }
        });
    });
}

void LocalCommunicator::broadcast(void* buf, std::int64_t count, DType dtype, int root, Stream& stream) {
    const std::uint64_t seq = next_seq_++;
    if (stream.backend() == Backend::kCuda) return device_path().broadcast(seq, buf, count, dtype, root, stream);
    const int rank = rank_;
    const int n = size();
    LocalGroup::Rendezvous& rv = group_->rendezvous();
    stream.host_task([=, &rv] {
        Call call{.op = CommOp::kBroadcast, .dtype = dtype, .recv = buf, .count = count, .root = root};
        call.invalid = check_count(count, "broadcast count");
        if (call.invalid.empty() && (root < 0 || root >= n))
            call.invalid = "broadcast root " + std::to_string(root) + " outside [0, " + std::to_string(n) + ")";
        if (call.invalid.empty() && count > 0 && buf == nullptr) call.invalid = "a null buffer to broadcast";
        rv.run(rank, seq, std::move(call), [&](const std::vector<Call>& calls) {
            if (rank != root && count > 0)
                std::memcpy(buf, calls[static_cast<std::size_t>(root)].recv,
                            static_cast<std::size_t>(count) * dtype_size(dtype));
        });
    });
}

void LocalCommunicator::barrier(Stream& stream) {
    const std::uint64_t seq = next_seq_++;
    if (stream.backend() == Backend::kCuda) return device_path().barrier(seq, stream);
    const int rank = rank_;
    LocalGroup::Rendezvous& rv = group_->rendezvous();
    stream.host_task([=, &rv] { rv.run(rank, seq, Call{.op = CommOp::kBarrier}, [](const std::vector<Call>&) {}); });
}

}  // namespace scmoe
