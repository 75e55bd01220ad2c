// MoeLayer chunked pipeline with in-process ranks: the forward and backward run as pieces of local
// experts — exchanges on one stream, expert pieces on a second stream ordered by events, as the
// scheduler runs them — give bitwise the outputs and every gradient of the unchunked stages, for
// every chunk count, ep = 2 and 4, top-1/top-2, capacity/dropless, uneven and zero token counts.
// Every candidate runs on a layer of its own and on outputs and gradients filled with NaN, so a piece
// it skips cannot inherit the reference's rows or gradients (issue 28: a chunk split that never
// computed the last experts passed when the runs shared one layer and one gradient store).
// Bad chunk counts are rejected before anything is enqueued.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <functional>

#include "local_ranks.h"
#include "ep_reference.h"

namespace scmoe {
namespace {

using testing::EpCase;

struct Results {
    std::vector<float> y, gx, grads;
};

// One forward + backward through the split-phase stages in `chunks` pieces; with two streams the
// expert pieces run on the second one, each waiting for its exchange piece. The outputs and `grads`
// start as NaN: whatever the run does not write shows.
Results run_pieces(MoeLayer& layer, Device& device, const MoeParamStore& params, MoeParamStore& grads,
                   std::vector<float>& x, std::vector<float>& gy, std::int64_t T, int chunks, bool two_streams) {
    const std::int64_t H = layer.config().hidden;
    testing::fill_nan(grads);
    auto exchange = device.create_stream();
    auto compute = device.create_stream();
    Stream& a = *exchange;
    Stream& b = two_streams ? *compute : *exchange;
    std::vector<std::unique_ptr<Event>> sent, done;
    for (int c = 0; c < chunks; ++c) {
        sent.push_back(device.create_event());
        done.push_back(device.create_event());
    }
    Results r;
    r.y.assign(x.size(), testing::kUnwritten);
    r.gx.assign(x.size(), testing::kUnwritten);
    const MoeParams& p = params.view();
    const MoeGrads& g = grads.view();
    layer.route(testing::host_tensor(x, T, H), p, a);
    layer.permute(a);
    layer.dispatch_counts(a);
    for (int c = 0; c < chunks; ++c) {
        layer.dispatch_chunk(c, chunks, a);
        sent[static_cast<std::size_t>(c)]->record(a);
    }
    for (int c = 0; c < chunks; ++c) {
        b.wait(*sent[static_cast<std::size_t>(c)]);
        layer.experts_chunk(p, c, chunks, b);
        done[static_cast<std::size_t>(c)]->record(b);
    }
    for (int c = 0; c < chunks; ++c) {
        a.wait(*done[static_cast<std::size_t>(c)]);
        layer.collect_chunk(c, chunks, a);
    }
    layer.combine(testing::host_tensor(r.y, T, H), a);
    layer.combine_backward(testing::host_tensor(gy, T, H), a);
    for (int c = 0; c < chunks; ++c) {
        layer.collect_backward_chunk(c, chunks, a);
        sent[static_cast<std::size_t>(c)]->record(a);
    }
    for (int c = 0; c < chunks; ++c) {
        b.wait(*sent[static_cast<std::size_t>(c)]);
        layer.experts_backward_chunk(p, g, c, chunks, b);
        done[static_cast<std::size_t>(c)]->record(b);
    }
    for (int c = 0; c < chunks; ++c) {
        a.wait(*done[static_cast<std::size_t>(c)]);
        layer.dispatch_backward_chunk(c, chunks, a);
    }
    layer.permute_backward(testing::host_tensor(r.gx, T, H), false, a);
    layer.route_backward(p, g, testing::host_tensor(r.gx, T, H), a);
    a.synchronize();
    b.synchronize();
    const auto* gd = static_cast<const float*>(grads.data());
    r.grads.assign(gd, gd + grads.numel());
    return r;
}

// "" or the first element of `got` further than `tol` times the largest |want| from `want`; tol 0:
// bitwise.
std::string differs(const std::vector<float>& got, const std::vector<float>& want, float tol, const std::string& what) {
    if (got.size() != want.size()) return what + ": sizes differ";
    float largest = 0;
    for (float v : want) largest = std::max(largest, std::abs(v));
    for (std::size_t i = 0; i < got.size(); ++i) {
        const bool same = tol == 0 ? std::memcmp(&got[i], &want[i], sizeof(float)) == 0
                                   : std::abs(got[i] - want[i]) <= tol * largest;
        if (!same)
            return what + "[" + std::to_string(i) + "]: " + std::to_string(got[i]) + " vs " + std::to_string(want[i]);
    }
    return "";
}

// Every rank of case `c` on a thread with its own CPU device: the unchunked reference on a layer of
// its own, then every chunk count 1..max_chunks() on one stream and on two, each on a fresh layer
// (and, in run_pieces, NaN-filled outputs and gradients): nothing a candidate leaves out can come
// from the reference (issue 28). Each candidate's y, grad_x and grads must match the reference
// within `tol` (0: bitwise). `expect_max_chunks` checks the layer's bound first.
void every_chunk_count_matches(const EpCase& c, float tol, int expect_max_chunks) {
    const MoeConfig config = testing::ep_config(c);
    const std::vector<std::string> errors = testing::on_local_ranks(c.ep, [&](int r, Communicator* comm) {
        auto device = make_device("cpu");
        const std::int64_t T = c.tokens[static_cast<std::size_t>(r)], H = config.hidden;
        auto fresh_layer = [&] {
            return std::make_unique<MoeLayer>(config, *device, testing::max_tokens_of(c), comm);
        };
        auto reference_layer = fresh_layer();
        SCMOE_CHECK(reference_layer->max_chunks() == expect_max_chunks,
                    "max_chunks " << reference_layer->max_chunks() << ", expected " << expect_max_chunks);
        MoeParamStore params(*device, config, DType::kF32, c.ep), grads(*device, config, DType::kF32, c.ep);
        const std::vector<float> full = testing::full_params(config);
        testing::slice_params(config, c.ep, r, {full.data()}, static_cast<float*>(params.data()));
        std::vector<float> x(static_cast<std::size_t>(T * H)), gy(x.size());
        testing::fill_uniform(x.data(), T * H, 1.0f, testing::input_seed(r));
        testing::fill_uniform(gy.data(), T * H, 1.0f, testing::input_seed(r) + 1);
        const Results ref = run_pieces(*reference_layer, *device, params, grads, x, gy, T, 1, false);
        for (const std::vector<float>* v : {&ref.y, &ref.gx, &ref.grads})
            SCMOE_CHECK(testing::first_nan(*v) < 0, "the reference left an output or gradient unwritten (NaN)");
        for (int chunks = 1; chunks <= expect_max_chunks; ++chunks) {
            for (bool two : {false, true}) {
                auto candidate = fresh_layer();
                const Results got = run_pieces(*candidate, *device, params, grads, x, gy, T, chunks, two);
                std::string e = differs(got.y, ref.y, tol, "y");
                if (e.empty()) e = differs(got.gx, ref.gx, tol, "grad_x");
                if (e.empty()) e = differs(got.grads, ref.grads, tol, "grads");
                SCMOE_CHECK(e.empty(),
                            "chunks " << chunks << (two ? " (two streams)" : " (one stream)") << ": " << e);
            }
        }
    });
    for (const std::string& e : errors) EXPECT_EQ(e, "");
}

class MoeChunks : public ::testing::TestWithParam<EpCase> {};

// Pieces of local experts: every expert's rows stay in one piece, so every result is bitwise.
TEST_P(MoeChunks, EveryChunkCountIsBitwiseTheUnchunkedLayer) {
    every_chunk_count_matches(GetParam(), 0.0f, 8 / GetParam().ep);
}

const auto kCap = DispatchMode::kCapacity;
const auto kDropless = DispatchMode::kDropless;

INSTANTIATE_TEST_SUITE_P(
    Cpu, MoeChunks,
    ::testing::Values(EpCase{"ep2_top2_dropless", 1, 2, 2, kDropless, {12, 9}, false},
                      EpCase{"ep2_top1_capacity", 1, 2, 1, kCap, {12, 12}, false},
                      EpCase{"ep4_top2_capacity_uneven", 1, 4, 2, kCap, {16, 3, 0, 7}, false},
                      EpCase{"ep4_top1_dropless_zero_token_rank", 1, 4, 1, kDropless, {9, 0, 5, 13}, false},
                      EpCase{"ep2_top3_capacity", 1, 2, 3, kCap, {12, 12}, false},
                      EpCase{"ep4_top3_dropless_uneven", 1, 4, 3, kDropless, {16, 3, 0, 7}, false}),
    [](const ::testing::TestParamInfo<EpCase>& p) { return p.param.name; });

// One local expert per rank: the pieces are slices of its rows (Tutel's a2a_ffn_overlap_degree). For
// 2..kMaxRowPieces pieces the output, the input gradient and every parameter gradient match the
// unchunked layer's to fp32 rounding (1e-5 of the largest value): every row goes through the same
// row-wise ops, in GEMMs of fewer rows, and the weight gradient is the pieces' sum, accumulated in
// piece order.
class MoeRowSlices : public ::testing::TestWithParam<EpCase> {};

TEST_P(MoeRowSlices, EveryPieceCountMatchesTheUnchunkedLayer) {
    every_chunk_count_matches(GetParam(), 1e-5f, kMaxRowPieces);
}

INSTANTIATE_TEST_SUITE_P(
    Cpu, MoeRowSlices,
    ::testing::Values(EpCase{"ep2_top1_capacity", 1, 2, 1, kCap, {24, 24}, false, 2},
                      EpCase{"ep4_top2_dropless_uneven", 1, 4, 2, kDropless, {30, 3, 0, 17}, false, 4},
                      EpCase{"ep4_top1_capacity", 1, 4, 1, kCap, {20, 20, 9, 20}, false, 4}),
    [](const ::testing::TestParamInfo<EpCase>& p) { return p.param.name; });

// "" when fn() throws an Error naming `text`, else what happened instead ("no error for ..." or the
// other message), ending in "; ".
std::string refusal_missing(const std::function<void()>& fn, const std::string& text) {
    try {
        fn();
        return "no error for '" + text + "'; ";
    } catch (const Error& e) {
        return std::string(e.what()).find(text) == std::string::npos ? std::string(e.what()) + "; " : "";
    }
}

TEST(MoeChunks, BadChunkCountsAreRejected) {
    // One rank: nothing to pipeline, so only 1 chunk.
    const MoeConfig config = testing::ep_config(EpCase{"one", 1, 1, 2, kDropless, {4}, false});
    auto device = make_device("cpu");
    auto stream = device->create_stream();
    MoeLayer single(config, *device, 4);
    EXPECT_EQ(single.max_chunks(), 1);
    MoeParamStore params(*device, config, DType::kF32);
    try {
        single.experts_chunk(params.view(), 0, 2, *stream);
        FAIL() << "2 chunks on one rank went through";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("chunks = 2 must be in [1, 1]"), std::string::npos) << e.what();
    }
    // Two ranks, 8 experts: 4 local experts, so 1..4 chunks; chunk indices in [0, chunks).
    const std::vector<std::string> errors = testing::on_local_ranks(2, [&](int, Communicator* comm) {
        auto dev = make_device("cpu");
        auto s = dev->create_stream();
        MoeLayer layer(config, *dev, 4, comm);
        const std::string out =
            refusal_missing([&] { layer.dispatch_chunk(0, 5, *s); }, "chunks = 5 must be in [1, 4]") +
            refusal_missing([&] { layer.collect_chunk(0, 0, *s); }, "chunks = 0 must be in [1, 4]") +
            refusal_missing([&] { layer.collect_backward_chunk(2, 2, *s); }, "chunk 2 of 2") +
            refusal_missing([&] { layer.dispatch_backward_chunk(-1, 2, *s); }, "chunk -1 of 2");
        SCMOE_CHECK(out.empty(), out);
    });
    for (const std::string& e : errors) EXPECT_EQ(e, "");
    // One expert per rank: up to kMaxRowPieces slices of its rows, and the message says so.
    const MoeConfig one = testing::ep_config(EpCase{"one", 1, 2, 1, kCap, {4, 4}, false, 2});
    const std::vector<std::string> slice_errors = testing::on_local_ranks(2, [&](int, Communicator* comm) {
        auto dev = make_device("cpu");
        auto s = dev->create_stream();
        MoeLayer layer(one, *dev, 4, comm);
        std::string out;
        if (!layer.row_sliced() || layer.max_chunks() != kMaxRowPieces) out += "not row-sliced to 4 pieces; ";
        MoeParamStore one_params(*dev, one, DType::kF32, 2), one_grads(*dev, one, DType::kF32, 2);
        // The slices' weight gradients add up: a backward piece out of order is refused.
        out += refusal_missing(
            [&] { layer.experts_backward_chunk(one_params.view(), one_grads.view(), 1, 2, *s); },
            "row slice 1 of 2 out of order (slice 0 is due)");
        out += refusal_missing([&] { layer.dispatch_chunk(0, kMaxRowPieces + 1, *s); },
                               "chunks = 5 must be in [1, 4] (one local expert: a chunk is a slice of its rows)");
        SCMOE_CHECK(out.empty(), out);
    });
    for (const std::string& e : slice_errors) EXPECT_EQ(e, "");
}

}  // namespace
}  // namespace scmoe
