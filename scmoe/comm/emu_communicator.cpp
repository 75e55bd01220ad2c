#include "scmoe/comm/emu_communicator.h"

#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <sstream>

#include "scmoe/comm/detail/collective_util.h"
#include "scmoe/kernels/emu/cost_model.h"
#include "scmoe/kernels/emu/emu_device.h"
#include "scmoe/kernels/error.h"

namespace scmoe {

using comm_detail::CommOp;

// One call of the group (the k-th of every member): what was asked, what was staged, where the
// members' kernels meet.
struct EmuCall {
    CommOp op = CommOp::kBarrier;
    std::int64_t count = 0;
    DType dtype = DType::kF32;
    int root = 0;
    int first_member = 0;
    std::vector<std::vector<std::int64_t>> send_counts;  // all_to_all_v: per member
    std::vector<std::vector<char>> staged;               // small payloads, per member
    std::shared_ptr<emu::Rendezvous> counts_meet, data_meet;
    int rows_known = 0;  // all_to_all_v_known: members whose send counts are in
    int finished = 0;
};

struct EmuGroup::State {
    Topology topology;
    std::vector<int> ranks;
    std::mutex mu;
    std::map<std::uint64_t, EmuCall> calls;
    std::string abandoned;  // set once by EmuGroup::abandon: every call from then on fails

    int size() const { return static_cast<int>(ranks.size()); }

    // Under mu: the call `seq`, created by its first member; the others must ask for the same.
    EmuCall& call(std::uint64_t seq, int member, CommOp op, std::int64_t count, DType dtype, int root) {
        if (!abandoned.empty())
            SCMOE_COMM_FAIL("rank " << member << ": " << comm_detail::comm_op_name(op) << " (collective #" << seq
                                    << ") failed: " << abandoned);
        auto [it, created] = calls.try_emplace(seq);
        EmuCall& c = it->second;
        if (created) {
            c.op = op, c.count = count, c.dtype = dtype, c.root = root, c.first_member = member;
            c.send_counts.resize(ranks.size());
            c.staged.resize(ranks.size());
            return c;
        }
        SCMOE_CHECK(c.op == op && c.count == count && c.dtype == dtype && c.root == root,
                    "rank " << member << ": call #" << seq << " is " << comm_detail::comm_op_name(op) << " (count "
                            << count << ", " << dtype_name(dtype) << ", root " << root << ") but rank "
                            << c.first_member << " issued " << comm_detail::comm_op_name(c.op) << " (count " << c.count
                            << ", " << dtype_name(c.dtype) << ", root " << c.root << "): mismatched collectives");
        return c;
    }
    // Under mu, once every member's send counts are in: each member's time for the all-to-all's
    // data (the topology's model of the [member, peer] byte matrix).
    std::vector<double> data_durations(const EmuCall& c) const {
        const std::size_t n = ranks.size();
        const double esize = static_cast<double>(dtype_size(c.dtype));
        std::vector<double> bytes(n * n);
        for (std::size_t i = 0; i < n; ++i)
            for (std::size_t j = 0; j < n; ++j) bytes[i * n + j] = esize * static_cast<double>(c.send_counts[i][j]);
        return all_to_all_us(topology, ranks, bytes);
    }
    // Under mu: one member is done with call `seq`; the last one forgets it.
    void finish(std::uint64_t seq) {
        auto it = calls.find(seq);
        if (it != calls.end() && ++it->second.finished == size()) calls.erase(it);
    }
};

namespace {

// One NCCL channel's block (a CTA; NCCL runs one per channel): 512 threads, NCCL_NTHREADS's default
// "for recent generation GPUs" (NCCL User Guide, Environment Variables, NCCL_NTHREADS). Its registers
// per thread and shared memory are assumptions (NCCL publishes neither): 32 registers, no shared
// memory beyond the SM's per-block reservation. Beside CUTLASS's sm_90 grouped GEMM block, which
// leaves 1,024 of 65,536 registers (review 2, #6), any count above 2 registers per thread gives the
// same answer: it does not fit.
emu::BlockResources nccl_block() { return {512, 32, 0}; }

class EmuCommunicator final : public Communicator {
public:
    EmuCommunicator(std::shared_ptr<EmuGroup> group, int member) : group_(std::move(group)), member_(member) {}
    int rank() const override { return member_; }
    int size() const override { return state().size(); }
    std::string name() const override {
        return "emu(rank " + std::to_string(member_) + " of " + std::to_string(size()) + ", " +
               state().topology.name + ")";
    }
    int kernel_sms() const override { return state().topology.comm_sms; }  // 0: a link: cluster, no SM share

