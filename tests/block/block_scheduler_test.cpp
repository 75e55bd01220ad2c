// LayerScheduler and BlockStack: the slot rule (Eq. 11) on hand-made times; which ops the schedule
// runs side by side, proven by rendezvous (no timing); overlap on and off bitwise identical for
// every variant (default and calibrated slots, one rank and in-process expert-parallel ranks); the
// distributed stack equal to the single-rank stack; errors inside an overlapped branch surface
// without a hang; the trace shows both streams.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <fstream>
#include <future>
#include <limits>
#include <sstream>
#include <thread>

#include "block_test_util.h"
#include "local_ranks.h"
#include "scmoe/comm/local_communicator.h"
#include "scmoe/kernels/nvtx.h"
#include "scmoe/moe/trace.h"
#include "rendezvous_util.h"

namespace scmoe {
namespace {

using testing::StackResult;

TEST(LayerScheduler, SlotMinimisesEquation11) {
    SchedulePlan plan;
    plan.name = "forward";
    plan.segments.resize(5);
    BranchPlan b;
    b.name = "moe";
    b.ready = 1;
    b.join = 5;
    plan.branches.push_back(b);
    Schedule s;
    s.segment_ms = {9, 2, 3, 4, 1};  // segments 1..4 lie in the window: 2, 3, 4, 1
    Schedule::Branch t;
    t.pre_ms = 1;
    t.send_ms = 4;  // dispatch side 5 ms: before K = 3 gives 2 + 3 = 5
    t.receive_ms = 4;
    t.post_ms = 1;  // combine side 5 ms: after K = 3 gives 4 + 1 = 5
    s.branches.push_back(t);
    choose_slots(plan, s);
    EXPECT_EQ(s.branches[0].slot, 3);
    EXPECT_DOUBLE_EQ(s.branches[0].before_ms, 5);
    EXPECT_DOUBLE_EQ(s.branches[0].after_ms, 5);
    // A long dispatch and nothing to do after the experts push the slot to the end of the window.
    s.branches[0].send_ms = 40;
    s.branches[0].receive_ms = s.branches[0].post_ms = 0;
    choose_slots(plan, s);
    EXPECT_EQ(s.branches[0].slot, 5);
    // No window at all: ready == join.
    plan.branches[0].ready = plan.branches[0].join = 2;
    choose_slots(plan, s);
    EXPECT_EQ(s.branches[0].slot, 2);
    // Bad indices are rejected.
    plan.branches[0].join = 6;
    EXPECT_THROW(choose_slots(plan, s), Error);
}

// ---- what runs side by side, proven by rendezvous ----
//
// Plans shaped like the BlockStack's Pos-2 pair, with the expert slot inside the window, so both
// halves of it hold backbone work. Every op is empty except the two a case names, which meet at a
// Rendezvous (tests/rendezvous_util.h): the pass completes exactly when the schedule lets those two
// run at the same time, and fails naming them when it orders one after the other, whatever the
// machine's speed or load.

struct PassShape {
    std::string name;
    std::vector<std::string> segments;
    int ready, slot, join;
    std::string send, expert, receive;  // the branch's op names
};

void PrintTo(const PassShape& p, std::ostream* os) { *os << p.name; }

const PassShape kForwardShape{.name = "forward",
                              .segments = {"attn0", "mlp0", "attn1", "norm_x1", "shared1"},
                              .ready = 1,
                              .slot = 3,
                              .join = 5,
                              .send = "dispatch",
                              .expert = "experts",
                              .receive = "collect"};
const PassShape kBackwardShape{.name = "backward",
                               .segments = {"shared_bwd1", "norm_x_bwd1", "attn_bwd1", "mlp_bwd0", "attn_bwd0"},
                               .ready = 0,
                               .slot = 2,
                               .join = 4,
                               .send = "collect_bwd",
                               .expert = "experts_bwd",
                               .receive = "dispatch_bwd"};

// Long where a case must meet (only a schedule that serializes the pair waits this long); short
// where it must not (the wait ends in the error however fast the machine).
constexpr double kMeetTimeoutS = 60.0;
constexpr double kSerializedTimeoutS = 1.0;

// One pass of `shape` in `chunks` pieces where the ops named a and b (a branch op as the trace
// names it, "dispatch[moe1]", a chunk piece "dispatch#1[moe1]", a segment "mlp0") meet; returns the
// first error of the two streams, "" when the pass completed (and then a and b met).
std::string meet_in_pass(const PassShape& shape, int chunks, bool overlap, const std::string& a, const std::string& b,
                         double timeout_s) {
    testing::Rendezvous rendezvous(a, b, timeout_s);
    auto op = [&](const std::string& name) {
        return [&rendezvous, a, b, name](Stream& s) {
            if (name == a) rendezvous.arrive_on(s, testing::Rendezvous::kFirst);
            if (name == b) rendezvous.arrive_on(s, testing::Rendezvous::kSecond);
        };
    };
    auto piece = [&](const std::string& stage) {
        return [op, stage](int c, int, Stream& s) { op(stage + "#" + std::to_string(c) + "[moe1]")(s); };
    };
    SchedulePlan plan;
    plan.name = shape.name;
    for (const std::string& name : shape.segments) plan.segments.push_back({name, op(name)});
    BranchPlan branch;
    branch.name = "moe1";
    branch.ready = shape.ready;
    branch.join = shape.join;
    branch.send = {shape.send, op(shape.send + "[moe1]"), true};
    branch.expert = {shape.expert, op(shape.expert + "[moe1]")};
    branch.receive = {shape.receive, op(shape.receive + "[moe1]"), true};
    branch.max_chunks = 2;
    branch.send_chunks = {shape.send, piece(shape.send), true};
    branch.expert_chunks = {shape.expert, piece(shape.expert)};
    branch.receive_chunks = {shape.receive, piece(shape.receive), true};
    plan.branches.push_back(branch);
    Schedule schedule;
    schedule.segment_ms.assign(shape.segments.size(), 0.0);
    schedule.branches.resize(1);
    schedule.branches[0].slot = shape.slot;
    schedule.branches[0].chunks = chunks;

    // A stream's worker may still hold the error when synchronize() returns. Keeping it here until
    // the workers are joined makes this thread the one that frees it: ThreadSanitizer does not see
    // libstdc++'s atomic reference count and would report a worker's free against our read.
    std::exception_ptr failure;
    std::string error;
    {
        auto device = make_device("cpu");
        auto backbone = device->create_stream(), moe = device->create_stream();
        LayerScheduler scheduler(*device, *backbone, *moe);
        scheduler.run(plan, schedule, overlap);
        for (Stream* s : {moe.get(), backbone.get()}) {
            try {
                s->synchronize();
            } catch (const Error& e) {
                if (!failure) {
                    failure = std::current_exception();
                    error = e.what();
                }
            }
        }
    }
    if (error.empty() && !rendezvous.met()) error = "completed without " + a + " and " + b + " meeting";
    return error;
}

struct MeetCase {
    int chunks;
    bool overlap;
    std::string a, b;
};

// Runs the cases at once (each on its own streams); returns their errors in order.
std::vector<std::string> meet_cases(const PassShape& shape, const std::vector<MeetCase>& cases, double timeout_s) {
    std::vector<std::future<std::string>> runs;
    for (const MeetCase& c : cases)
        runs.push_back(std::async(std::launch::async, [&shape, c, timeout_s] {
            return meet_in_pass(shape, c.chunks, c.overlap, c.a, c.b, timeout_s);
        }));
    std::vector<std::string> errors;
    for (auto& r : runs) errors.push_back(r.get());
    return errors;
}

class SchedulerRendezvous : public ::testing::TestWithParam<PassShape> {};

// The send side: the first all-to-all runs while every backbone segment in [ready, slot) runs;
// the receive side: the second while every segment in [slot, join) runs. Chunked (Tutel-style):
// expert piece 0 runs while send piece 1 does, expert piece 1 while receive piece 0 does.
TEST_P(SchedulerRendezvous, OverlappedExchangesMeetTheBackboneOpsOfTheirWindow) {
    const PassShape& p = GetParam();
    const std::string send = p.send + "[moe1]", receive = p.receive + "[moe1]";
    std::vector<MeetCase> cases;
    for (int j = p.ready; j < p.slot; ++j) cases.push_back({1, true, send, p.segments[static_cast<std::size_t>(j)]});
    for (int j = p.slot; j < p.join; ++j) cases.push_back({1, true, receive, p.segments[static_cast<std::size_t>(j)]});
    cases.push_back({2, true, p.send + "#1[moe1]", p.expert + "#0[moe1]"});
    cases.push_back({2, true, p.receive + "#0[moe1]", p.expert + "#1[moe1]"});
    const std::vector<std::string> errors = meet_cases(p, cases, kMeetTimeoutS);
    for (std::size_t i = 0; i < cases.size(); ++i)
        EXPECT_EQ(errors[i], "") << p.name << ": " << cases[i].a << " with " << cases[i].b << ", " << cases[i].chunks
                                 << " chunk(s)";
}

// The same pairs with overlap off (one stream) cannot meet; nor can, with overlap on, pairs the
// schedule orders: the send and the segment at the slot (the expert FFN waits for the send), the
// receive and the segment before the slot (the receive waits for the expert FFN).
TEST_P(SchedulerRendezvous, OrderedPairsFailNamingBothOps) {
    const PassShape& p = GetParam();
    const std::string send = p.send + "[moe1]", receive = p.receive + "[moe1]";
    const std::string& at_ready = p.segments[static_cast<std::size_t>(p.ready)];
    const std::string& at_slot = p.segments[static_cast<std::size_t>(p.slot)];
    const std::string& before_slot = p.segments[static_cast<std::size_t>(p.slot - 1)];
    const std::vector<MeetCase> cases = {{1, false, send, at_ready},
                                         {1, false, receive, at_slot},
                                         {2, false, p.send + "#1[moe1]", p.expert + "#0[moe1]"},
                                         {1, true, send, at_slot},
                                         {1, true, receive, before_slot}};
    const std::vector<std::string> errors = meet_cases(p, cases, kSerializedTimeoutS);
    for (std::size_t i = 0; i < cases.size(); ++i) {
        const std::string& e = errors[i];
        const std::string what = p.name + ": " + cases[i].a + " with " + cases[i].b +
                                 (cases[i].overlap ? ", overlap on" : ", overlap off") + ": " + e;
        EXPECT_NE(e.find("the schedule serialized them"), std::string::npos) << what;
        EXPECT_NE(e.find(cases[i].a), std::string::npos) << what;
        EXPECT_NE(e.find(cases[i].b), std::string::npos) << what;
        std::printf("%s\n", what.c_str());
    }
}

INSTANTIATE_TEST_SUITE_P(Passes, SchedulerRendezvous, ::testing::Values(kForwardShape, kBackwardShape),
                         [](const ::testing::TestParamInfo<PassShape>& p) { return p.param.name; });

class BlockOverlap : public ::testing::TestWithParam<std::string> {};

TEST_P(BlockOverlap, OnAndOffAreBitwiseIdentical) {
    auto device = make_device("cpu");
    const BlockStackConfig config = testing::small_variant(GetParam());
    const std::int64_t T = 12, H = config.backbone.hidden;
    const auto x = testing::make_input(T, H, 21), gy = testing::make_input(T, H, 22);
    // Every run on a stack of its own (and, in run_stack, on NaN-filled outputs and gradients): an
    // op the overlapped schedule skipped cannot inherit the reference's results (issue 28).
    auto fresh_stack = [&] {
        auto stack = std::make_unique<BlockStack>(config, *device, T);
        testing::init_params(*stack, 5);
        return stack;
    };
    const StackResult off = testing::run_stack(*fresh_stack(), x, gy, false);
    ASSERT_EQ(testing::unwritten(off), "") << "the reference (overlap off)";
    const StackResult on = testing::run_stack(*fresh_stack(), x, gy, true);
    EXPECT_EQ(testing::bitwise_diff(on, off), "");
    // With calibrated slots (the expert FFN elsewhere in the window), still the same bits; and again
    // on the same stack, run after run.
    auto calibrated_stack = fresh_stack();
    const StackResult calibrated = testing::run_stack(*calibrated_stack, x, gy, true, true);
    EXPECT_EQ(testing::bitwise_diff(calibrated, off), "");
    for (int repeat = 0; repeat < 3; ++repeat)
        EXPECT_EQ(testing::bitwise_diff(testing::run_stack(*calibrated_stack, x, gy, true), off), "")
            << "repeat " << repeat;
}

INSTANTIATE_TEST_SUITE_P(Cpu, BlockOverlap, ::testing::ValuesIn(block_variant_names()),
                         [](const ::testing::TestParamInfo<std::string>& p) { return testing::gtest_name(p.param); });

std::string compare_rel(const std::vector<float>& a, const std::vector<float>& b, double tol, const std::string& what) {
    return testing::compare(a.data(), b.data(), static_cast<std::int64_t>(std::min(a.size(), b.size())), tol, what) +
           (a.size() == b.size() ? "" : what + ": sizes differ");
}

class BlockRanks : public ::testing::TestWithParam<std::string> {};

// Two expert-parallel ranks: overlap on/off bitwise, calibrated slots agree across ranks, and each
// rank's results equal the single-rank stack on its tokens (experts' gradients summed over ranks).
TEST_P(BlockRanks, DistributedEqualsSingleRankAndOverlapIsBitwise) {
    const int ep = 2;
    const BlockStackConfig config = testing::small_variant(GetParam(), DispatchMode::kDropless);
    const std::int64_t T = 8, H = config.backbone.hidden;
    std::vector<StackResult> refs;
    for (int r = 0; r < ep; ++r) {
        auto device = make_device("cpu");
        BlockStack single(config, *device, T);
        testing::init_params(single, 9);
        refs.push_back(testing::run_stack(single, testing::make_input(T, H, 30 + static_cast<std::uint64_t>(r)),
                                          testing::make_input(T, H, 40 + static_cast<std::uint64_t>(r)), false));
        ASSERT_EQ(testing::unwritten(refs.back()), "") << "single-rank reference " << r;
    }
    std::vector<std::string> schedules(ep);
    const auto errors = testing::on_local_ranks(ep, [&](int r, Communicator* comm) {
        auto device = make_device("cpu");
        // Overlap off and on each on a stack of its own (issue 28: nothing the overlapped run skips
        // can come from the other run's buffers or gradients).
        BlockStack off_stack(config, *device, T, comm), stack(config, *device, T, comm);
        testing::init_params(off_stack, 9, ep, r);
        testing::init_params(stack, 9, ep, r);
        const auto x = testing::make_input(T, H, 30 + static_cast<std::uint64_t>(r));
        const auto gy = testing::make_input(T, H, 40 + static_cast<std::uint64_t>(r));
        const StackResult off = testing::run_stack(off_stack, x, gy, false);
        std::string diff = testing::unwritten(off);
        SCMOE_CHECK(diff.empty(), "overlap off: " << diff);
        const StackResult on = testing::run_stack(stack, x, gy, true, true);
        diff = testing::bitwise_diff(on, off);
        SCMOE_CHECK(diff.empty(), "overlap on vs off: " << diff);
        std::ostringstream slots;
        for (const auto& b : stack.forward_schedule().branches) slots << b.slot << " ";
        for (const auto& b : stack.backward_schedule().branches) slots << b.slot << " ";
        schedules[static_cast<std::size_t>(r)] = slots.str();
        const StackResult& ref = refs[static_cast<std::size_t>(r)];
        std::string e = compare_rel(on.out, ref.out, 1e-5, "output");
        if (e.empty()) e = compare_rel(on.grad_in, ref.grad_in, 1e-5, "grad_input");
        if (e.empty()) e = compare_rel(on.backbone_grads, ref.backbone_grads, 1e-5, "backbone grads");
        for (std::size_t m = 0; e.empty() && m < on.moe_grads.size(); ++m) {
            // Experts: the sum over the ranks that feed them; router and shared expert: this rank's own.
            e = testing::compare_ep_grads(config.moe, ep, r, on.moe_grads[m].data(),
                                          {refs[0].moe_grads[m].data(), refs[1].moe_grads[m].data()},
                                          ref.moe_grads[m].data(), 1e-5, "moe grad ");
        }
        SCMOE_CHECK(e.empty(), e);
    });
    for (const std::string& e : errors) EXPECT_EQ(e, "");
    EXPECT_EQ(schedules[0], schedules[1]) << "ranks chose different slots";
}

INSTANTIATE_TEST_SUITE_P(Cpu, BlockRanks,
                         ::testing::Values("top2", "top1", "top3", "shared", "scmoe-pos1", "scmoe-pos2", "scmoe-pos3",
                                           "scmoe2", "every-block-pos1", "every-block-top2", "every-block-shared"),
                         [](const ::testing::TestParamInfo<std::string>& p) { return testing::gtest_name(p.param); });

TEST(BlockStackErrors, NanInputFailsCleanlyWithOverlap) {
    auto device = make_device("cpu");
    const BlockStackConfig config = testing::small_variant("scmoe-pos3");
    const std::int64_t T = 8, H = config.backbone.hidden;
    BlockStack stack(config, *device, T);
    testing::init_params(stack, 5);
    auto x = testing::make_input(T, H, 1);
    x[5] = std::numeric_limits<float>::quiet_NaN();  // Pos-3: the shortcut is the input itself
    std::vector<float> out(x.size());
    stack.forward(testing::host_tensor(x, T, H), testing::host_tensor(out, T, H), true);
    try {
        stack.synchronize();
        FAIL() << "a NaN input went through";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("NaN/Inf"), std::string::npos) << e.what();
    }
    // The stack stays usable.
    x[5] = 0.5f;
    stack.forward(testing::host_tensor(x, T, H), testing::host_tensor(out, T, H), true);
    EXPECT_NO_THROW(stack.synchronize());
}

// MoE layers share a scratch when their branch windows share no block (moe_scratch_groups): MoE
// every other block, or Pos-1 or current-representation MoE in every block, one group; Pos-3 MoE in adjacent blocks, whose
// windows [b-1, b] overlap, alternate between two. (The overlap and multi-rank tests above run the
// shared scratch; TSan runs them in CI.)
TEST(BlockStackScratch, GroupsHaveDisjointBranchWindows) {
    auto groups = [](const char* variant) { return moe_scratch_groups(testing::small_variant(variant).blocks); };
    for (const char* v : {"top2", "top3", "scmoe-pos1", "scmoe-pos2", "scmoe-pos3", "every-block-pos1", "every-block-top2",
                          "every-block-shared"}) {
        const std::vector<int> g = groups(v);
        EXPECT_FALSE(g.empty()) << v;
        for (int x : g) EXPECT_EQ(x, 0) << v << ": one scratch is enough";
    }
    std::vector<BlockSpec> blocks(5);
    for (std::size_t b = 1; b < blocks.size(); ++b) {
        blocks[b].ffn = FfnKind::kMoe;
        blocks[b].shortcut = ShortcutSource::kPos3;
    }
    EXPECT_EQ(moe_scratch_groups(blocks), (std::vector<int>{0, 1, 0, 1}));
    blocks[2].shortcut = ShortcutSource::kCurrent;  // [0,1], [2,2], [2,3], [3,4]
    EXPECT_EQ(moe_scratch_groups(blocks), (std::vector<int>{0, 0, 1, 0}));
    blocks[2].ffn = FfnKind::kDense;  // MoE at 1, 3, 4: [0,1], [2,3], [3,4]
    EXPECT_EQ(moe_scratch_groups(blocks), (std::vector<int>{0, 0, 1}));
}

TEST(BlockStackErrors, BadShapesAndConfigs) {
    auto device = make_device("cpu");
    BlockStackConfig config = testing::small_variant("scmoe-pos2");
    BlockStack stack(config, *device, 8);
    std::vector<float> x(6 * 16), out(x.size());
    EXPECT_THROW(stack.forward(testing::host_tensor(x, 6, 16), testing::host_tensor(out, 6, 16)), Error);  // not a multiple of seq
    std::vector<float> big(12 * 16);
    EXPECT_THROW(stack.forward(testing::host_tensor(big, 12, 16), testing::host_tensor(big, 12, 16)), Error);
    config.blocks[0] = BlockSpec{FfnKind::kMoe, ShortcutSource::kPos2};
    EXPECT_THROW(config.validate(), Error);
    EXPECT_THROW(block_variant("top9", testing::small_backbone(), testing::small_moe()), Error);
}

// The block-count limit behind LmConfig's layer limit (tests/fuzz/config_fuzz found LmConfig::validate
// allocating 12.8 GB for an absurd every-block-pos1 count; see LmConfig.AbsurdLayerCounts...).
TEST(BlockStackErrors, AbsurdBlockCountsAreRefusedBeforeAllocating) {
    BlockStackConfig config = testing::small_variant("scmoe-pos2");
    config.blocks.resize((std::size_t{1} << 16) + 1, BlockSpec{});  // dense blocks: cheap to validate
    ASSERT_THROW(config.validate(), Error);  // first: without the limit this one is accepted, cheaply
    EXPECT_THROW(block_variant("every-block-pos1", testing::small_backbone(), testing::small_moe(), true,
                               std::numeric_limits<int>::max()),
                 Error);
    EXPECT_NO_THROW(block_variant("every-block-pos1", testing::small_backbone(), testing::small_moe(), true, 1 << 16));
}

// Traces of one step on two ranks: every op on its stream's lane, the all-to-alls marked as
// communication. One rank exchanges nothing: no all-to-all entries at all.
std::vector<TraceEntry> traced_step(const BlockStackConfig& config, int ranks) {
    const std::int64_t T = 8, H = config.backbone.hidden;
    std::vector<TraceEntry> rank0;
    auto run = [&](int r, Communicator* comm) {
        auto device = make_device("cpu");
        BlockStack stack(config, *device, T, comm);
        testing::init_params(stack, 5, ranks, r);
        auto x = testing::make_input(T, H, 1), gy = testing::make_input(T, H, 2);
        std::vector<float> out(x.size()), gx(x.size());
        Tracer trace(*device, r);
        trace.set_pass("forward");
        stack.forward(testing::host_tensor(x, T, H), testing::host_tensor(out, T, H), true, &trace);
        trace.set_pass("backward");
        stack.backward(testing::host_tensor(gy, T, H), testing::host_tensor(gx, T, H), true, &trace);
        stack.synchronize();
        trace.collect();
        if (r == 0) {
            rank0 = trace.entries();
            const std::string path = ::testing::TempDir() + "scmoe_trace_test.json";
            trace.write(path);
            std::ifstream in(path);
            std::stringstream text;
            text << in.rdbuf();
            EXPECT_NE(text.str().find("\"traceEvents\""), std::string::npos);
            EXPECT_NE(text.str().find("\"name\": \"experts[moe1]\""), std::string::npos);
            EXPECT_EQ(text.str().find("\"args\": {\"comm\": true}") != std::string::npos, ranks > 1);
            std::remove(path.c_str());
        }
    };
    for (const std::string& e : testing::on_local_ranks(ranks, run)) EXPECT_EQ(e, "");
    return rank0;
}

TEST(BlockTrace, ShowsBothStreamsAndEveryBranchOp) {
    const BlockStackConfig config = testing::small_variant("scmoe-pos2");
    std::map<std::string, std::string> lane_of;
    std::map<std::string, bool> comm_of;
    for (const TraceEntry& e : traced_step(config, 2)) {
        lane_of[e.name] = e.lane;
        comm_of[e.name] = e.comm;
        EXPECT_GE(e.duration_us, 0.0) << e.name;
    }
    for (const char* a2a : {"dispatch[moe1]", "collect[moe1]", "collect_bwd[moe1]", "dispatch_bwd[moe1]"})
        EXPECT_TRUE(comm_of.at(a2a)) << a2a;
    for (const char* compute : {"gate[moe1]", "experts[moe1]", "mlp0", "attn_bwd0", "combine[moe1]"})
        EXPECT_FALSE(comm_of.at(compute)) << compute;
    EXPECT_EQ(lane_of["dispatch[moe1]"], "moe");
    EXPECT_EQ(lane_of["collect[moe1]"], "moe");
    EXPECT_EQ(lane_of["experts[moe1]"], "backbone");
    EXPECT_EQ(lane_of["mlp0"], "backbone");
    EXPECT_EQ(lane_of["dispatch_bwd[moe1]"], "moe");
    EXPECT_EQ(lane_of["attn_bwd0"], "backbone");
    const std::vector<TraceEntry> single = traced_step(config, 1);
    EXPECT_TRUE(std::any_of(single.begin(), single.end(), [](const TraceEntry& e) { return e.name == "experts[moe1]"; }));
    for (const TraceEntry& e : single) EXPECT_FALSE(e.comm) << e.name << ": one rank has no all-to-all";
}

// NVTX (scmoe/kernels/nvtx.h): every scheduled op and exchange of a pass opens a range named as its trace
// entry, traced or not, in the order the host issues them.
TEST(BlockTrace, NvtxRangesCarryTheTraceNamesTracedOrNot) {
    const BlockStackConfig config = testing::small_variant("scmoe-pos2");
    const std::int64_t T = 8, H = config.backbone.hidden;
    auto device = make_device("cpu");
    BlockStack stack(config, *device, T);
    testing::init_params(stack, 5);
    auto x = testing::make_input(T, H, 1), gy = testing::make_input(T, H, 2);
    std::vector<float> out(x.size()), gx(x.size());
    std::vector<std::string> traced_ranges, untraced_ranges;
    Tracer trace(*device, 0);
    set_nvtx_log(&traced_ranges);
    stack.forward(testing::host_tensor(x, T, H), testing::host_tensor(out, T, H), true, &trace);
    stack.backward(testing::host_tensor(gy, T, H), testing::host_tensor(gx, T, H), true, &trace);
    set_nvtx_log(&untraced_ranges);
    stack.forward(testing::host_tensor(x, T, H), testing::host_tensor(out, T, H), true);
    stack.backward(testing::host_tensor(gy, T, H), testing::host_tensor(gx, T, H), true);
    set_nvtx_log(nullptr);
    stack.synchronize();
    trace.collect();
    std::vector<std::string> entry_names;
    for (const TraceEntry& e : trace.entries()) entry_names.push_back(e.name);
    EXPECT_EQ(traced_ranges, entry_names);
    EXPECT_EQ(untraced_ranges, entry_names) << "the ranges must not depend on tracing";
    EXPECT_NE(std::find(entry_names.begin(), entry_names.end(), "experts[moe1]"), entry_names.end());
}

TraceEntry entry(const char* lane, double start, double end, bool comm) {
    TraceEntry e;
    e.name = comm ? "a2a" : "op";
    e.lane = lane;
    e.start_us = start;
    e.duration_us = end - start;
    e.comm = comm;
    return e;
}

TEST(TraceOverlap, ExposedIsCommunicationWithNoComputeRunning) {
    // backbone: compute [0,10) [12,15) [40,50); moe: comm [5,20) [18,22) [30,35), compute [21,23).
    const std::vector<TraceEntry> entries = {
        entry("moe", 5, 20, true),          entry("backbone", 0, 10, false), entry("moe", 18, 22, true),
        entry("backbone", 12, 15, false),   entry("moe", 30, 35, true),      entry("moe", 21, 23, false),
        entry("backbone", 40, 50, false)};
    const OverlapSummary o = summarize_overlap(entries);
    EXPECT_DOUBLE_EQ(o.span_us, 50.0);
    EXPECT_DOUBLE_EQ(o.comm_us, 22.0);  // [5,22) and [30,35)
    // Covered by compute: [5,10), [12,15), [21,22) = 9 us.
    EXPECT_DOUBLE_EQ(o.exposed_us, 13.0);
    EXPECT_DOUBLE_EQ(o.exposed_pct(), 26.0);
    // No communication, or communication entirely under compute: nothing exposed.
    EXPECT_DOUBLE_EQ(summarize_overlap(std::vector<TraceEntry>{entry("backbone", 0, 10, false)}).exposed_us, 0.0);
    const std::vector<TraceEntry> covered = {entry("backbone", 0, 10, false), entry("moe", 2, 9, true)};
    EXPECT_DOUBLE_EQ(summarize_overlap(covered).exposed_us, 0.0);
    EXPECT_DOUBLE_EQ(summarize_overlap({}).exposed_pct(), 0.0);
}

}  // namespace
}  // namespace scmoe
