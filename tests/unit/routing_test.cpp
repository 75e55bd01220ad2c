// Routing tables a person can check by hand, and the routing edge cases: zero tokens, all tokens to
// one expert, empty experts, capacity overflow (drops counted exactly), ties.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <utility>
#include <vector>

#include "scmoe/kernels/error.h"
#include "scmoe/kernels/layout.h"
#include "scmoe/kernels/math.h"
#include "scmoe/kernels/router.h"
#include "test_util.h"

namespace scmoe {
namespace {

using I = std::vector<std::int32_t>;

struct LayoutResult {
    I counts, offsets, slots, choice_of_row;
    std::int32_t dropped = -1;
};

LayoutResult run_layout(const I& expert_index, std::int64_t tokens, int experts, int top_k, std::int64_t capacity) {
    auto device = make_device("cpu");
    auto stream = device->create_stream();
    LayoutResult r;
    r.counts.resize(static_cast<std::size_t>(experts));
    r.offsets.resize(static_cast<std::size_t>(experts + 1));
    r.slots.resize(expert_index.size());
    r.choice_of_row.resize(static_cast<std::size_t>(permuted_rows(tokens, experts, top_k, capacity)));
    LayoutArgs a{tokens,          experts,          top_k,          capacity,   expert_index.data(), r.counts.data(),
                 r.offsets.data(), r.slots.data(), r.choice_of_row.data(), &r.dropped};
    compute_layout(a, *stream);
    stream->synchronize();
    return r;
}

// t0 -> (0, 1), t1 -> (0, 2), t2 -> (0, 1), t3 -> (1, 0), t4 -> (2, 0); 3 experts, top-2.
const I kTable = {0, 1, 0, 2, 0, 1, 1, 0, 2, 0};

TEST(Layout, CapacityTableByHand) {
    // C = 2. First choices in token order: t0->e0 row0, t1->e0 row1, t2->e0 full (drop), t3->e1 row2,
    // t4->e2 row4. Second choices: t0->e1 row3, t1->e2 row5, t2->e1 (e1 full: drop), t3->e0 drop,
    // t4->e0 drop.
    LayoutResult r = run_layout(kTable, 5, 3, 2, 2);
    EXPECT_EQ(r.counts, (I{5, 3, 2}));
    EXPECT_EQ(r.offsets, (I{0, 2, 4, 6}));
    EXPECT_EQ(r.slots, (I{0, 3, 1, 5, -1, -1, 2, -1, 4, -1}));
    EXPECT_EQ(r.choice_of_row, (I{0, 2, 6, 1, 8, 3}));
    EXPECT_EQ(r.dropped, 4);
}

TEST(Layout, DroplessTableByHand) {
    // e0 rows 0-4: t0, t1, t2 (first choices), t3, t4 (second); e1 rows 5-7: t3 | t0, t2; e2 rows 8-9: t4 | t1.
    LayoutResult r = run_layout(kTable, 5, 3, 2, 0);
    EXPECT_EQ(r.counts, (I{5, 3, 2}));
    EXPECT_EQ(r.offsets, (I{0, 5, 8, 10}));
    EXPECT_EQ(r.slots, (I{0, 6, 1, 9, 2, 7, 5, 3, 8, 4}));
    EXPECT_EQ(r.choice_of_row, (I{0, 2, 4, 7, 9, 6, 1, 5, 8, 3}));
    EXPECT_EQ(r.dropped, 0);
}

// Top-3 over 4 experts: t0 -> (0, 1, 2), t1 -> (1, 0, 3), t2 -> (0, 3, 1), t3 -> (2, 0, 1).
const I kTop3Table = {0, 1, 2, 1, 0, 3, 0, 3, 1, 2, 0, 1};

TEST(Layout, Top3CapacityTableByHand) {
    // C = 2 per expert, rows e*2 .. e*2+1. First choices in token order: t0->e0 row0, t1->e1 row2,
    // t2->e0 row1, t3->e2 row4. Second: t0->e1 row3, t1->e0 full (drop), t2->e3 row6, t3->e0 drop.
    // Third: t0->e2 row5, t1->e3 row7, t2->e1 full (drop), t3->e1 drop.
    LayoutResult r = run_layout(kTop3Table, 4, 4, 3, 2);
    EXPECT_EQ(r.counts, (I{4, 4, 2, 2}));
    EXPECT_EQ(r.offsets, (I{0, 2, 4, 6, 8}));
    EXPECT_EQ(r.slots, (I{0, 3, 5, 2, -1, 7, 1, 6, -1, 4, -1, -1}));
    EXPECT_EQ(r.choice_of_row, (I{0, 6, 3, 1, 9, 2, 7, 5}));
    EXPECT_EQ(r.dropped, 4);
}

TEST(Layout, Top3DroplessTableByHand) {
    // e0 rows 0-3: t0, t2 (first choices), t1, t3 (second); e1 rows 4-7: t1 | t0 | t2, t3 (third);
    // e2 rows 8-9: t3 | t0; e3 rows 10-11: t2 | t1.
    LayoutResult r = run_layout(kTop3Table, 4, 4, 3, 0);
    EXPECT_EQ(r.counts, (I{4, 4, 2, 2}));
    EXPECT_EQ(r.offsets, (I{0, 4, 8, 10, 12}));
    EXPECT_EQ(r.slots, (I{0, 5, 9, 4, 2, 11, 1, 10, 6, 8, 3, 7}));
    EXPECT_EQ(r.choice_of_row, (I{0, 6, 4, 10, 3, 1, 8, 11, 9, 2, 7, 5}));
    EXPECT_EQ(r.dropped, 0);
}

TEST(Layout, EmptyExpertsAndPaddingRows) {
    // Everything to expert 3 of 4, top-1, C = 3: experts 0-2 empty, two assignments dropped.
    LayoutResult r = run_layout(I{3, 3, 3, 3, 3}, 5, 4, 1, 3);
    EXPECT_EQ(r.counts, (I{0, 0, 0, 5}));
    EXPECT_EQ(r.offsets, (I{0, 3, 6, 9, 12}));
    EXPECT_EQ(r.slots, (I{9, 10, 11, -1, -1}));
    EXPECT_EQ(r.choice_of_row, (I{-1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 1, 2}));
    EXPECT_EQ(r.dropped, 2);
}

TEST(Layout, ZeroTokens) {
    LayoutResult r = run_layout(I{}, 0, 4, 2, 0);
    EXPECT_EQ(r.counts, (I{0, 0, 0, 0}));
    EXPECT_EQ(r.offsets, (I{0, 0, 0, 0, 0}));
    EXPECT_EQ(r.dropped, 0);
}

TEST(Layout, RejectsExpertIndexOutOfRange) {
    EXPECT_THROW(run_layout(I{0, 7}, 2, 4, 1, 0), Error);
}

TEST(Capacity, Formula) {
    EXPECT_EQ(expert_capacity(10, 4, 2, 1.0f), 5);    // ceil(1.0 * 20 / 4)
    EXPECT_EQ(expert_capacity(10, 4, 2, 1.25f), 7);   // ceil(6.25)
    EXPECT_EQ(expert_capacity(1, 64, 1, 1.0f), 1);    // at least one slot
    EXPECT_EQ(expert_capacity(10, 4, 2, 3.0f), 10);   // at most the tokens: one row per token per expert
    EXPECT_EQ(expert_capacity(10, 4, 2, 1e30f), 10);  // --capacity-factor 1e30 ran with a garbage capacity
    EXPECT_EQ(expert_capacity(16, 8, 3, 1.25f), 8);   // top-3: ceil(1.25 * 48 / 8) = ceil(7.5)
    EXPECT_EQ(expert_capacity(16, 8, 3, 1.0f), 6);    // ceil(48 / 8)
    EXPECT_EQ(permuted_rows(16, 8, 3, 0), 48);        // dropless: every one of the T*k assignments
    EXPECT_EQ(permuted_rows(10, 4, 2, 7), 28);
    EXPECT_EQ(permuted_rows(10, 4, 2, 0), 20);
}

struct RouterResult {
    std::vector<float> probs, lse, weights, fraction, losses;
    I index;
};

RouterResult run_router(const std::vector<float>& logits, std::int64_t tokens, int experts, int top_k) {
    auto device = make_device("cpu");
    auto stream = device->create_stream();
    RouterResult r;
    r.probs.resize(logits.size());
    r.lse.resize(static_cast<std::size_t>(tokens));
    r.weights.resize(static_cast<std::size_t>(tokens * top_k));
    r.index.resize(r.weights.size());
    r.fraction.resize(static_cast<std::size_t>(experts));
    r.losses.resize(2);
    RouterForwardArgs a;
    a.tokens = tokens;
    a.num_experts = experts;
    a.top_k = top_k;
    a.logits = logits.data();
    a.probs = r.probs.data();
    a.logsumexp = r.lse.data();
    a.expert_index = r.index.data();
    a.gate_weight = r.weights.data();
    a.expert_fraction = r.fraction.data();
    a.losses = r.losses.data();
    router_forward(a, *stream);
    stream->synchronize();
    return r;
}

TEST(Router, Top2TableByHand) {
    const float l2 = std::log(2.0f), l3 = std::log(3.0f);
    // Token 0: probs 1/6, 2/6, 3/6 -> experts (2, 1), weights 3/5, 2/5.
    // Token 1: probs 1/2, 1/4, 1/4 -> expert 0, then the tie 1 vs 2 goes to 1; weights 2/3, 1/3.
    std::vector<float> logits = {0.0f, l2, l3, l2, 0.0f, 0.0f};
    RouterResult r = run_router(logits, 2, 3, 2);
    EXPECT_EQ(r.index, (I{2, 1, 0, 1}));
    EXPECT_NEAR(r.weights[0], 0.6f, 1e-6f);
    EXPECT_NEAR(r.weights[1], 0.4f, 1e-6f);
    EXPECT_NEAR(r.weights[2], 2.0f / 3.0f, 1e-6f);
    EXPECT_NEAR(r.weights[3], 1.0f / 3.0f, 1e-6f);
    EXPECT_NEAR(r.probs[0], 1.0f / 6.0f, 1e-6f);
    EXPECT_NEAR(r.probs[3], 0.5f, 1e-6f);
    EXPECT_NEAR(r.lse[0], std::log(6.0f), 1e-6f);
    EXPECT_NEAR(r.lse[1], std::log(4.0f), 1e-6f);
    // f = {1, 2, 1} / 4; P = {(1/6 + 1/2) / 2, (1/3 + 1/4) / 2, (1/2 + 1/4) / 2}
    EXPECT_EQ(r.fraction, (std::vector<float>{0.25f, 0.5f, 0.25f}));
    const double aux = 3.0 * (0.25 * (1.0 / 6 + 0.5) / 2 + 0.5 * (1.0 / 3 + 0.25) / 2 + 0.25 * (0.5 + 0.25) / 2);
    EXPECT_NEAR(r.losses[0], aux, 1e-6);
    const double z = (std::log(6.0) * std::log(6.0) + std::log(4.0) * std::log(4.0)) / 2;
    EXPECT_NEAR(r.losses[1], z, 1e-5);
}

TEST(Router, Top1WeightIsTheProbability) {
    RouterResult r = run_router({1.0f, 3.0f, 2.0f}, 1, 3, 1);
    EXPECT_EQ(r.index, (I{1}));
    EXPECT_NEAR(r.weights[0], r.probs[1], 0.0f);
}

TEST(Router, AllTiedGoesToLowestExperts) {
    RouterResult r = run_router(std::vector<float>(8, 0.5f), 2, 4, 2);
    EXPECT_EQ(r.index, (I{0, 1, 0, 1}));
    EXPECT_EQ(r.weights, (std::vector<float>{0.5f, 0.5f, 0.5f, 0.5f}));
}

TEST(Router, Top3TableByHand) {
    const float l2 = std::log(2.0f), l3 = std::log(3.0f), l4 = std::log(4.0f);
    // Token 0: probs {1, 2, 3, 4} / 10 -> experts (3, 2, 1), weights 4/9, 3/9, 2/9.
    // Token 1: probs {4, 1, 4, 1} / 10 -> the tie 0 vs 2 goes to 0, then 2, then the tie 1 vs 3 to 1;
    // weights 4/9, 4/9, 1/9.
    std::vector<float> logits = {0.0f, l2, l3, l4, l4, 0.0f, l4, 0.0f};
    RouterResult r = run_router(logits, 2, 4, 3);
    EXPECT_EQ(r.index, (I{3, 2, 1, 0, 2, 1}));
    const float want[] = {4.0f / 9, 3.0f / 9, 2.0f / 9, 4.0f / 9, 4.0f / 9, 1.0f / 9};
    for (int i = 0; i < 6; ++i) EXPECT_NEAR(r.weights[static_cast<std::size_t>(i)], want[i], 1e-6f) << "choice " << i;
    EXPECT_NEAR(r.lse[0], std::log(10.0f), 1e-6f);
    // f = share of the 6 assignments: {1, 2, 2, 1} / 6; P = {(1 + 4) / 20, (2 + 1) / 20, (3 + 4) / 20, (4 + 1) / 20}
    EXPECT_NEAR(r.fraction[0], 1.0f / 6, 1e-7f);
    EXPECT_NEAR(r.fraction[1], 2.0f / 6, 1e-7f);
    EXPECT_NEAR(r.fraction[2], 2.0f / 6, 1e-7f);
    EXPECT_NEAR(r.fraction[3], 1.0f / 6, 1e-7f);
    const double aux = 4.0 * (1.0 / 6 * 5 / 20 + 2.0 / 6 * 3 / 20 + 2.0 / 6 * 7 / 20 + 1.0 / 6 * 5 / 20);
    EXPECT_NEAR(r.losses[0], aux, 1e-6);
}

TEST(Router, EveryKUpToTheLimitChoosesDistinctExpertsInRankOrder) {
    // 8 experts with distinct logits per token: the k choices are the k largest, largest first, and
    // their weights (k >= 2: renormalised) sum to 1.
    const int E = 8;
    const std::int64_t T = 5;
    std::vector<float> logits(static_cast<std::size_t>(T * E));
    testing::fill_uniform(logits.data(), T * E, 2.0f, 17);
    for (int k = 1; k <= kMaxTopK; ++k) {
        RouterResult r = run_router(logits, T, E, k);
        for (std::int64_t t = 0; t < T; ++t) {
            std::vector<int> order(E);
            for (int e = 0; e < E; ++e) order[static_cast<std::size_t>(e)] = e;
            const float* p = r.probs.data() + t * E;
            std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p[a] > p[b]; });
            double sum = 0;
            for (int j = 0; j < k; ++j) {
                EXPECT_EQ(r.index[static_cast<std::size_t>(t * k + j)], order[static_cast<std::size_t>(j)])
                    << "k " << k << " token " << t << " choice " << j;
                sum += r.weights[static_cast<std::size_t>(t * k + j)];
            }
            if (k >= 2) {
                EXPECT_NEAR(sum, 1.0, 1e-6) << "k " << k << " token " << t;
            }
        }
    }
}