    void all_to_all_v(const void* send, const std::int64_t* send_counts, void* recv, std::int64_t* recv_counts,
                      DType dtype, Stream& stream) override {
        SCMOE_CHECK(send_counts && recv_counts, "rank " << member_ << ": all_to_all_v: null send_counts or recv_counts");
        emu::EmuStream& s = emu_stream(stream, "all_to_all_v");
        EmuGroup::State& st = state();
        const int n = size();
        const std::uint64_t seq = seq_;
        std::shared_ptr<emu::Rendezvous> counts_meet;
        {
            std::scoped_lock lock(st.mu);
            EmuCall& c = st.call(seq, member_, CommOp::kAllToAllV, 0, dtype, 0);
            ++seq_;
            if (!c.counts_meet) {
                const std::vector<double> eight(static_cast<std::size_t>(n) * static_cast<std::size_t>(n), 8.0);
                c.counts_meet = std::make_shared<emu::Rendezvous>(all_to_all_us(st.topology, st.ranks, eight));
            }
            counts_meet = c.counts_meet;
        }
        staging_.assign(static_cast<std::size_t>(n), 0);
        const double counts_bytes = 8.0 * n;
        // 1. The counts up to the device (read when the copy runs: earlier work may compute them).
        enqueue_copy(s, "all_to_all_v.counts_h2d", counts_bytes, [&st, seq, m = member_, send_counts, n] {
            std::scoped_lock lock(st.mu);
            st.calls.at(seq).send_counts[static_cast<std::size_t>(m)].assign(send_counts, send_counts + n);
        });
        // 2. Their exchange, 3. back to the host.
        enqueue_comm(s, "all_to_all_v.counts", counts_meet, [this, &st, seq, n] {
            std::scoped_lock lock(st.mu);
            const EmuCall& c = st.calls.at(seq);
            for (int p = 0; p < n; ++p)
                staging_[static_cast<std::size_t>(p)] =
                    c.send_counts[static_cast<std::size_t>(p)][static_cast<std::size_t>(member_)];
        });
        enqueue_copy(s, "all_to_all_v.counts_d2h", 2 * counts_bytes, {});
        // 4. The host waits for them, as NcclCommunicator does.
        stream.synchronize();
        std::int64_t total_send = 0;
        std::shared_ptr<emu::Rendezvous> data_meet;
        {
            std::scoped_lock lock(st.mu);
            EmuCall& c = st.call(seq, member_, CommOp::kAllToAllV, 0, dtype, 0);
            for (int p = 0; p < n; ++p) {
                const std::int64_t sent = c.send_counts[static_cast<std::size_t>(member_)][static_cast<std::size_t>(p)];
                SCMOE_CHECK(sent >= 0, "rank " << member_ << ": all_to_all_v: send_counts[" << p << "] = " << sent
                                               << " (negative)");
                SCMOE_CHECK(staging_[static_cast<std::size_t>(p)] >= 0,
                            "rank " << member_ << ": all_to_all_v: rank " << p << " sends "
                                    << staging_[static_cast<std::size_t>(p)] << " elements (negative)");
                total_send += sent;
            }
            if (!c.data_meet) c.data_meet = std::make_shared<emu::Rendezvous>(st.data_durations(c));
            data_meet = c.data_meet;
        }
        SCMOE_CHECK(total_send == 0 || send, "rank " << member_ << ": all_to_all_v: a null send buffer");
        std::memcpy(recv_counts, staging_.data(), static_cast<std::size_t>(n) * sizeof(std::int64_t));
        // 5. The data. Small sends (routing metadata such as a layer's expert counts) move for real:
        // staged when the stream reaches the exchange, delivered when it completes.
        const std::size_t esize = dtype_size(dtype);
        enqueue_stage(s, seq, send, static_cast<std::size_t>(total_send) * esize);
        enqueue_comm(s, "all_to_all_v", data_meet, [&st, seq, m = member_, n, recv, esize, received = staging_] {
            std::scoped_lock lock(st.mu);
            deliver(st.calls.at(seq), m, n, recv, esize, received);
            st.finish(seq);
        });
    }

