// Overlap in the BlockStack on two in-process ranks, proven without timing anything (the speed-up
// itself is `scmoe-bench block`'s figure). With the default slots (each expert FFN at the start of
// its branch's window), a pass's second all-to-all (the forward's collect, the backward's
// dispatch_bwd) must run while the backbone works through the window. A RendezvousCommunicator
// makes that all-to-all wait, on its stream, for the next backbone op to start (a TraceProbe under
// the step's Tracer), so the step completes only if the schedule runs them side by side, and a
// schedule that orders them (overlap off; top-2, which has no window) fails naming the exchange.
// Also: the serial trace exposes all of its communication, and automatic chunks are the cost
// model's choice on times the ranks agree on.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <memory>
#include <thread>

#include "block_test_util.h"
#include "scmoe/comm/emulated_link.h"
#include "scmoe/comm/local_communicator.h"
#include "scmoe/moe/trace.h"
#include "rendezvous_util.h"

namespace scmoe {
namespace {

using testing::Rendezvous;

// Long where the exchange must meet its backbone op; short where it cannot (a serialized schedule
// fails after the timeout whatever the machine's speed).
constexpr double kMeetTimeoutS = 60.0;
constexpr double kSerializedTimeoutS = 1.0;

// Runs body(rank, comm) on two in-process ranks; returns each rank's error ("" when none).
template <class Body>
std::vector<std::string> on_two_ranks(double comm_timeout_s, Body body) {
    auto group = LocalGroup::create(2, comm_timeout_s);
    std::vector<std::string> errors(2);
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r)
        threads.emplace_back([&, r] {
            try {
                auto comm = group->communicator(r);
                body(r, *comm);
            } catch (const std::exception& e) {
                errors[static_cast<std::size_t>(r)] = "rank " + std::to_string(r) + ": " + e.what();
            }
        });
    for (auto& t : threads) t.join();
    return errors;
}

// A pass's second exchange and the backbone op the scheduler enqueues after it (the first segment
// of its window). The all-to-alls of a pass: forward counts 0, dispatch rows 1, collect 2;
// backward collect_bwd 0, dispatch_bwd 1.
struct ExchangeCase {
    std::string variant;
    bool backward;
    int nth_all_to_all;
    std::string exchange;  // its trace name
    std::string backbone_op;
};

std::string case_name(const ExchangeCase& c) {
    return testing::gtest_name(c.variant) + (c.backward ? "_backward" : "_forward");
}

void PrintTo(const ExchangeCase& c, std::ostream* os) { *os << case_name(c); }

// One rank's traced pass in which c.exchange meets the next backbone op; the error ("" when the
// pass completed) and the trace (complete either way: a failed stream still records its events).
struct MeetResult {
    std::string error;
    std::vector<TraceEntry> trace;
    bool met = false;
};

std::vector<MeetResult> meet_in_stack(const ExchangeCase& c, bool overlap, double timeout_s) {
    const BlockStackConfig config = testing::small_variant(c.variant);
    const std::int64_t T = 8, H = config.backbone.hidden;
    std::vector<MeetResult> results(2);
    const auto errors = on_two_ranks(4 * timeout_s, [&](int r, Communicator& local) {
        MeetResult& out = results[static_cast<std::size_t>(r)];
        // Outlives the stack's stream workers, which may still hold the error when synchronize()
        // returns: this thread frees it (ThreadSanitizer does not see libstdc++'s reference count).
        std::exception_ptr failure;
        auto device = make_device("cpu");
        testing::RendezvousCommunicator comm(local);
        BlockStack stack(config, *device, T, &comm);
        // The rendezvous arms the first backbone op issued after the exchange: in program order that
        // is the window's first op. (Issued backbone-ahead, the window's ops go out before the
        // exchange and the next one issued is the expert FFN, which waits for the exchange.) The
        // streams' programs, and so what runs beside what, do not depend on the issue order.
        stack.set_issue_order(IssueOrder::kProgram);
        testing::init_params(stack, 5, 2, r);
        auto x = testing::make_input(T, H, 1 + static_cast<std::uint64_t>(r)), gy = testing::make_input(T, H, 2);
        std::vector<float> y(x.size()), gx(x.size());
        if (c.backward) {
            stack.forward(testing::host_tensor(x, T, H), testing::host_tensor(y, T, H), overlap);
            stack.synchronize();
        }
        testing::TraceProbe probe(*device);
        Tracer trace(probe, r);
        Rendezvous rendezvous(c.exchange, "the next backbone op", timeout_s);
        comm.meet_at(c.nth_all_to_all, rendezvous, Rendezvous::kFirst,
                     [&] { probe.meet_at_next_op(stack.stream(), rendezvous, Rendezvous::kSecond); });
        if (c.backward)
            stack.backward(testing::host_tensor(gy, T, H), testing::host_tensor(gx, T, H), overlap, &trace);
        else
            stack.forward(testing::host_tensor(x, T, H), testing::host_tensor(y, T, H), overlap, &trace);
        try {
            stack.synchronize();
        } catch (const Error& e) {
            failure = std::current_exception();
            out.error = e.what();
        }
        trace.collect();
        out.trace = trace.entries();
        out.met = rendezvous.met();
    });
    for (int r = 0; r < 2; ++r)
        if (!errors[static_cast<std::size_t>(r)].empty())
            results[static_cast<std::size_t>(r)].error = errors[static_cast<std::size_t>(r)];
    return results;
}

class BlockOverlapRanks : public ::testing::TestWithParam<ExchangeCase> {};

// Overlap on: the exchange and the window's first backbone op meet, so the step completes; and in
// the trace their entries intersect (each was still running when the other arrived).
TEST_P(BlockOverlapRanks, ExchangeRunsBesideTheNextBackboneOp) {
    const ExchangeCase& c = GetParam();
    const std::vector<MeetResult> results = meet_in_stack(c, true, kMeetTimeoutS);
    for (int r = 0; r < 2; ++r) {
        const MeetResult& res = results[static_cast<std::size_t>(r)];
        ASSERT_EQ(res.error, "") << "rank " << r;
        EXPECT_TRUE(res.met) << "rank " << r;
        const auto& t = res.trace;
        const auto exchange =
            std::find_if(t.begin(), t.end(), [&](const TraceEntry& e) { return e.name == c.exchange; });
        ASSERT_NE(exchange, t.end()) << "rank " << r << ": no " << c.exchange << " in the trace";
        EXPECT_EQ(exchange->lane, "moe");
        // The probe's op: the first op enqueued on the backbone stream after the exchange.
        const auto partner =
            std::find_if(exchange + 1, t.end(), [](const TraceEntry& e) { return e.lane == "backbone"; });
        ASSERT_NE(partner, t.end()) << "rank " << r;
        EXPECT_EQ(partner->name, c.backbone_op) << "rank " << r;
        EXPECT_FALSE(partner->comm) << partner->name;
        const double start = std::max(exchange->start_us, partner->start_us);
        const double end =
            std::min(exchange->start_us + exchange->duration_us, partner->start_us + partner->duration_us);
        EXPECT_LE(start, end) << "rank " << r << ": " << c.exchange << " and " << partner->name << " do not intersect";
    }
}

// Overlap off (one stream): the exchange runs before the backbone op, so they cannot meet.
TEST_P(BlockOverlapRanks, SerializedScheduleFailsNamingTheExchange) {
    const ExchangeCase& c = GetParam();
    for (const MeetResult& res : meet_in_stack(c, false, kSerializedTimeoutS)) {
        std::printf("%s\n", res.error.c_str());
        EXPECT_FALSE(res.met);
        EXPECT_NE(
            res.error.find(c.exchange + " waited 1 s for the next backbone op to start: the schedule serialized them"),
            std::string::npos)
            << res.error;
    }
}

INSTANTIATE_TEST_SUITE_P(Cpu, BlockOverlapRanks,
                         ::testing::Values(ExchangeCase{"scmoe-pos2", false, 2, "collect[moe1]", "mlp0"},
                                           ExchangeCase{"scmoe-pos2", true, 1, "dispatch_bwd[moe1]", "shared_bwd1"},
                                           ExchangeCase{"scmoe-pos3", false, 2, "collect[moe1]", "attn0"},
                                           ExchangeCase{"scmoe-pos3", true, 1, "dispatch_bwd[moe1]", "shared_bwd1"}),
                         [](const ::testing::TestParamInfo<ExchangeCase>& p) { return case_name(p.param); });

// Top-2 routes on the block's own representation, so its forward has no backbone work between the
// branch's start and its result: even with overlap on, the next backbone op (the residual add)
// waits for the collect. The rendezvous tells the layouts apart, not only overlap on from off.
TEST(BlockOverlapRanksTopTwo, NoWindowSoTheCollectCannotMeetTheBackbone) {
    const ExchangeCase c{"top2", false, 2, "collect[moe1]", "moe_add[moe1]"};
    for (const MeetResult& res : meet_in_stack(c, true, kSerializedTimeoutS)) {
        std::printf("%s\n", res.error.c_str());
        EXPECT_FALSE(res.met);
        EXPECT_NE(res.error.find("collect[moe1] waited 1 s for the next backbone op to start"), std::string::npos)
            << res.error;
    }
}

// Serially (overlap off) every all-to-all runs alone: the trace's exposed communication is all of
// it (structural: one lane, nothing beside anything). Behind an emulated link, which must not
// change that.
TEST(BlockOverlapRanksTrace, SerialStepExposesAllCommunication) {
    const BlockStackConfig config = testing::small_variant("scmoe-pos3");
    const std::int64_t T = 8, H = config.backbone.hidden;
    std::vector<OverlapSummary> summaries(2);
    const auto errors = on_two_ranks(60.0, [&](int r, Communicator& local) {
        EmulatedLink link(local, LinkModel{"test", 1000.0, 500.0});
        auto device = make_device("cpu");
        BlockStack stack(config, *device, T, &link);
        testing::init_params(stack, 5, 2, r);
        auto x = testing::make_input(T, H, 1 + static_cast<std::uint64_t>(r)), gy = testing::make_input(T, H, 2);
        std::vector<float> y(x.size()), gx(x.size());
        Tracer trace(*device, r);
        stack.forward(testing::host_tensor(x, T, H), testing::host_tensor(y, T, H), false, &trace);
        stack.backward(testing::host_tensor(gy, T, H), testing::host_tensor(gx, T, H), false, &trace);
        stack.synchronize();
        trace.collect();
        summaries[static_cast<std::size_t>(r)] = summarize_overlap(trace.entries());
    });
    for (int r = 0; r < 2; ++r) {
        EXPECT_EQ(errors[static_cast<std::size_t>(r)], "");
        const OverlapSummary& s = summaries[static_cast<std::size_t>(r)];
        EXPECT_GE(s.comm_us, 5 * 500.0) << "rank " << r << ": five all-to-alls behind a 0.5 ms link";
        EXPECT_NEAR(s.exposed_us / s.comm_us, 1.0, 1e-9) << "rank " << r;
    }
}

// ---- automatic chunks ----
//
// calibrate() measures every op (the pieces of a chunkable exchange too) and lets the cost model
// choose (choose_chunks). Which choice the model makes from measured times depends on the machine:
// pipelining pays where the expert FFN it hides is a large enough share of the exchange, a ratio
// of compute to link speed. So the model's choices are tested on hand-made times
// (LayerSchedulerChunks in block_chunks_test.cpp) and `scmoe-bench block --chunks auto` reports the
// choices on real ones. Here, what holds on any machine: the ranks agree on every time and choice;
// each exchange took at least its link's modelled time, pieces included; and the choice is the
// model's on those times. And one direction that needs no speed: behind a latency-bound link (each
// all-to-all holds 50 ms whatever its size) C pieces cost the model at least (2C + 1) x 50 ms where
// whole exchanges cost about 3 x 50 ms plus compute, so pipelining would need the measured compute
// to exceed ~130 ms in a stack whose compute takes well under a millisecond.
// A one-branch plan with the segments, ready and join of `pass`'s branch (0 forward, 1 backward)
// as describe_schedule() reports them, and the schedule's max_chunks; its ops do nothing.
SchedulePlan plan_shaped_like(const std::string& described, int pass, const Schedule& s) {
    std::size_t line = 0;
    for (int i = 0; i < pass; ++i) line = described.find('\n', line) + 1;
    const std::size_t at = described.find("ready ", line);
    SCMOE_CHECK(at != std::string::npos, "no ready/join in: " << described);
    BranchPlan b;
    SCMOE_CHECK(std::sscanf(described.c_str() + at, "ready %d join %d", &b.ready, &b.join) == 2, described);
    b.name = "moe1";
    b.max_chunks = s.branches[0].max_chunks;
    auto nothing = [](int, int, Stream&) {};
    b.send_chunks = {"send", nothing, true};
    b.expert_chunks = {"expert", nothing};
    b.receive_chunks = {"receive", nothing, true};
    SchedulePlan plan;
    plan.name = pass == 0 ? "forward" : "backward";
    plan.segments.resize(s.segment_ms.size());
    plan.branches.push_back(b);
    return plan;
}

TEST(BlockChunksAuto, ChoiceIsTheModelsOnAgreedTimesAndALatencyBoundLinkStaysWhole) {
    constexpr double kLatencyMs = 50.0;
    MoeConfig moe = testing::small_moe(DispatchMode::kCapacity);
    moe.num_experts = 8;  // 4 local experts on each of 2 ranks: up to 4 pieces
    for (const std::string variant : {"top2", "scmoe-pos2"}) {
        const BlockStackConfig config = block_variant(variant, testing::small_backbone(), moe, true, 2);
        const std::int64_t T = 8, H = config.backbone.hidden;
        std::vector<std::string> described(2);
        std::vector<Schedule> schedules(4);  // rank 0 forward, backward, rank 1 forward, backward
        const auto errors = on_two_ranks(60.0, [&](int r, Communicator& local) {
            EmulatedLink link(local, LinkModel{"latency-bound", 1e6, 1000.0 * kLatencyMs});
            auto device = make_device("cpu");
            BlockStack stack(config, *device, T, &link);
            testing::init_params(stack, 5, 2, r);
            auto x = testing::make_input(T, H, 1 + static_cast<std::uint64_t>(r)), gy = testing::make_input(T, H, 2);
            stack.calibrate(testing::host_tensor(x, T, H), testing::host_tensor(gy, T, H), 2);
            described[static_cast<std::size_t>(r)] = stack.describe_schedule();
            schedules[static_cast<std::size_t>(2 * r)] = stack.forward_schedule();
            schedules[static_cast<std::size_t>(2 * r + 1)] = stack.backward_schedule();
        });
        for (const std::string& e : errors) ASSERT_EQ(e, "") << variant;
        // The times are averaged over the ranks (bitwise the same on both), so are the choices.
        EXPECT_EQ(described[0], described[1]) << variant;
        EXPECT_NE(described[0].find("(auto: modelled"), std::string::npos) << described[0];
        for (int pass = 0; pass < 2; ++pass) {
            const Schedule& s = schedules[static_cast<std::size_t>(pass)];
            ASSERT_EQ(s.branches.size(), 1u);
            const Schedule::Branch& b = s.branches[0];
            const int pieces = b.max_chunks;
            EXPECT_EQ(pieces, 4);
            // Lower bounds: every all-to-all holds the link for at least its latency. The forward's
            // dispatch is two (counts, rows); piece 0 of a chunked dispatch carries the counts too.
            const int whole_sends = pass == 0 ? 2 : 1, piece_sends = pass == 0 ? pieces + 1 : pieces;
            const double slack = 1 - 1e-6;  // the times travel as floats
            EXPECT_GE(b.send_ms, whole_sends * kLatencyMs * slack) << variant << " pass " << pass;
            EXPECT_GE(b.receive_ms, kLatencyMs * slack) << variant << " pass " << pass;
            EXPECT_GE(b.chunked_send_ms, piece_sends * kLatencyMs * slack) << variant << " pass " << pass;
            EXPECT_GE(b.chunked_receive_ms, pieces * kLatencyMs * slack) << variant << " pass " << pass;
            // The choice is the cost model's on these times: choosing again from a copy of them
            // (in a plan of the same shape) gives the same slot and chunks.
            Schedule again = s;
            const SchedulePlan plan = plan_shaped_like(described[0], pass, s);
            choose_slots(plan, again);
            choose_chunks(plan, again);
            EXPECT_EQ(again.branches[0].slot, b.slot) << variant << " pass " << pass;
            EXPECT_EQ(again.branches[0].chunks, b.chunks) << variant << " pass " << pass;
            EXPECT_DOUBLE_EQ(again.branches[0].modelled_ms, b.modelled_ms) << variant << " pass " << pass;
            // The robust direction: no pipelining behind a latency-bound link.
            EXPECT_EQ(b.chunks, 1) << variant << " pass " << pass << ":\n" << described[0];
        }
        std::printf("%s, latency-bound link:\n%s", variant.c_str(), described[0].c_str());
    }
}

}  // namespace
}  // namespace scmoe