TEST(Router, AllTiedTop3GoesToTheThreeLowestExperts) {
    RouterResult r = run_router(std::vector<float>(10, -1.0f), 2, 5, 3);
    EXPECT_EQ(r.index, (I{0, 1, 2, 0, 1, 2}));
    for (float w : r.weights) EXPECT_NEAR(w, 1.0f / 3, 1e-7f);
}

TEST(Router, TopKOutsideTheLimitsIsNamed) {
    auto expect_error = [](int experts, int k, const std::string& needle) {
        try {
            run_router(std::vector<float>(static_cast<std::size_t>(2 * experts), 0.0f), 2, experts, k);
            ADD_FAILURE() << "router accepted top_k " << k << " of " << experts << " experts";
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
        }
    };
    expect_error(16, 9, "router: top_k = 9 outside [1, 8]");
    expect_error(4, 0, "router: top_k = 0 outside [1, 8]");
    expect_error(3, 4, "router: top_k = 4 exceeds num_experts = 3");
}

// A layer whose gate sends every token to expert 2 (and, top-2, the tied rest to expert 0).
MoeConfig one_expert_config(DispatchMode mode) {
    MoeConfig c;
    c.hidden = 4;
    c.ffn = 3;
    c.num_experts = 4;
    c.top_k = 2;
    c.dispatch = mode;
    c.capacity_factor = 1.0f;
    return c;
}

