#include "scmoe/comm/mpi_communicator.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "scmoe/comm/detail/collective_util.h"
#include "scmoe/kernels/error.h"

namespace scmoe {
namespace {

using comm_detail::comm_op_name;
using comm_detail::CommOp;
using Clock = std::chrono::steady_clock;

// Counts travel under their own tag and each operation kind under its own, so a rank that issued
// a different collective than its peer leaves messages unmatched (a timeout naming the peer)
// rather than delivering bytes to the wrong buffer.
constexpr int kCountsTag = 0x5c00;
int data_tag(CommOp op) { return 0x5c01 + static_cast<int>(op); }

std::string mpi_error_text(int code) {
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
    return std::string(text, static_cast<std::size_t>(len));
}

const char* thread_level_name(int level) {
    switch (level) {
        case MPI_THREAD_SINGLE:
            return "MPI_THREAD_SINGLE";
        case MPI_THREAD_FUNNELED:
            return "MPI_THREAD_FUNNELED";
        case MPI_THREAD_SERIALIZED:
            return "MPI_THREAD_SERIALIZED";
        case MPI_THREAD_MULTIPLE:
            return "MPI_THREAD_MULTIPLE";
        default:
            return "an unknown level";
    }
}

}  // namespace

// One round of point-to-point messages: receives are posted before sends.
struct MpiCommunicator::Exchange {
    struct Message {
        int peer;
        void* buf;
        std::size_t bytes;
        int tag;
    };
    CommOp op = CommOp::kBarrier;
    std::vector<Message> recvs{}, sends{};
};

MpiCommunicator::MpiCommunicator(MPI_Comm comm, double timeout_s) : timeout_s_(timeout_s) {
    SCMOE_CHECK(timeout_s > 0.0, "MpiCommunicator timeout " << timeout_s << " s must be positive");
    int initialized = 0;
    MPI_Initialized(&initialized);
    SCMOE_CHECK(initialized, "MpiCommunicator needs MPI initialised by the caller (MPI_Init_thread)");
    int provided = MPI_THREAD_SINGLE;
    MPI_Query_thread(&provided);
    SCMOE_CHECK(provided >= MPI_THREAD_SERIALIZED,
                "MpiCommunicator needs MPI_THREAD_SERIALIZED or MPI_THREAD_MULTIPLE (stream worker threads "
                "issue the MPI calls) but MPI was initialised with "
                    << thread_level_name(provided) << "; use MPI_Init_thread");
    int rc = MPI_Comm_dup(comm, &comm_);
    SCMOE_CHECK(rc == MPI_SUCCESS, "MPI_Comm_dup failed: " << mpi_error_text(rc));
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    // Failure messages name MPI_COMM_WORLD's ranks: what mpirun and the trainer's lines say.
    world_of_.resize(static_cast<std::size_t>(size_));
    std::vector<int> ranks(static_cast<std::size_t>(size_));
    for (int p = 0; p < size_; ++p) ranks[static_cast<std::size_t>(p)] = p;
    MPI_Group group = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
    MPI_Comm_group(comm_, &group);
    MPI_Comm_group(MPI_COMM_WORLD, &world);
    MPI_Group_translate_ranks(group, size_, ranks.data(), world, world_of_.data());
    MPI_Group_free(&group);
    MPI_Group_free(&world);
}

MpiCommunicator::~MpiCommunicator() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

std::string MpiCommunicator::name() const {
    return "mpi(rank " + std::to_string(rank_) + " of " + std::to_string(size_) + ")";
}

void MpiCommunicator::check_usable(const char* op) const {
    if (!broken_.load()) return;
    std::string first;
    {
        std::lock_guard<std::mutex> lock(failure_mutex_);
        first = first_failure_;
    }
    SCMOE_COMM_FAIL("rank " << world_rank(rank_) << ": " << op
                            << " on an MPI communicator that failed earlier (messages may still be in flight), first "
                               "in: "
                            << first);
}

void MpiCommunicator::fail(const std::string& message) {
    {
        std::lock_guard<std::mutex> lock(failure_mutex_);
        if (first_failure_.empty()) first_failure_ = message;
    }
    broken_ = true;
    SCMOE_COMM_FAIL(message);
}

void MpiCommunicator::complete(Exchange& ex) {
    struct Pending {
        MPI_Request request = MPI_REQUEST_NULL;
        int peer = 0;
        bool is_recv = false;
        bool done = false;
        int bytes = 0;
    };
    std::vector<Pending> pending;
    pending.reserve(ex.recvs.size() + ex.sends.size());
    // Abandons what is still in flight: receives are cancelled so they never write into buffers
    // the caller may free; the communicator is marked unusable.
    auto abandon = [&] {
        broken_ = true;
        for (Pending& p : pending) {
            if (p.done || p.request == MPI_REQUEST_NULL) continue;
            if (p.is_recv) MPI_Cancel(&p.request);
            MPI_Request_free(&p.request);
        }
    };
    auto post = [&](const Exchange::Message& m, bool is_recv) {
        SCMOE_CHECK(m.bytes <= static_cast<std::size_t>(INT_MAX),
                    "rank " << rank_ << ": " << comm_op_name(ex.op) << " message of " << m.bytes << " bytes to rank "
                            << m.peer << " exceeds INT_MAX bytes");
        const int bytes = static_cast<int>(m.bytes);
        Pending p{.peer = m.peer, .is_recv = is_recv, .bytes = bytes};
        int rc = is_recv ? MPI_Irecv(m.buf, bytes, MPI_BYTE, m.peer, m.tag, comm_, &p.request)
                         : MPI_Isend(m.buf, bytes, MPI_BYTE, m.peer, m.tag, comm_, &p.request);
        if (rc != MPI_SUCCESS) {
            abandon();
            fail("rank " + std::to_string(world_rank(rank_)) + ": " + comm_op_name(ex.op) + ": " +
                 (is_recv ? "MPI_Irecv from" : "MPI_Isend to") + " rank " + std::to_string(world_rank(m.peer)) +
                 " failed: " + mpi_error_text(rc));
        }
        pending.push_back(p);
    };
    for (const auto& m : ex.recvs) post(m, true);
    for (const auto& m : ex.sends) post(m, false);

    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(std::min(timeout_s_, 1e9)));
    std::size_t remaining = pending.size();
    int idle_polls = 0;
    while (remaining > 0) {
        bool progressed = false;
        for (Pending& p : pending) {
            if (p.done) continue;
            int flag = 0;
            MPI_Status status{};
            const int rc = MPI_Test(&p.request, &flag, p.is_recv ? &status : MPI_STATUS_IGNORE);
            if (rc != MPI_SUCCESS) {
                abandon();
                fail("rank " + std::to_string(world_rank(rank_)) + ": " + comm_op_name(ex.op) + ": message " +
                     (p.is_recv ? "from" : "to") + " rank " + std::to_string(world_rank(p.peer)) +
                     " failed: " + mpi_error_text(rc) +
                     (rc == MPI_ERR_TRUNCATE ? " (the peer sent more than this rank expected: the ranks made "
                                               "different calls; do their configurations differ?)"
                                             : ""));
            }
            if (flag) {
                p.done = true;
                --remaining;
                progressed = true;
                // MPI completes a receive of a shorter message without an error: a peer that made a
                // different call (another count or dtype) would leave the rest of the buffer as it
                // was, summed or copied as if it were data.
                int got = p.bytes;
                if (p.is_recv && MPI_Get_count(&status, MPI_BYTE, &got) == MPI_SUCCESS && got != p.bytes) {
                    abandon();
                    fail("rank " + std::to_string(world_rank(rank_)) + ": " + comm_op_name(ex.op) + ": rank " +
                         std::to_string(world_rank(p.peer)) + " sent " + std::to_string(got) +
                         " bytes, this rank expected " + std::to_string(p.bytes) +
                         " (the ranks made different calls: do their configurations differ?)");
                }
            }
        }
        if (remaining == 0) break;
        if (Clock::now() > deadline) {
            // Name every peer we still wait to hear from; failing that, those still to take our data.
            std::vector<int> peers;
            for (bool recvs : {true, false}) {
                for (const Pending& p : pending)
                    if (!p.done && p.is_recv == recvs) peers.push_back(world_rank(p.peer));
                if (!peers.empty()) break;
            }
            std::sort(peers.begin(), peers.end());
            peers.erase(std::unique(peers.begin(), peers.end()), peers.end());
            abandon();
            fail(comm_detail::timeout_message(world_rank(rank_), ex.op, timeout_s_, peers));
        }
        // Spin briefly for latency, then back off so ranks oversubscribing cores still progress.
        if (progressed) {
            idle_polls = 0;
        } else if (++idle_polls < 100) {
            std::this_thread::yield();
        } else {
            std::this_thread::sleep_for(std::chrono::microseconds(50));
        }
    }
}

