// The GPU block test's CPU reference is well-conditioned (tests/block/bf16_block_case.h says why it
// must be): changing every parameter by a random relative amount up to 2^-8 (then rounded to bf16
// again: about half the values move by one bf16 ulp, as rounding noise does) changes no routing
// decision of any MoE layer and moves the output
// and every gradient by at most a fifth of the GPU test's tolerance. Without decisive_routing most
// cases fail this (flipped choices; every-block-pos1-gqa's output moved 28%): the GPU test's
// failure of 2026-11-27 on an H100 was such a flip. Runs on the CPU, so CI checks it.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "bf16_block_case.h"

namespace scmoe {
namespace {

void perturb(void* data, std::int64_t n, std::mt19937& rng) {
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    auto* p = static_cast<float*>(data);
    for (std::int64_t i = 0; i < n; ++i) p[i] = math::round_to_bf16(p[i] * (1.0f + std::ldexp(u(rng), -8)));
}

class Bf16BlockCase : public ::testing::TestWithParam<std::string> {};

TEST_P(Bf16BlockCase, ReferenceIsWellConditioned) {
    auto cpu = make_device("cpu");
    testing::Bf16Case ref(GetParam(), *cpu);
    const testing::StackResult want = testing::run_stack(ref.stack, ref.x, ref.gy, false);
    ASSERT_EQ(testing::unwritten(want), "");
    const auto want_routing = testing::expert_choices(ref.stack);
    const int top_k = ref.stack.config().moe.top_k;
    double worst_out = 0, worst_grad = 0;
    for (std::uint32_t seed = 0; seed < 6; ++seed) {
        SCOPED_TRACE("perturbation " + std::to_string(seed));
        testing::Bf16Case c(GetParam(), *cpu);
        std::mt19937 rng(seed);
        perturb(c.stack.backbone_params().data(), c.stack.backbone_params().numel(), rng);
        for (const auto& m : c.stack.moe_params()) perturb(m->data(), m->numel(), rng);
        const testing::StackResult got = testing::run_stack(c.stack, c.x, c.gy, false);
        EXPECT_EQ(testing::routing_diff(testing::expert_choices(c.stack), want_routing, top_k), "");
        worst_out = std::max(worst_out, testing::relative_l2(got.out, want.out));
        worst_grad = std::max({worst_grad, testing::relative_l2(got.grad_in, want.grad_in),
                               testing::relative_l2(got.backbone_grads, want.backbone_grads)});
        for (std::size_t m = 0; m < want.moe_grads.size(); ++m)
            worst_grad = std::max(worst_grad, testing::relative_l2(got.moe_grads[m], want.moe_grads[m]));
    }
    std::printf("%s: largest relative L2 change: output %.4f, gradients %.4f\n", GetParam().c_str(), worst_out,
                worst_grad);
    EXPECT_LE(worst_out, testing::kBf16OutputTol / 5);
    EXPECT_LE(worst_grad, testing::kBf16GradTol / 5);
}

// The setup keeps the routing features out of every sublayer's output (their columns are zero in
// each wo and w2) and gives every router the identity on them: a setup that missed a projection
// (a renamed parameter) would leave the features to be overwritten and this test to pass by luck.
TEST(Bf16BlockCaseSetup, ClearsTheRoutingFeaturesOfEveryOutputProjection) {
    auto cpu = make_device("cpu");
    for (const std::string& variant : testing::bf16_block_cases()) {
        SCOPED_TRACE(variant);
        testing::Bf16Case c(variant, *cpu);
        const BlockStackConfig& config = c.stack.config();
        const std::int64_t H = config.backbone.hidden, E = config.moe.num_experts;
        int projections = 0;
        const ParamSet& bp = c.stack.backbone_params();
        for (std::size_t i = 0; i < bp.specs().size(); ++i) {
            const ParamSpec& s = bp.specs()[i];
            if (!(s.name.ends_with(".wo") || s.name.ends_with(".w2"))) continue;
            ++projections;
            const auto* w = static_cast<const float*>(bp[i].data);
            for (std::int64_t r = 0; r < s.numel() / H; ++r)
                for (std::int64_t e = 0; e < E; ++e) ASSERT_EQ(w[r * H + e], 0.0f) << s.name;
        }
        int expected = 0;  // one attention wo per block, one w2 per dense FFN
        for (const BlockSpec& b : config.blocks) expected += b.ffn == FfnKind::kDense ? 2 : 1;
        EXPECT_EQ(projections, expected);
        for (std::size_t t = 0; t < testing::sz(c.x.size() / H); ++t) {
            std::vector<float> features(c.x.begin() + static_cast<std::ptrdiff_t>(t * H),
                                        c.x.begin() + static_cast<std::ptrdiff_t>(t * H + E));
            std::sort(features.begin(), features.end());
            for (std::int64_t j = 1; j + 1 < E; ++j) EXPECT_EQ(features[j + 1], 2 * features[j]) << "token " << t;
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Bf16, Bf16BlockCase, ::testing::ValuesIn(testing::bf16_block_cases()),
                         [](const ::testing::TestParamInfo<std::string>& p) { return testing::gtest_name(p.param); });

}  // namespace
}  // namespace scmoe