void send_all_to_expert2(testing::CpuLayerHarness& h) {
    for (float& v : h.x) v = std::abs(v) + 0.1f;
    auto* gate = h.params.view().gate_w.as<float>();
    for (std::int64_t i = 0; i < h.config.hidden * h.config.num_experts; ++i) gate[i] = i % 4 == 2 ? 1.0f : 0.0f;
}

TEST(Routing, AllTokensToOneExpertCapacityDropsExactly) {
    testing::CpuLayerHarness h(one_expert_config(DispatchMode::kCapacity), 8, false);
    send_all_to_expert2(h);
    h.forward();
    MoeStats s = h.layer.stats(*h.stream);
    EXPECT_EQ(s.capacity, 4);  // ceil(1.0 * 8 * 2 / 4)
    EXPECT_EQ(s.expert_counts, (I{8, 0, 8, 0}));
    EXPECT_EQ(s.dropped_tokens, 8);  // 4 over capacity on expert 2, 4 on expert 0
    MoeRouting r = h.layer.routing(*h.stream);
    for (int t = 0; t < 8; ++t) {
        EXPECT_EQ(r.expert_index[2 * t], 2);
        EXPECT_EQ(r.expert_index[2 * t + 1], 0);
        EXPECT_EQ(r.slot_of_choice[2 * t], t < 4 ? 8 + t : -1) << "token " << t;
        EXPECT_EQ(r.slot_of_choice[2 * t + 1], t < 4 ? t : -1) << "token " << t;
    }
    // Dropped tokens (both choices dropped) produce exactly zero output.
    for (std::int64_t i = 4 * 4; i < 8 * 4; ++i) EXPECT_EQ(h.y[static_cast<std::size_t>(i)], 0.0f);
}