    // No count exchange and no host wait, as NcclCommunicator: each member's counts are read now;
    // the exchange's duration is known once every member has issued (a deferred rendezvous), and
    // when the members meet the receive counts are checked against what the peers send.
    void all_to_all_v_known(const void* send, const std::int64_t* send_counts, void* recv,
                            const std::int64_t* recv_counts, DType dtype, Stream& stream) override {
        SCMOE_CHECK(send_counts && recv_counts,
                    "rank " << member_ << ": all_to_all_v_known: null send_counts or recv_counts");
        emu::EmuStream& s = emu_stream(stream, "all_to_all_v_known");
        EmuGroup::State& st = state();
        const int n = size();
        const std::uint64_t seq = seq_;
        std::vector<std::int64_t> expected(recv_counts, recv_counts + n);
        std::int64_t total_send = 0;
        for (int p = 0; p < n; ++p) {
            SCMOE_CHECK(send_counts[p] >= 0 && recv_counts[p] >= 0,
                        "rank " << member_ << ": all_to_all_v_known: send_counts[" << p << "] = " << send_counts[p]
                                << ", recv_counts[" << p << "] = " << recv_counts[p] << " (negative)");
            total_send += send_counts[p];
        }
        SCMOE_CHECK(total_send == 0 || send, "rank " << member_ << ": all_to_all_v_known: a null send buffer");
        std::shared_ptr<emu::Rendezvous> data_meet;
        {
            std::scoped_lock lock(st.mu);
            EmuCall& c = st.call(seq, member_, CommOp::kAllToAllVKnown, 0, dtype, 0);
            ++seq_;
            c.send_counts[static_cast<std::size_t>(member_)].assign(send_counts, send_counts + n);
            if (!c.data_meet) c.data_meet = emu::Rendezvous::deferred(n);
            if (++c.rows_known == n) c.data_meet->set_durations(st.data_durations(c));
            data_meet = c.data_meet;
        }
        const std::size_t esize = dtype_size(dtype);
        enqueue_stage(s, seq, send, static_cast<std::size_t>(total_send) * esize);
        enqueue_comm(s, "all_to_all_v_known", data_meet, [&st, seq, m = member_, n, recv, esize, expected] {
            std::scoped_lock lock(st.mu);
            EmuCall& c = st.calls.at(seq);
            std::vector<std::int64_t> sent_here(static_cast<std::size_t>(n));
            for (int p = 0; p < n; ++p)
                sent_here[static_cast<std::size_t>(p)] = c.send_counts[static_cast<std::size_t>(p)][static_cast<std::size_t>(m)];
            comm_detail::check_known_counts(m, n, expected.data(), sent_here.data());
            deliver(c, m, n, recv, esize, expected);
            st.finish(seq);
        });
    }

    void all_reduce_sum(void* buf, std::int64_t count, DType dtype, Stream& stream) override {
        const std::size_t bytes = comm_detail::checked_bytes(count, dtype, "all_reduce_sum count");
        collective(CommOp::kAllReduceSum, count, dtype, 0, stream, buf, bytes,
                   [&](const Topology& t, const std::vector<int>& r) { return all_reduce_us(t, r, double(bytes)); },
                   [buf, count, dtype, bytes](EmuCall& c) {
                       std::vector<const void*> inputs;
                       for (const auto& v : c.staged) inputs.push_back(v.data());
                       std::vector<char> out(bytes);
                       comm_detail::sum_in_rank_order(inputs.data(), static_cast<int>(inputs.size()), out.data(), count,
                                                      dtype);
                       std::memcpy(buf, out.data(), bytes);
                   });
    }

    void all_gather(const void* send, std::int64_t count_per_rank, void* recv, DType dtype, Stream& stream) override {
        const std::size_t bytes = comm_detail::checked_bytes(count_per_rank, dtype, "all_gather count");
        collective(CommOp::kAllGather, count_per_rank, dtype, 0, stream, send, bytes,
                   [&](const Topology& t, const std::vector<int>& r) { return all_gather_us(t, r, double(bytes)); },
                   [recv, bytes](EmuCall& c) {
                       for (std::size_t p = 0; p < c.staged.size(); ++p)
                           std::memcpy(static_cast<char*>(recv) + p * bytes, c.staged[p].data(), bytes);
                   });
    }

