// Gradient accumulation (MoeLayer::set_grad_accumulation) on the CPU backend, fp32.
//
// 1. Two micro-batches A and B, accumulated, give the sum of their separate backwards, for every
//    parameter gradient (gate, experts, shared expert, CG-1 gate), in capacity and dropless mode,
//    with the router losses on. Tolerance per element: |acc - (gA + gB)| <= 1e-6 * (|gA| + |gB|) +
//    1e-7 * max|gA + gB|: the only difference allowed is BLAS adding gB's partial products into
//    gA's in its own order (a few fp32 roundings of terms no larger than |gA| + |gB|).
// 2. In dropless mode without gate noise and router losses (aux and z are per-batch terms), the
//    accumulated gradients equal those of one batch holding A then B. Tolerance per element:
//    |acc - g(A+B)| <= 1e-5 * max|g(A+B)| + 1e-7: the sums over tokens are split in two and
//    reordered, fp32 rounding relative to the tensor's scale.
// The micro-batches are small enough that, dropless, some expert receives no row in one of them:
// its slices must be left as they were, not zeroed (an empty group of the grouped GEMM).
// Input gradients are per pass: with accumulation on, grad_x is written, bit for bit as without.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "test_util.h"

namespace scmoe {
namespace {

using testing::host_tensor;
using testing::sz;

struct AccumCase {
    std::string name;
    DispatchMode dispatch;
    bool shared;
    bool separate_shortcut;
};

std::string case_name(const ::testing::TestParamInfo<AccumCase>& info) { return info.param.name; }

MoeConfig config_for(const AccumCase& c, bool router_losses) {
    MoeConfig cfg;
    cfg.hidden = 16;
    cfg.ffn = 24;
    cfg.num_experts = 8;
    cfg.top_k = 2;
    cfg.dispatch = c.dispatch;
    cfg.capacity_factor = 1.0f;  // capacity mode drops some tokens: accumulation must not care
    cfg.shared_expert = c.shared;
    cfg.coefficient_gate = c.shared;
    cfg.noise_std = 0.0f;
    if (!router_losses) {
        cfg.aux_loss_coef = 0.0f;
        cfg.z_loss_coef = 0.0f;
    }
    return cfg;
}

// One layer sized for both micro-batches together, and the inputs of the whole batch.
struct Accum : testing::Cpu {
    static constexpr std::int64_t kTokens = 12;  // micro-batches A = [0, 6), B = [6, 12)
    MoeConfig config;
    bool separate;
    MoeLayer layer;
    MoeParamStore params;
    std::vector<float> x, s, grad_y;

    Accum(const MoeConfig& c, bool separate_shortcut)
        : config(c),
          separate(separate_shortcut),
          layer(c, *device, kTokens),
          params(*device, c, DType::kF32),
          x(testing::random_floats(kTokens * c.hidden, 2)),
          s(testing::random_floats(kTokens * c.hidden, 3)),
          grad_y(testing::random_floats(kTokens * c.hidden, 4)) {
        testing::fill_uniform(static_cast<float*>(params.data()), params.numel(), 0.5f, 1);
    }
    ~Accum() {
        try {
            stream->synchronize();
        } catch (const std::exception&) {
        }
    }

    // Rows [first, first + n) of v.
    std::vector<float> rows(const std::vector<float>& v, std::int64_t first, std::int64_t n) const {
        const auto h = config.hidden;
        return {v.begin() + first * h, v.begin() + (first + n) * h};
    }

    struct Pass {
        std::vector<float> grad_x, grad_s;
        std::vector<std::int32_t> group_offsets;
    };

    // Forward and backward of tokens [first, first + n) into `grads`; returns the input gradients.
    Pass run(std::int64_t first, std::int64_t n, const MoeParamStore& grads) {
        const auto h = config.hidden;
        std::vector<float> xb = rows(x, first, n), sb = rows(s, first, n), gyb = rows(grad_y, first, n);
        std::vector<float> y(sz(n * h));
        Pass p;
        p.grad_x.assign(sz(n * h), testing::kUnwritten);
        p.grad_s.assign(sz(n * h), testing::kUnwritten);
        layer.forward(host_tensor(xb, n, h), separate ? host_tensor(sb, n, h) : Tensor(), params.view(),
                      host_tensor(y, n, h), *stream);
        p.group_offsets = layer.routing(*stream).group_offsets;
        layer.backward(host_tensor(gyb, n, h), params.view(), grads.view(), host_tensor(p.grad_x, n, h),
                       separate ? host_tensor(p.grad_s, n, h) : Tensor(), *stream);
        stream->synchronize();
        return p;
    }