TEST(Routing, AllTokensToOneExpertDropless) {
    testing::CpuLayerHarness h(one_expert_config(DispatchMode::kDropless), 8, false);
    send_all_to_expert2(h);
    h.forward();
    MoeStats s = h.layer.stats(*h.stream);
    EXPECT_EQ(s.dropped_tokens, 0);
    MoeRouting r = h.layer.routing(*h.stream);
    EXPECT_EQ(r.group_offsets, (I{0, 8, 8, 16, 16}));
    h.backward();  // empty experts 1 and 3 get zero weight gradients
    const auto* gw1 = h.grads.view().expert_w1.as<float>();
    const std::int64_t per_expert = h.config.hidden * h.config.expert_inner_width();
    for (std::int64_t i = 0; i < per_expert; ++i) {
        EXPECT_EQ(gw1[1 * per_expert + i], 0.0f);
        EXPECT_EQ(gw1[3 * per_expert + i], 0.0f);
    }
}

TEST(Routing, ZeroTokensForwardAndBackward) {
    MoeConfig c = one_expert_config(DispatchMode::kCapacity);
    c.shared_expert = true;
    testing::CpuLayerHarness h(c, 0, false);
    h.forward();
    h.backward();
    MoeStats s = h.layer.stats(*h.stream);
    EXPECT_EQ(s.tokens, 0);
    EXPECT_EQ(s.dropped_tokens, 0);
    EXPECT_EQ(s.expert_counts, (I{0, 0, 0, 0}));
    const auto* g = static_cast<const float*>(h.grads.data());
    for (std::int64_t i = 0; i < h.grads.numel(); ++i) ASSERT_EQ(g[i], 0.0f) << "gradient element " << i;
}

