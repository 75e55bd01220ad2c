// The real BlockStack on emulated GPUs. The emulated timeline is deterministic; and the GPU stream
// drain of review L1 is reproduced and its fix proven: the real BlockStack and LayerScheduler on two
// emulated A800s with emulated NCCL. Issued in program order, a branch's pre + send go out before
// the backbone's next segment; dispatch's count exchange blocks the host (as NcclCommunicator's
// does) until the MoE stream has run pre and the exchange, and meanwhile the backbone has nothing
// queued: it idles. The emulated trace shows that idle time on the backbone lane; issued
// backbone-ahead, it is gone.
#include <gtest/gtest.h>

#include <algorithm>
#include <thread>

#include "scmoe/comm/emu_communicator.h"
#include "scmoe/kernels/emu/emu_device.h"
#include "scmoe/moe/block_stack.h"
#include "scmoe/moe/trace.h"

namespace scmoe {
namespace {

struct Interval {
    double start, end;
};

// The stretches of [first start, last end] of `lane` in which none of its entries runs.
std::vector<Interval> idle_stretches(const std::vector<TraceEntry>& trace, const std::string& lane) {
    std::vector<Interval> busy;
    for (const TraceEntry& e : trace)
        if (e.lane == lane) busy.push_back({e.start_us, e.start_us + e.duration_us});
    std::sort(busy.begin(), busy.end(), [](const Interval& a, const Interval& b) { return a.start < b.start; });
    std::vector<Interval> idle;
    double covered = busy.empty() ? 0 : busy.front().end;
    for (const Interval& b : busy) {
        if (b.start > covered) idle.push_back({covered, b.start});
        covered = std::max(covered, b.end);
    }
    return idle;
}

double overlap(const Interval& a, const Interval& b) { return std::max(0.0, std::min(a.end, b.end) - std::max(a.start, b.start)); }

BlockStackConfig gpt2_small_pos2() {
    BackboneShape backbone;
    backbone.hidden = 768;
    backbone.heads = 12;
    backbone.seq_len = 1024;
    backbone.ffn = 3072;
    backbone.activation = Activation::kGeLU;
    backbone.dtype = DType::kBF16;
    MoeConfig moe;
    moe.hidden = 768;
    moe.ffn = 3072;
    moe.num_experts = 8;
    moe.activation = Activation::kGeLU;
    moe.dispatch = DispatchMode::kCapacity;
    moe.capacity_factor = 2.0f;
    moe.dtype = DType::kBF16;
    return block_variant("scmoe-pos2", backbone, moe, true, 2);
}

// One traced forward of the calibrated stack on each of two emulated A800s, its ops issued in
// `order`; rank 0's trace.
std::vector<TraceEntry> traced_forward(bool overlap, IssueOrder order = IssueOrder::kBackboneAhead) {
    auto group = EmuGroup::create(cluster_topology("a800-nvlink-8"), {0, 1});
    std::vector<std::vector<TraceEntry>> traces(2);
    std::vector<std::string> errors(2);
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r)
        threads.emplace_back([&, r] {
            try {
                auto device = make_device("emu", 0, "a800");
                auto comm = group->communicator(r);
                const BlockStackConfig config = gpt2_small_pos2();
                const std::int64_t tokens = 8 * 1024, hidden = config.backbone.hidden;
                BlockStack stack(config, *device, tokens, comm.get());
                DeviceBuffer x(*device, tokens * hidden * 2), y(*device, tokens * hidden * 2);
                Tensor in(x.data(), DType::kBF16, {tokens, hidden}), out(y.data(), DType::kBF16, {tokens, hidden});
                stack.set_issue_order(order);
                stack.calibrate(in, in);  // the slots from the modeled times, as scmoe-bench and scmoe-train do
                stack.forward(in, out, overlap);  // warm-up: first-use allocations
                stack.synchronize();
                Tracer trace(*device, r);
                stack.forward(in, out, overlap, &trace);
                stack.synchronize();
                trace.collect();
                traces[static_cast<std::size_t>(r)] = trace.entries();
            } catch (const std::exception& e) {
                errors[static_cast<std::size_t>(r)] = e.what();
            }
        });
    for (auto& t : threads) t.join();
    for (int r = 0; r < 2; ++r) EXPECT_EQ(errors[static_cast<std::size_t>(r)], "") << "rank " << r;
    return traces[0];
}

double idle_within(const std::vector<Interval>& idle, const Interval& span) {
    double sum = 0;
    for (const Interval& i : idle) sum += overlap(i, span);
    return sum;
}

const TraceEntry* find(const std::vector<TraceEntry>& trace, const std::string& lane, const std::string& prefix) {
    for (const TraceEntry& e : trace)
        if (e.lane == lane && e.name.rfind(prefix, 0) == 0) return &e;
    return nullptr;
}

struct DrainFigures {
    double pre_and_send_us, idle_in_pre_and_send_us, idle_after_experts_us, idle_total_us, forward_us;
};

// The backbone's idle time in rank 0's traced forward: through the first branch's gate + dispatch,
// from the end of its experts to the end of its collect, and in all.
DrainFigures drain_figures(IssueOrder order) {
    const std::vector<TraceEntry> trace = traced_forward(true, order);
    const auto idle = idle_stretches(trace, "backbone");
    const TraceEntry* gate = find(trace, "moe", "gate[");
    const TraceEntry* dispatch = find(trace, "moe", "dispatch[");
    const TraceEntry* experts = find(trace, "backbone", "experts[");
    const TraceEntry* collect = find(trace, "moe", "collect[");
    EXPECT_TRUE(gate && dispatch && experts && collect) << "the trace lacks a branch's gate, dispatch, experts or collect";
    if (!(gate && dispatch && experts && collect)) return {};
    const Interval pre_and_send{gate->start_us, dispatch->start_us + dispatch->duration_us};
    const Interval after_experts{experts->start_us + experts->duration_us, collect->start_us + collect->duration_us};
    DrainFigures f{pre_and_send.end - pre_and_send.start, idle_within(idle, pre_and_send),
                   idle_within(idle, after_experts), 0, 0};
    for (const Interval& i : idle) f.idle_total_us += i.end - i.start;
    for (const TraceEntry& e : trace) f.forward_us = std::max(f.forward_us, e.start_us + e.duration_us);
    std::printf("issue order %s: backbone idle %.1f us of a %.1f us forward: %.1f us of the %.1f us gate + dispatch, "
                "%.1f us after the experts\n",
                issue_order_name(order), f.idle_total_us, f.forward_us, f.idle_in_pre_and_send_us, f.pre_and_send_us,
                f.idle_after_experts_us);
    return f;
}

// Review L1's drain at a branch's start, reproduced with the ops issued in program order (as scmoe
// did before the fix), overlap on: at the ready index the backbone has nothing queued while the
// MoE stream runs the gate and the dispatch, whose count exchange blocks the host: the backbone
// idles for at least that exchange. (The review's second drain, at the expert slot, came from
// collect re-exchanging its counts; collect now sends with the counts the layer holds and does not
// block, so it is gone in either order.)
TEST(EmuDrain, ProgramOrderIdlesTheBackboneThroughTheBranchStart) {
    const DrainFigures f = drain_figures(IssueOrder::kProgram);
    EXPECT_GT(f.pre_and_send_us, 0);
    // The count exchange alone is 8.4 + 3.4 us on NVLink (scmoe/comm/topology.h).
    EXPECT_GT(f.idle_in_pre_and_send_us, 8.4 + 3.4)
        << "the backbone ran through the branch's gate and dispatch: the drain at `ready` is gone";
    // 1e-3 us: the trace's times are float milliseconds, 2.4e-4 us apart at a 2 ms forward.
    EXPECT_NEAR(f.idle_after_experts_us, 0, 1e-3) << "collect blocked the host again";
}

// The fix (LayerScheduler's default IssueOrder::kBackboneAhead): the backbone's segments are
// enqueued before each blocking exchange, so the backbone computes through the gate, the dispatch
// and the collect, and the same forward ends earlier.
TEST(EmuDrain, IssuingTheBackboneAheadKeepsItBusyThroughEveryExchange) {
    const DrainFigures drained = drain_figures(IssueOrder::kProgram);
    const DrainFigures fixed = drain_figures(IssueOrder::kBackboneAhead);
    EXPECT_NEAR(fixed.idle_in_pre_and_send_us, 0, 1e-3) << "the backbone idled during the gate and dispatch";
    EXPECT_NEAR(fixed.idle_after_experts_us, 0, 1e-3) << "the backbone idled after the experts";
    EXPECT_LT(fixed.idle_total_us, drained.idle_total_us);
    EXPECT_LT(fixed.forward_us, drained.forward_us);
}

// ---- Review 2 #6: communication keeps its SMs -----------------------------------------------
//
// The chunked pipeline on the 16 emulated H100s of h100-ib-2x8 (two nodes: the all-to-alls share
// each node's InfiniBand NICs), ScMoE Pos-2 at GPT2-small shapes with 32 experts (2 per rank), 8192
// tokens per rank, 2 pieces (expert#c on the backbone stream, receive#c on the MoE stream): the
// configuration of docs/emu.md's figures. The emulated grouped GEMM
// is CUTLASS's persistent sm_90 kernel (scmoe/kernels/emu/emu_ops.cpp): on every SM, it leaves no room for
// an exchange's NCCL blocks (scmoe/kernels/emu/residency.h), so without the reservation the exchange
// pieces and the expert GEMMs wait for each other; with the LayerScheduler's R = 32 (the cluster's
// NCCL channels) the GEMMs run on 100 of 132 SMs and the exchanges beside them.

struct ReservationFigures {
    double forward_us = 0, backbone_idle_us = 0;
    double receive0_end_us = 0, expert1_end_us = 0;
    std::uint64_t sm_waits = 0;  // Work of rank 0's traced forward that waited for SMs its blocks fit
    double sm_wait_us = 0;
};

ReservationFigures chunked_forward_on_two_h100_nodes(int comm_sms) {
    constexpr int kRanks = 16;
    std::vector<int> members(kRanks);
    for (int r = 0; r < kRanks; ++r) members[static_cast<std::size_t>(r)] = r;
    auto group = EmuGroup::create(cluster_topology("h100-ib-2x8"), members);
    std::vector<std::vector<TraceEntry>> traces(kRanks);
    std::vector<emu::TimelineStats> before(kRanks), after(kRanks);
    std::vector<std::string> errors(kRanks);
    std::vector<std::thread> threads;
    for (int r = 0; r < kRanks; ++r)
        threads.emplace_back([&, r] {
            try {
                auto device = make_device("emu", 0, "h100");
                auto comm = group->communicator(r);
                BlockStackConfig config = gpt2_small_pos2();
                config.moe.num_experts = 32;
                const std::int64_t tokens = 8 * 1024, hidden = config.backbone.hidden;
                BlockStack stack(config, *device, tokens, comm.get());
                EXPECT_EQ(stack.comm_sms(), 32) << "R defaults to the emulated cluster's NCCL channels";
                if (comm_sms >= 0) stack.set_comm_sms(comm_sms);
                DeviceBuffer x(*device, tokens * hidden * 2), y(*device, tokens * hidden * 2);
                Tensor in(x.data(), DType::kBF16, {tokens, hidden}), out(y.data(), DType::kBF16, {tokens, hidden});
                stack.set_expert_chunks(2);
                stack.calibrate(in, in);
                stack.forward(in, out, true);  // warm-up: first-use allocations
                stack.synchronize();
                Tracer trace(*device, r);
                before[static_cast<std::size_t>(r)] = emu::as_emu(*device).timeline().stats();
                stack.forward(in, out, true, &trace);
                stack.synchronize();
                after[static_cast<std::size_t>(r)] = emu::as_emu(*device).timeline().stats();
                trace.collect();
                traces[static_cast<std::size_t>(r)] = trace.entries();
            } catch (const std::exception& e) {
                errors[static_cast<std::size_t>(r)] = e.what();
            }
        });
    for (auto& t : threads) t.join();
    for (int r = 0; r < kRanks; ++r) EXPECT_EQ(errors[static_cast<std::size_t>(r)], "") << "rank " << r;
    const std::vector<TraceEntry>& trace = traces[0];
    ReservationFigures f;
    for (const TraceEntry& e : trace) f.forward_us = std::max(f.forward_us, e.start_us + e.duration_us);
    f.backbone_idle_us = lane_idle_us(trace, "backbone");
    const TraceEntry* receive0 = find(trace, "moe", "collect#0[");
    const TraceEntry* expert1 = find(trace, "backbone", "experts#1[");
    EXPECT_TRUE(receive0 && expert1) << "the trace lacks the pipeline's collect#0 or experts#1";
    if (receive0 && expert1) {
        f.receive0_end_us = receive0->start_us + receive0->duration_us;
        f.expert1_end_us = expert1->start_us + expert1->duration_us;
    }
    f.sm_waits = after[0].residency_waits - before[0].residency_waits;
    f.sm_wait_us = after[0].residency_wait_us - before[0].residency_wait_us;
    EXPECT_EQ(after[0].late_starts, before[0].late_starts);
    std::printf("R = %d: forward %.1f us, backbone idle %.1f us; collect#0 ends %.1f us, experts#1 %.1f us; %llu "
                "waits for SMs (%.1f us)\n",
                comm_sms < 0 ? 32 : comm_sms, f.forward_us, f.backbone_idle_us, f.receive0_end_us, f.expert1_end_us,
                static_cast<unsigned long long>(f.sm_waits), f.sm_wait_us);
    return f;
}

// Without the reservation (R = 0) the review's finding appears on the emulated trace: the persistent
// expert GEMMs and the exchange pieces wait for each other's SMs, and receive#0 (collect#0) ends
// only after expert#1 has.
TEST(EmuCommSms, WithoutTheReservationTheChunkedPipelinesExchangesWaitForTheExpertGemm) {
    const ReservationFigures f = chunked_forward_on_two_h100_nodes(0);
    EXPECT_GT(f.sm_waits, 0u) << "no kernel waited for SMs: the persistent GEMM left room";
    EXPECT_GT(f.sm_wait_us, 0);
    EXPECT_GT(f.receive0_end_us, f.expert1_end_us) << "receive#0 did not wait for expert#1";
}

// With the default R (the cluster's 32 NCCL channels) no exchange waits for SMs: each becomes
// resident beside the expert GEMM, which runs on 100 SMs; receive#0 ends earlier and so does the
// forward, though every GEMM in the window has fewer SMs.
TEST(EmuCommSms, WithTheReservationTheExchangesRunBesideTheExpertGemm) {
    const ReservationFigures without = chunked_forward_on_two_h100_nodes(0);
    const ReservationFigures with = chunked_forward_on_two_h100_nodes(-1);
    EXPECT_EQ(with.sm_waits, 0u) << with.sm_wait_us << " us of waits for SMs";
    EXPECT_LT(with.receive0_end_us, without.receive0_end_us);
    EXPECT_LT(with.forward_us, without.forward_us);
}

// Virtual time: the same run gives the same timeline to the last bit, whatever the host's load or
// the order in which the rank threads happen to run.
// Review R1: two data-parallel replicas of a 2-rank expert-parallel group, one on A800s and one
// on A30s, so their measured op times differ. Agreed over the expert-parallel group only, the
// replicas choose different slots (different host launch orders for the world's NCCL
// operations); agreed over the world, every rank holds the same schedule.
std::vector<std::string> schedules_of_two_replicas(bool agree_over_world) {
    const Topology topo = cluster_topology("a800-nvlink-8");
    auto world = EmuGroup::create(topo, {0, 1, 2, 3});
    std::vector<std::shared_ptr<EmuGroup>> ep = {EmuGroup::create(topo, {0, 1}), EmuGroup::create(topo, {2, 3})};
    std::vector<std::string> schedules(4), errors(4);
    std::vector<std::thread> threads;
    for (int r = 0; r < 4; ++r)
        threads.emplace_back([&, r] {
            try {
                auto device = make_device("emu", 0, r < 2 ? "a800" : "a30");
                auto world_comm = world->communicator(r);
                auto ep_comm = ep[static_cast<std::size_t>(r / 2)]->communicator(r % 2);
                const BlockStackConfig config = gpt2_small_pos2();
                const std::int64_t tokens = 2 * 1024, hidden = config.backbone.hidden;
                BlockStack stack(config, *device, tokens, ep_comm.get(), agree_over_world ? world_comm.get() : nullptr);
                DeviceBuffer x(*device, tokens * hidden * 2);
                Tensor in(x.data(), DType::kBF16, {tokens, hidden});
                stack.calibrate(in, in);
                stack.synchronize();
                schedules[static_cast<std::size_t>(r)] = stack.describe_schedule();
            } catch (const std::exception& e) {
                errors[static_cast<std::size_t>(r)] = e.what();
            }
        });
    for (auto& t : threads) t.join();
    for (int r = 0; r < 4; ++r) EXPECT_EQ(errors[static_cast<std::size_t>(r)], "") << "rank " << r;
    return schedules;
}

TEST(EmuLaunchOrder, TheScheduleIsAgreedOverTheWorldNotJustTheExpertGroup) {
    const std::vector<std::string> ep_only = schedules_of_two_replicas(false);
    EXPECT_EQ(ep_only[0], ep_only[1]) << "an expert-parallel group always agrees";
    EXPECT_NE(ep_only[0], ep_only[2]) << "the replicas' times do not differ: this test cannot tell the two apart";
    const std::vector<std::string> world = schedules_of_two_replicas(true);
    for (int r = 1; r < 4; ++r) EXPECT_EQ(world[static_cast<std::size_t>(r)], world[0]) << "rank " << r;
    std::printf("agreed over the world, every rank:\n%s\n", world[0].c_str());
}

TEST(EmuBlock, TheEmulatedTimelineIsDeterministic) {
    const std::vector<TraceEntry> a = traced_forward(true), b = traced_forward(true);
    ASSERT_FALSE(a.empty());
    ASSERT_EQ(a.size(), b.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
        EXPECT_EQ(a[i].name, b[i].name);
        EXPECT_EQ(a[i].start_us, b[i].start_us) << a[i].name;
        EXPECT_EQ(a[i].duration_us, b[i].duration_us) << a[i].name;
    }
}

}  // namespace
}  // namespace scmoe