    void broadcast(void* buf, std::int64_t count, DType dtype, int root, Stream& stream) override {
        SCMOE_CHECK(root >= 0 && root < size(), "rank " << member_ << ": broadcast: root " << root << " out of range");
        const std::size_t bytes = comm_detail::checked_bytes(count, dtype, "broadcast count");
        collective(CommOp::kBroadcast, count, dtype, root, stream, buf, bytes,
                   [&](const Topology& t, const std::vector<int>& r) { return broadcast_us(t, r, double(bytes)); },
                   [buf, bytes, root](EmuCall& c) {
                       std::memcpy(buf, c.staged[static_cast<std::size_t>(root)].data(), bytes);
                   });
    }

    void barrier(Stream& stream) override {
        collective(CommOp::kBarrier, 0, DType::kF32, 0, stream, nullptr, 0,
                   [](const Topology& t, const std::vector<int>& r) { return all_reduce_us(t, r, 4.0); },
                   [](EmuCall&) {});
    }

private:
    // Under the state's lock, when an all-to-all completes: member m's receive buffer gets, from
    // each peer p, the `received[p]` elements p staged for it (payloads small enough to have been
    // staged for real; larger ones are modeled only).
    static void deliver(const EmuCall& c, int m, int n, void* recv, std::size_t esize,
                        const std::vector<std::int64_t>& received) {
        std::size_t at = 0;
        for (int p = 0; p < n; ++p) {
            const auto& from = c.staged[static_cast<std::size_t>(p)];
            const auto& counts = c.send_counts[static_cast<std::size_t>(p)];
            const std::size_t segment = static_cast<std::size_t>(received[static_cast<std::size_t>(p)]) * esize;
            if (!from.empty() && segment > 0) {
                std::size_t offset = 0;  // where p's segment for m starts in p's send buffer
                for (int q = 0; q < m; ++q) offset += static_cast<std::size_t>(counts[static_cast<std::size_t>(q)]) * esize;
                std::memcpy(static_cast<char*>(recv) + at, from.data() + offset, segment);
            }
            at += segment;
        }
    }

    const EmuGroup::State& state() const { return group_->state(); }
    EmuGroup::State& state() { return group_->state(); }

    emu::EmuStream& emu_stream(Stream& stream, const char* op) {
        SCMOE_CHECK(stream.backend() == Backend::kEmu, "rank " << member_ << ": " << op
                                                               << ": EmuCommunicator needs an emulated stream, got "
                                                               << backend_name(stream.backend()));
        return emu::as_emu(stream);
    }

    void enqueue_copy(emu::EmuStream& s, const char* name, double bytes, std::function<void()> effect) {
        const emu::GpuSpec& spec = s.device().spec();
        emu::Work w;
        w.kind = emu::WorkKind::kCopy;
        w.name = name;
        w.fixed_us = spec.kernel_gap_us;
        w.work_us = emu::host_copy_us(bytes, spec);
        w.effect = std::move(effect);
        s.device().timeline().enqueue(s.id(), std::move(w), s.device().launch_host_us());
    }

    void enqueue_comm(emu::EmuStream& s, const char* name, std::shared_ptr<emu::Rendezvous> meet,
                      std::function<void()> effect) {
        const emu::GpuSpec& spec = s.device().spec();
        emu::Work w;
        w.kind = emu::WorkKind::kComm;
        w.name = name;
        w.demand = std::min(1.0, static_cast<double>(state().topology.comm_sms) / spec.sms);
        // Residency (scmoe/kernels/emu/timeline.h): its channels' blocks, one per SM, become resident only
        // where they fit beside the kernels already there.
        w.resident_sms = std::min(state().topology.comm_sms, spec.sms);
        w.block = nccl_block();
        w.rendezvous = std::move(meet);
        w.member = member_;
        w.effect = std::move(effect);
        s.device().timeline().enqueue(s.id(), std::move(w), s.device().launch_host_us());
    }