// ---- Noisy gate: fresh noise per training forward and per stream, reproducible from the key ----

MoeConfig noisy_config(float noise_std = 1.0f) {
    MoeConfig c;
    c.hidden = 8;
    c.ffn = 6;
    c.num_experts = 4;
    c.top_k = 2;
    c.noise_std = noise_std;
    return c;
}

// The gate weights of one forward: they move with every change of the noise.
std::vector<float> gate_weights_of_forward(testing::CpuLayerHarness& h) {
    h.forward();
    return h.layer.routing(*h.stream).gate_weight;
}

TEST(NoisyGate, SuccessiveTrainingForwardsDrawFreshNoise) {
    testing::CpuLayerHarness h(noisy_config(), 16, false);
    const std::vector<float> first = gate_weights_of_forward(h);
    const std::vector<float> second = gate_weights_of_forward(h);
    EXPECT_FALSE(testing::bitwise_equal(first, second)) << "the same input got the same noise twice";
    EXPECT_EQ(h.layer.noise_step(), 2u);  // one step per training forward
}

TEST(NoisyGate, TheKeyReproducesTheNoiseBitwise) {
    testing::CpuLayerHarness h(noisy_config(), 16, false), other(noisy_config(), 16, false);
    h.layer.set_noise_key(5, 3);
    const std::vector<float> keyed = gate_weights_of_forward(h);
    EXPECT_EQ(h.layer.noise_step(), 6u);
    gate_weights_of_forward(h);  // step 6: other noise
    h.layer.set_noise_key(5, 3);
    EXPECT_TRUE(testing::bitwise_equal(gate_weights_of_forward(h), keyed));
    other.layer.set_noise_key(5, 3);  // another layer object, same config, input and key
    EXPECT_TRUE(testing::bitwise_equal(gate_weights_of_forward(other), keyed));
}