void MpiCommunicator::all_to_all_v(const void* send, const std::int64_t* send_counts, void* recv,
                                   std::int64_t* recv_counts, DType dtype, Stream& stream) {
    host_all_to_all_v(send, send_counts, recv, recv_counts, nullptr, dtype, stream);
}

// The counts still travel (one int64 per peer, inside the stream's work, which never blocks the
// issuing thread here): they check the receive counts before any data is posted.
void MpiCommunicator::all_to_all_v_known(const void* send, const std::int64_t* send_counts, void* recv,
                                         const std::int64_t* recv_counts, DType dtype, Stream& stream) {
    SCMOE_CHECK(recv_counts != nullptr, "rank " << rank_ << ": all_to_all_v_known: null recv_counts");
    host_all_to_all_v(send, send_counts, recv, nullptr, recv_counts, dtype, stream);
}

void MpiCommunicator::host_all_to_all_v(const void* send, const std::int64_t* send_counts, void* recv,
                                        std::int64_t* recv_counts, const std::int64_t* expected, DType dtype,
                                        Stream& stream) {
    stream.host_task([=, this] {
        constexpr CommOp kOp = CommOp::kAllToAllV;
        check_usable(comm_op_name(kOp));
        SCMOE_CHECK(send_counts != nullptr && (recv_counts != nullptr || expected != nullptr),
                    "rank " << rank_ << ": all_to_all_v: null send_counts or recv_counts");
        const auto n = static_cast<std::size_t>(size_);
        const auto me = static_cast<std::size_t>(rank_);
        // Counts first: recv_counts[p] = what p sends to this rank.
        std::vector<std::int64_t> counts_out(send_counts, send_counts + n);
        std::int64_t total_send = 0;
        for (std::size_t p = 0; p < n; ++p) {
            SCMOE_CHECK(counts_out[p] >= 0, "rank " << rank_ << ": all_to_all_v send_counts[" << p
                                                    << "] = " << counts_out[p] << " is negative");
            total_send += counts_out[p];
        }
        SCMOE_CHECK(total_send == 0 || send != nullptr, "rank " << rank_ << ": all_to_all_v: null send buffer");
        std::vector<std::int64_t> counts_in(n, 0);
        Exchange counts{.op = kOp};
        for (std::size_t p = 0; p < n; ++p) {
            if (p == me) continue;
            counts.recvs.push_back({static_cast<int>(p), &counts_in[p], sizeof(std::int64_t), kCountsTag});
            counts.sends.push_back({static_cast<int>(p), &counts_out[p], sizeof(std::int64_t), kCountsTag});
        }
        counts_in[me] = counts_out[me];
        complete(counts);
        // all_to_all_v_known: a receive count that differs from what the peer sends fails this rank,
        // after the data exchange (received aside, so nothing lands in `recv`), so the peers complete.
        std::exception_ptr mismatch;
        if (expected != nullptr) {
            try {
                comm_detail::check_known_counts(rank_, size_, expected, counts_in.data());
            } catch (const Error&) {
                mismatch = std::current_exception();
            }
        }

        const std::size_t esize = dtype_size(dtype);
        std::vector<char> aside;  // a mismatched receive lands here (negative counts fail below)
        if (mismatch) {
            std::size_t all_in = 0;
            for (std::int64_t c : counts_in) all_in += static_cast<std::size_t>(std::max<std::int64_t>(c, 0)) * esize;
            aside.resize(all_in + 1);
        }
        Exchange data{.op = kOp};
        std::size_t send_offset = 0, recv_offset = 0;
        for (std::size_t p = 0; p < n; ++p) {
            SCMOE_CHECK(counts_in[p] >= 0, "rank " << rank_ << ": all_to_all_v: rank " << p << " announced "
                                                   << counts_in[p] << " elements");
            const std::size_t out_bytes = static_cast<std::size_t>(counts_out[p]) * esize;
            const std::size_t in_bytes = static_cast<std::size_t>(counts_in[p]) * esize;
            SCMOE_CHECK(in_bytes == 0 || recv != nullptr, "rank " << rank_
                                                                  << ": all_to_all_v: null recv buffer but rank " << p
                                                                  << " sends " << counts_in[p]);
            char* in = (mismatch ? aside.data() : static_cast<char*>(recv)) + recv_offset;
            auto* out = const_cast<char*>(static_cast<const char*>(send)) + send_offset;  // MPI takes void*
            if (p == me) {
                if (in_bytes > 0) std::memcpy(in, out, in_bytes);
            } else {
                if (in_bytes > 0) data.recvs.push_back({static_cast<int>(p), in, in_bytes, data_tag(kOp)});
                if (out_bytes > 0) data.sends.push_back({static_cast<int>(p), out, out_bytes, data_tag(kOp)});
            }
            send_offset += out_bytes;
            recv_offset += in_bytes;
        }
        complete(data);
        if (mismatch) std::rethrow_exception(mismatch);
        if (recv_counts != nullptr) std::copy(counts_in.begin(), counts_in.end(), recv_counts);
    });
}

