// The chunked all-to-all / expert-FFN pipeline in the BlockStack: forced chunk counts give bitwise
// the unchunked outputs and every gradient (overlap on and off, one rank and in-process ranks with
// several local experts); the cost model picks chunks > 1 when the all-to-all exceeds its window
// (hand-made times; with measured times in block_overlap_link_test); bad counts are rejected.
#include <gtest/gtest.h>

#include <thread>

#include "block_test_util.h"
#include "local_ranks.h"

namespace scmoe {
namespace {

using testing::StackResult;

BlockStackConfig eight_expert_variant(const std::string& variant, DispatchMode dispatch) {
    MoeConfig moe = testing::small_moe(dispatch);
    moe.num_experts = 8;  // ep 2: 4 local experts, ep 4: 2
    return block_variant(variant, testing::small_backbone(), moe, true, 3);
}

// ---- the cost model on hand-made times ----

SchedulePlan one_branch_plan(int segments, int ready, int join, int max_chunks) {
    SchedulePlan plan;
    plan.name = "forward";
    plan.segments.resize(static_cast<std::size_t>(segments));
    BranchPlan b;
    b.name = "moe";
    b.ready = ready;
    b.join = join;
    b.max_chunks = max_chunks;
    auto piece = [](int, int, Stream&) {};
    b.send_chunks = {"dispatch", piece, true};
    b.expert_chunks = {"experts", piece};
    b.receive_chunks = {"collect", piece, true};
    plan.branches.push_back(b);
    return plan;
}

TEST(LayerSchedulerChunks, ModelPipelinesWhenTheAllToAllExceedsTheWindow) {
    SchedulePlan plan = one_branch_plan(3, 1, 2, 4);
    Schedule s;
    s.segment_ms = {5, 4, 5};  // a 4 ms window
    Schedule::Branch t;
    t.pre_ms = 1;
    t.send_ms = 10, t.expert_ms = 20, t.receive_ms = 10, t.post_ms = 1;
    // Pieces cost almost nothing extra (a bandwidth-bound link).
    t.chunked_send_ms = 10.3, t.chunked_expert_ms = 20.3, t.chunked_receive_ms = 10.3;
    s.branches.push_back(t);
    choose_slots(plan, s);
    // Unchunked: pre + send, then the experts, then receive + post: 1 + 10 + 20 + 10 + 1 = 42 ms.
    EXPECT_DOUBLE_EQ(model_branch_ms(plan, s, 0, s.branches[0].slot, 1), 42.0);
    // 4 pieces: each expert piece hides the next send and the previous receive (~27 ms).
    choose_chunks(plan, s);
    EXPECT_EQ(s.branches[0].chunks, 4);
    EXPECT_LT(s.branches[0].modelled_ms, 0.7 * s.branches[0].modelled_unchunked_ms);
    EXPECT_NE(s.describe(plan).find("chunks 4 of max 4 (auto"), std::string::npos) << s.describe(plan);
    // When the exchanges dominate, the sends and receives share the MoE stream: pipelining can
    // only hide the expert FFN, and more pieces than needed for that only add their costs.
    s.branches[0].send_ms = s.branches[0].receive_ms = 20, s.branches[0].expert_ms = 8;
    s.branches[0].chunked_send_ms = s.branches[0].chunked_receive_ms = 20.4, s.branches[0].chunked_expert_ms = 8.2;
    choose_slots(plan, s);
    choose_chunks(plan, s);
    EXPECT_EQ(s.branches[0].chunks, 2);
    EXPECT_LT(s.branches[0].modelled_ms, 0.9 * s.branches[0].modelled_unchunked_ms);
    // Forced: exactly that many pieces, capped at max_chunks.
    choose_slots(plan, s);
    choose_chunks(plan, s, 2);
    EXPECT_EQ(s.branches[0].chunks, 2);
    choose_chunks(plan, s, 9);
    EXPECT_EQ(s.branches[0].chunks, 4);
    EXPECT_THROW(choose_chunks(plan, s, -1), Error);

    // Latency-bound pieces (each piece as slow as the whole exchange): no gain, no chunks.
    s.branches[0].chunked_send_ms = 80, s.branches[0].chunked_receive_ms = 80;
    choose_slots(plan, s);
    choose_chunks(plan, s);
    EXPECT_EQ(s.branches[0].chunks, 1);
    // An all-to-all that fits the window: nothing to gain either.
    s.segment_ms = {5, 60, 5};
    s.branches[0].send_ms = s.branches[0].receive_ms = 2;
    s.branches[0].chunked_send_ms = s.branches[0].chunked_receive_ms = 2.1;
    choose_slots(plan, s);
    choose_chunks(plan, s);
    EXPECT_EQ(s.branches[0].chunks, 1);
    // A branch that cannot be chunked stays whole.
    SchedulePlan whole = one_branch_plan(3, 1, 2, 1);
    Schedule w;
    w.segment_ms = {5, 4, 5};
    w.branches.push_back(t);
    choose_slots(whole, w);
    choose_chunks(whole, w, 3);
    EXPECT_EQ(w.branches[0].chunks, 1);
}

// ---- bitwise equality ----

// A stack of its own (rank r of ep, parameters from seed 9) with `chunks` forced (0: auto): the
// reference and every candidate get one, so nothing a chunked run skips can come from another's
// buffers or gradients (issue 28).
std::unique_ptr<BlockStack> chunk_stack(const BlockStackConfig& config, Device& device, std::int64_t T,
                                        Communicator* comm, int ep, int r, int chunks) {
    auto stack = std::make_unique<BlockStack>(config, device, T, comm);
    testing::init_params(*stack, 9, ep, r);
    stack->set_expert_chunks(chunks);
    return stack;
}

// Rank r of a chunk test: its inputs, fresh stacks with a forced chunk count (chunk_stack), and the
// unchunked reference (1 chunk, overlap off, on NaN-filled outputs and gradients: run_stack), which
// must have written every result.
struct ChunkRank {
    const BlockStackConfig& config;
    std::int64_t T;
    Communicator* comm;
    int ep, r;
    std::unique_ptr<Device> device = make_device("cpu");
    std::vector<float> x = testing::make_input(T, config.backbone.hidden, 30 + static_cast<std::uint64_t>(r));
    std::vector<float> gy = testing::make_input(T, config.backbone.hidden, 40 + static_cast<std::uint64_t>(r));
    std::unique_ptr<BlockStack> fresh_stack(int chunks) const {
        return chunk_stack(config, *device, T, comm, ep, r, chunks);
    }
    // A fresh stack with `chunks` forced (0: auto), run (and first calibrated, with `calibrate`).
    StackResult run(int chunks, bool overlap, bool calibrate = false) const {
        return testing::run_stack(*fresh_stack(chunks), x, gy, overlap, calibrate);
    }
    StackResult reference() const {
        StackResult ref = run(1, false);
        const std::string unwritten = testing::unwritten(ref);
        SCMOE_CHECK(unwritten.empty(), "the reference (1 chunk, overlap off): " << unwritten);
        return ref;
    }
};

struct ChunkCase {
    std::string variant;
    int ep;
    DispatchMode dispatch;
};

class BlockChunks : public ::testing::TestWithParam<ChunkCase> {};

TEST_P(BlockChunks, EveryChunkCountIsBitwiseUnchunked) {
    const ChunkCase& c = GetParam();
    const BlockStackConfig config = eight_expert_variant(c.variant, c.dispatch);
    const auto errors = testing::on_local_ranks(c.ep, [&](int r, Communicator* comm) {
        // The reference and every candidate on a stack of their own.
        const ChunkRank rank{config, 8, comm, c.ep, r};
        const StackResult ref = rank.reference();
        const int local = config.moe.num_experts / c.ep;
        for (int chunks : {2, local}) {
            const int expect = c.ep > 1 ? chunks : 1;  // one rank: nothing to pipeline
            for (bool overlap : {false, true}) {
                auto stack = rank.fresh_stack(chunks);
                for (const auto* s : {&stack->forward_schedule(), &stack->backward_schedule()})
                    for (const auto& b : s->branches)
                        SCMOE_CHECK(b.chunks == expect, "scheduled " << b.chunks << " chunks, expected " << expect);
                const std::string diff =
                    testing::bitwise_diff(testing::run_stack(*stack, rank.x, rank.gy, overlap), ref);
                SCMOE_CHECK(diff.empty(), chunks << " chunks, overlap " << overlap << ": " << diff);
            }
        }
        // Calibrated, forced and auto: the same bits.
        std::string diff = testing::bitwise_diff(rank.run(local, true, true), ref);
        SCMOE_CHECK(diff.empty(), "calibrated, " << local << " chunks: " << diff);
        diff = testing::bitwise_diff(rank.run(0, true, true), ref);
        SCMOE_CHECK(diff.empty(), "calibrated, auto chunks: " << diff);
    });
    for (const std::string& e : errors) EXPECT_EQ(e, "");
}

std::vector<ChunkCase> chunk_cases() {
    std::vector<ChunkCase> cases;
    for (const std::string& v : block_variant_names()) {
        cases.push_back({v, 2, DispatchMode::kDropless});
        cases.push_back({v, 4, DispatchMode::kCapacity});
    }
    cases.push_back({"scmoe-pos2", 1, DispatchMode::kDropless});
    cases.push_back({"top2", 1, DispatchMode::kCapacity});
    return cases;
}

INSTANTIATE_TEST_SUITE_P(Cpu, BlockChunks, ::testing::ValuesIn(chunk_cases()),
                         [](const ::testing::TestParamInfo<ChunkCase>& p) {
                             return testing::gtest_name(p.param.variant + "_ep" + std::to_string(p.param.ep) + "_" +
                                                        dispatch_mode_name(p.param.dispatch));
                         });

// One expert per rank (num_experts == ep): the pieces slice the expert's rows (Tutel's overlap
// degree). Every forced count 2..kMaxRowPieces is scheduled as asked, overlap on and off give the same
// bits, and the results match the unchunked stack to fp32 rounding (the expert's weight gradient sums
// its slices); auto chunks after calibration too.
class BlockRowSlices : public ::testing::TestWithParam<ChunkCase> {};

TEST_P(BlockRowSlices, EveryPieceCountMatchesUnchunkedAndOverlapIsBitwise) {
    const ChunkCase& c = GetParam();
    MoeConfig moe = testing::small_moe(c.dispatch);
    moe.num_experts = c.ep;  // one local expert
    moe.top_k = 1;
    const BlockStackConfig config = block_variant(c.variant, testing::small_backbone(), moe, true, 3);
    const auto errors = testing::on_local_ranks(c.ep, [&](int r, Communicator* comm) {
        const ChunkRank rank{config, 8, comm, c.ep, r};
        const StackResult ref = rank.reference();
        for (int chunks = 2; chunks <= kMaxRowPieces; ++chunks) {
            auto off_stack = rank.fresh_stack(chunks), on_stack = rank.fresh_stack(chunks);
            for (const auto* s : {&on_stack->forward_schedule(), &on_stack->backward_schedule()})
                for (const auto& b : s->branches)
                    SCMOE_CHECK(b.chunks == chunks, "scheduled " << b.chunks << " chunks, expected " << chunks);
            const StackResult off = testing::run_stack(*off_stack, rank.x, rank.gy, false);
            const StackResult on = testing::run_stack(*on_stack, rank.x, rank.gy, true);
            std::string diff = testing::bitwise_diff(on, off);
            SCMOE_CHECK(diff.empty(), chunks << " chunks, overlap on vs off: " << diff);
            diff = testing::close_diff(on, ref, 1e-5f);
            SCMOE_CHECK(diff.empty(), chunks << " chunks vs unchunked: " << diff);
        }
        const std::string diff = testing::close_diff(rank.run(0, true, true), ref, 1e-5f);
        SCMOE_CHECK(diff.empty(), "calibrated, auto chunks: " << diff);
    });
    for (const std::string& e : errors) EXPECT_EQ(e, "");
}

INSTANTIATE_TEST_SUITE_P(Cpu, BlockRowSlices,
                         ::testing::Values(ChunkCase{"top2", 2, DispatchMode::kCapacity},
                                           ChunkCase{"scmoe-pos2", 4, DispatchMode::kDropless},
                                           ChunkCase{"shared", 4, DispatchMode::kCapacity}),
                         [](const ::testing::TestParamInfo<ChunkCase>& p) {
                             return testing::gtest_name(p.param.variant + "_ep" + std::to_string(p.param.ep) + "_" +
                                                        dispatch_mode_name(p.param.dispatch));
                         });

TEST(BlockChunksErrors, BadChunkCountsAreRejected) {
    auto device = make_device("cpu");
    BlockStack stack(testing::small_variant("scmoe-pos2"), *device, 8);  // 4 experts, one rank
    EXPECT_THROW(stack.set_expert_chunks(-1), Error);
    try {
        stack.set_expert_chunks(5);
        FAIL() << "5 chunks of 4 experts went through";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("must be 0 (auto) or 1..4"), std::string::npos) << e.what();
    }
    EXPECT_EQ(stack.expert_chunks(), 0);
    stack.set_expert_chunks(4);  // accepted; one rank runs it whole
    EXPECT_EQ(stack.expert_chunks(), 4);
}

}  // namespace
}  // namespace scmoe