TEST(NoisyGate, StreamsAndStepsDrawDifferentNoise) {
    testing::CpuLayerHarness h(noisy_config(), 16, false);
    EXPECT_EQ(h.layer.noise_stream(), 0u);  // the ep rank
    std::vector<std::vector<float>> seen;
    for (auto [step, stream] : {std::pair<std::uint64_t, std::uint64_t>{5, 3}, {5, 4}, {6, 3}, {3, 5}, {0, 0}}) {
        h.layer.set_noise_key(step, stream);
        const std::vector<float> w = gate_weights_of_forward(h);
        for (const auto& prev : seen) EXPECT_FALSE(testing::bitwise_equal(w, prev)) << step << ", " << stream;
        seen.push_back(w);
    }
    // No collisions over a grid of (stream, step), swapped and shifted pairs included.
    std::set<std::uint64_t> keys;
    for (std::uint64_t stream = 0; stream < 64; ++stream)
        for (std::uint64_t step = 0; step < 64; ++step) keys.insert(math::noise_key(0x5c3e, stream, step));
    EXPECT_EQ(keys.size(), 64u * 64u);
    EXPECT_NE(math::noise_key(1, 2, 3), math::noise_key(2, 2, 3));
}

TEST(NoisyGate, EvalModeAddsNoNoiseAndKeepsTheStep) {
    testing::CpuLayerHarness noisy(noisy_config(), 16, false), clean(noisy_config(0.0f), 16, false);
    noisy.layer.set_training(false);
    EXPECT_TRUE(testing::bitwise_equal(gate_weights_of_forward(noisy), gate_weights_of_forward(clean)));
    EXPECT_TRUE(testing::bitwise_equal(gate_weights_of_forward(noisy), gate_weights_of_forward(clean)));
    EXPECT_EQ(noisy.layer.noise_step(), 0u);
    noisy.layer.set_training(true);
    EXPECT_FALSE(testing::bitwise_equal(gate_weights_of_forward(noisy), gate_weights_of_forward(clean)));
}

// The CPU router adds exactly noise_std * normal_sample(noise_key(seed, stream, step), t * E + e),
// the per-element math the CUDA router shares (scmoe/kernels/math.h).
TEST(NoisyGate, CpuRouterAddsTheSharedNoiseMath) {
    const std::int64_t T = 5;
    const int E = 4, K = 2;
    const std::vector<float> logits = testing::random_floats(T * E, 11);
    auto device = make_device("cpu");
    auto stream = device->create_stream();
    std::vector<float> probs(logits.size()), lse(T), weights(T * K), fraction(E), losses(2);
    I index(T * K);
    RouterForwardArgs a;
    a.tokens = T;
    a.num_experts = E;
    a.top_k = K;
    a.noise_std = 0.7f;
    a.noise_seed = 42;
    a.noise_stream = 3;
    a.noise_step = 9;
    a.logits = logits.data();
    a.probs = probs.data();
    a.logsumexp = lse.data();
    a.expert_index = index.data();
    a.gate_weight = weights.data();
    a.expert_fraction = fraction.data();
    a.losses = losses.data();
    router_forward(a, *stream);
    stream->synchronize();
    const std::uint64_t key = math::noise_key(42, 3, 9);
    for (std::int64_t t = 0; t < T; ++t) {
        float p[4];
        for (int e = 0; e < E; ++e)
            p[e] = logits[t * E + e] + 0.7f * math::normal_sample(key, static_cast<std::uint64_t>(t * E + e));
        int best[2];
        float w[2];
        const float l = math::route_token(p, E, K, best, w);
        EXPECT_EQ(l, lse[t]) << "token " << t;
        for (int e = 0; e < E; ++e) EXPECT_EQ(p[e], probs[t * E + e]) << "token " << t << " expert " << e;
        for (int j = 0; j < K; ++j) {
            EXPECT_EQ(best[j], index[t * K + j]);
            EXPECT_EQ(w[j], weights[t * K + j]);
        }
    }
}

}  // namespace
}  // namespace scmoe