    // Enqueues, zero-time, the staging of this member's `bytes` of `data` into call `seq` when they
    // are small enough to move for real (emu::kRealCopyBytes); returns whether they are. Staged when
    // the stream reaches it, so earlier work on the stream may still write `data`.
    bool enqueue_stage(emu::EmuStream& s, std::uint64_t seq, const void* data, std::size_t bytes) {
        const bool real = bytes > 0 && bytes <= emu::kRealCopyBytes;
        EmuGroup::State& st = state();
        emu::Work stage;
        stage.kind = emu::WorkKind::kCopy;
        stage.name = "stage";
        if (real)
            stage.effect = [&st, seq, m = member_, data, bytes] {
                std::scoped_lock lock(st.mu);
                st.calls.at(seq).staged[static_cast<std::size_t>(m)].assign(
                    static_cast<const char*>(data), static_cast<const char*>(data) + bytes);
            };
        s.device().timeline().enqueue(s.id(), std::move(stage), 0.0);
        return real;
    }

    // A collective with one duration for every member: stages this member's `bytes` of `data` (when
    // small), meets the others, then runs `finish_real` (when small) and forgets the call.
    template <class Duration, class Finish>
    void collective(CommOp op, std::int64_t count, DType dtype, int root, Stream& stream, const void* data,
                    std::size_t bytes, Duration duration, Finish finish_real) {
        emu::EmuStream& s = emu_stream(stream, comm_detail::comm_op_name(op));
        EmuGroup::State& st = state();
        const std::uint64_t seq = seq_;
        std::shared_ptr<emu::Rendezvous> meet;
        {
            std::scoped_lock lock(st.mu);
            EmuCall& c = st.call(seq, member_, op, count, dtype, root);
            ++seq_;
            if (!c.data_meet) {
                const double us = duration(st.topology, st.ranks);
                c.data_meet = std::make_shared<emu::Rendezvous>(std::vector<double>(st.ranks.size(), us));
            }
            meet = c.data_meet;
        }
        const bool real = enqueue_stage(s, seq, data, bytes);
        enqueue_comm(s, comm_detail::comm_op_name(op), meet, [&st, seq, real, finish_real] {
            std::scoped_lock lock(st.mu);
            if (real) finish_real(st.calls.at(seq));
            st.finish(seq);
        });
    }

    std::shared_ptr<EmuGroup> group_;
    int member_;
    std::uint64_t seq_ = 0;
    std::vector<std::int64_t> staging_;
};

}  // namespace

std::shared_ptr<EmuGroup> EmuGroup::create(Topology topology, std::vector<int> ranks) {
    SCMOE_CHECK(!ranks.empty(), "EmuGroup: no members");
    std::set<int> distinct(ranks.begin(), ranks.end());
    SCMOE_CHECK(distinct.size() == ranks.size(), "EmuGroup: a global rank appears twice");
    for (int r : ranks)
        SCMOE_CHECK(r >= 0 && r < topology.world_size(), "EmuGroup: rank " << r << " outside the "
                                                                           << topology.world_size() << " GPUs of "
                                                                           << topology.name);
    std::shared_ptr<EmuGroup> g(new EmuGroup());
    g->state_ = std::make_unique<State>();
    g->state_->topology = std::move(topology);
    g->state_->ranks = std::move(ranks);
    return g;
}

EmuGroup::~EmuGroup() = default;

void EmuGroup::abandon(int member, const std::string& why) {
    SCMOE_CHECK(member >= 0 && member < state_->size(),
                "EmuGroup::abandon: member " << member << " of a group of " << state_->size());
    std::vector<std::shared_ptr<emu::Rendezvous>> pending;
    std::string reason;
    {
        std::scoped_lock lock(state_->mu);
        if (!state_->abandoned.empty()) return;
        state_->abandoned = reason = "rank " + std::to_string(member) + " left the group: " + why;
        for (auto& [seq, c] : state_->calls)
            for (const auto& meet : {c.counts_meet, c.data_meet})
                if (meet) pending.push_back(meet);
    }
    // Without the group's lock: failing takes the emulator's world lock, under which the Work
    // effects take the group's (a rendezvous every member reached has resolved; fail leaves it be).
    for (const auto& meet : pending) meet->fail(reason);
}

std::unique_ptr<Communicator> EmuGroup::communicator(int member) {
    SCMOE_CHECK(member >= 0 && member < state_->size(),
                "EmuGroup: member " << member << " of a group of " << state_->size());
    return std::make_unique<EmuCommunicator>(shared_from_this(), member);
}

}  // namespace scmoe