void MpiCommunicator::all_gather(const void* send, std::int64_t count_per_rank, void* recv, DType dtype,
                                 Stream& stream) {
    stream.host_task([=, this] {
        constexpr CommOp kOp = CommOp::kAllGather;
        check_usable(comm_op_name(kOp));
        const std::size_t bytes = comm_detail::checked_bytes(count_per_rank, dtype, "all_gather count_per_rank");
        if (bytes == 0) return;
        SCMOE_CHECK(send != nullptr && recv != nullptr, "rank " << rank_ << ": all_gather: null buffer");
        Exchange ex{.op = kOp};
        for (int p = 0; p < size_; ++p) {
            char* dst = static_cast<char*>(recv) + static_cast<std::size_t>(p) * bytes;
            if (p == rank_) {
                if (dst != send) std::memmove(dst, send, bytes);
                continue;
            }
            ex.recvs.push_back({p, dst, bytes, data_tag(kOp)});
            ex.sends.push_back({p, const_cast<void*>(send), bytes, data_tag(kOp)});
        }
        complete(ex);
    });
}

void MpiCommunicator::all_reduce_sum(void* buf, std::int64_t count, DType dtype, Stream& stream) {
    stream.host_task([=, this] {
        constexpr CommOp kOp = CommOp::kAllReduceSum;
        check_usable(comm_op_name(kOp));
        const std::size_t bytes = comm_detail::checked_bytes(count, dtype, "all_reduce_sum count");
        if (bytes == 0) return;
        SCMOE_CHECK(buf != nullptr, "rank " << rank_ << ": all_reduce_sum: null buffer");
        // Gather every contribution, then add them in rank order: MPI_Allreduce's order is up to the
        // implementation, this one gives bit-identical sums on every rank and every run.
        std::vector<unsigned char> all(bytes * static_cast<std::size_t>(size_));
        Exchange ex{.op = kOp};
        std::vector<const void*> inputs;
        for (int p = 0; p < size_; ++p) {
            unsigned char* slot = all.data() + static_cast<std::size_t>(p) * bytes;
            inputs.push_back(p == rank_ ? buf : slot);
            if (p == rank_) continue;
            ex.recvs.push_back({p, slot, bytes, data_tag(kOp)});
            ex.sends.push_back({p, buf, bytes, data_tag(kOp)});
        }
        complete(ex);
        // The own slot of `all` is unused: the sum goes there, then back into buf.
        unsigned char* sum = all.data() + static_cast<std::size_t>(rank_) * bytes;
        comm_detail::sum_in_rank_order(inputs.data(), size_, sum, count, dtype);
        std::memcpy(buf, sum, bytes);
    });
}