    MoeParamStore fresh_grads() { return MoeParamStore(*device, config, DType::kF32); }
};

std::vector<float> values(const MoeParamStore& g) {
    const auto* p = static_cast<const float*>(g.data());
    return {p, p + g.numel()};
}

// Whether some expert got no rows in this pass (its weight-gradient group was empty).
bool some_expert_empty(const Accum::Pass& p) {
    for (std::size_t e = 0; e + 1 < p.group_offsets.size(); ++e)
        if (p.group_offsets[e + 1] == p.group_offsets[e]) return true;
    return false;
}

class MoeGradAccumulation : public ::testing::TestWithParam<AccumCase> {};

TEST_P(MoeGradAccumulation, TwoMicroBatchesAccumulateToTheSumOfTheirBackwards) {
    Accum t(config_for(GetParam(), /*router_losses=*/true), GetParam().separate_shortcut);
    constexpr std::int64_t kHalf = Accum::kTokens / 2;
    MoeParamStore ga = t.fresh_grads(), gb = t.fresh_grads(), acc = t.fresh_grads();
    const Accum::Pass pa = t.run(0, kHalf, ga);
    const Accum::Pass pb = t.run(kHalf, kHalf, gb);
    // Dropless groups are ragged (capacity groups always hold capacity rows, padding included).
    if (GetParam().dispatch == DispatchMode::kDropless) {
        ASSERT_TRUE(some_expert_empty(pa) || some_expert_empty(pb))
            << "the micro-batches should leave some expert without rows (an empty weight-gradient group)";
    }

    t.layer.set_grad_accumulation(true);
    EXPECT_TRUE(t.layer.grad_accumulation());
    t.run(0, kHalf, acc);  // acc starts at zero (a fresh store is zero-filled)
    const Accum::Pass pb_acc = t.run(kHalf, kHalf, acc);

    const std::vector<float> a = values(ga), b = values(gb), got = values(acc);
    double scale = 0;
    for (std::size_t i = 0; i < a.size(); ++i) scale = std::max(scale, std::fabs(double(a[i]) + b[i]));
    ASSERT_GT(scale, 0.0);
    int bad = 0;
    std::size_t first_bad = 0;
    double worst = 0;  // the largest |acc - (gA + gB)| / max|gA + gB|, printed for the record
    for (std::size_t i = 0; i < a.size(); ++i) {
        const double want = double(a[i]) + b[i];
        const double tol = 1e-6 * (std::fabs(a[i]) + std::fabs(b[i])) + 1e-7 * scale;
        worst = std::max(worst, std::fabs(got[i] - want) / scale);
        if (!(std::fabs(got[i] - want) <= tol) && bad++ == 0) first_bad = i;
    }
    std::printf("%s: %zu gradient elements, max |acc - (gA + gB)| = %.3g x max|gA + gB|\n", GetParam().name.c_str(),
                a.size(), worst);
    EXPECT_EQ(bad, 0) << "first at element " << first_bad << ": accumulated " << got[first_bad] << ", gA + gB "
                      << double(a[first_bad]) + b[first_bad] << " (gA " << a[first_bad] << ", gB " << b[first_bad]
                      << ")";
    // Input gradients are per pass, written the same with accumulation on.
    EXPECT_TRUE(testing::bitwise_equal(pb_acc.grad_x, pb.grad_x));
    if (GetParam().separate_shortcut) {
        EXPECT_TRUE(testing::bitwise_equal(pb_acc.grad_s, pb.grad_s));
    }
}

// Accumulation off again: backward overwrites (stale contents do not leak into the gradients).
TEST_P(MoeGradAccumulation, OffAgainBackwardOverwrites) {
    Accum t(config_for(GetParam(), true), GetParam().separate_shortcut);
    MoeParamStore want = t.fresh_grads(), got = t.fresh_grads();
    t.run(0, Accum::kTokens, want);
    testing::fill_uniform(static_cast<float*>(got.data()), got.numel(), 100.0f, 9);  // stale values
    t.layer.set_grad_accumulation(true);
    t.layer.set_grad_accumulation(false);
    t.run(0, Accum::kTokens, got);
    EXPECT_TRUE(testing::bitwise_equal(values(got), values(want)));
}

INSTANTIATE_TEST_SUITE_P(Cases, MoeGradAccumulation,
                         ::testing::Values(AccumCase{"capacity", DispatchMode::kCapacity, false, false},
                                           AccumCase{"dropless", DispatchMode::kDropless, false, false},
                                           AccumCase{"dropless_shared_cg_shortcut", DispatchMode::kDropless, true,
                                                     true},
                                           AccumCase{"capacity_shared_cg_shortcut", DispatchMode::kCapacity, true,
                                                     true}),
                         case_name);

class MoeGradAccumulationDropless : public ::testing::TestWithParam<AccumCase> {};

TEST_P(MoeGradAccumulationDropless, TwoMicroBatchesEqualOneBatchHoldingBoth) {
    Accum t(config_for(GetParam(), /*router_losses=*/false), GetParam().separate_shortcut);
    constexpr std::int64_t kHalf = Accum::kTokens / 2;
    MoeParamStore whole = t.fresh_grads(), acc = t.fresh_grads();
    t.run(0, Accum::kTokens, whole);
    t.layer.set_grad_accumulation(true);
    const Accum::Pass pa = t.run(0, kHalf, acc);
    const Accum::Pass pb = t.run(kHalf, kHalf, acc);
    ASSERT_TRUE(some_expert_empty(pa) || some_expert_empty(pb));

    const std::vector<float> w = values(whole), got = values(acc);
    double scale = 0;
    for (float v : w) scale = std::max(scale, double(std::fabs(v)));
    ASSERT_GT(scale, 0.0);
    double worst = 0;
    std::size_t at = 0;
    for (std::size_t i = 0; i < w.size(); ++i) {
        const double err = std::fabs(double(got[i]) - w[i]);
        if (!(err <= worst)) {
            worst = err;
            at = i;
        }
    }
    std::printf("%s: %zu gradient elements, max |acc - g(A+B)| = %.3g x max|g(A+B)|\n", GetParam().name.c_str(),
                w.size(), worst / scale);
    EXPECT_LE(worst, 1e-5 * scale + 1e-7) << "element " << at << ": accumulated " << got[at] << ", one batch "
                                          << w[at] << " (max |g| " << scale << ")";
}

INSTANTIATE_TEST_SUITE_P(Cases, MoeGradAccumulationDropless,
                         ::testing::Values(AccumCase{"plain", DispatchMode::kDropless, false, false},
                                           AccumCase{"shared_cg_shortcut", DispatchMode::kDropless, true, true}),
                         case_name);

}  // namespace
}  // namespace scmoe