void MpiCommunicator::broadcast(void* buf, std::int64_t count, DType dtype, int root, Stream& stream) {
    stream.host_task([=, this] {
        constexpr CommOp kOp = CommOp::kBroadcast;
        check_usable(comm_op_name(kOp));
        SCMOE_CHECK(root >= 0 && root < size_,
                    "rank " << rank_ << ": broadcast root " << root << " outside [0, " << size_ << ")");
        const std::size_t bytes = comm_detail::checked_bytes(count, dtype, "broadcast count");
        if (bytes == 0 || size_ == 1) return;
        SCMOE_CHECK(buf != nullptr, "rank " << rank_ << ": broadcast: null buffer");
        Exchange ex{.op = kOp};
        if (rank_ == root) {
            for (int p = 0; p < size_; ++p)
                if (p != root) ex.sends.push_back({p, buf, bytes, data_tag(kOp)});
        } else {
            ex.recvs.push_back({root, buf, bytes, data_tag(kOp)});
        }
        complete(ex);
    });
}

void MpiCommunicator::barrier(Stream& stream) {
    stream.host_task([this] {
        constexpr CommOp kOp = CommOp::kBarrier;
        check_usable(comm_op_name(kOp));
        // Zero-byte messages to and from every peer: nobody leaves before everyone has arrived.
        std::vector<char> tokens(static_cast<std::size_t>(size_) * 2);
        Exchange ex{.op = kOp};
        for (int p = 0; p < size_; ++p) {
            if (p == rank_) continue;
            ex.recvs.push_back({p, &tokens[static_cast<std::size_t>(p)], 0, data_tag(kOp)});
            ex.sends.push_back({p, &tokens[static_cast<std::size_t>(size_ + p)], 0, data_tag(kOp)});
        }
        complete(ex);
    });
}

}  // namespace scmoe
