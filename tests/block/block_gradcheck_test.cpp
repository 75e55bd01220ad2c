// BlockStack gradients against central finite differences (CPU, fp32) for every variant: the
// input, every backbone parameter and every MoE parameter, on sampled coordinates. The loss is
// <output, grad_output> + the MoE router losses, whose gradient backward() computes. A coordinate
// whose perturbation changes any routing (a jump of the loss) is skipped and counted.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "block_test_util.h"

namespace scmoe {
namespace {

using testing::StackResult;

struct GradCase {
    std::string variant;
    bool cg = true;
    DispatchMode dispatch = DispatchMode::kCapacity;
};

class BlockGradcheck : public ::testing::TestWithParam<GradCase> {};

TEST_P(BlockGradcheck, MatchesFiniteDifferences) {
    const GradCase c = GetParam();
    auto device = make_device("cpu");
    const BlockStackConfig config = testing::small_variant(c.variant, c.dispatch, c.cg);
    const std::int64_t T = 8, H = config.backbone.hidden;
    BlockStack stack(config, *device, T);
    testing::init_params(stack, 3);
    std::vector<float> x = testing::make_input(T, H, 11), gy = testing::make_input(T, H, 12);
    const StackResult an = testing::run_stack(stack, x, gy, true);

    std::vector<float> out(x.size());
    auto loss = [&]() {
        stack.forward(testing::host_tensor(x, T, H), testing::host_tensor(out, T, H), false);
        stack.synchronize();
        double l = stack.router_loss();
        for (std::size_t i = 0; i < out.size(); ++i) l += static_cast<double>(out[i]) * gy[i];
        return l;
    };
    // Routing fingerprint of the last forward: every MoE layer's experts and slots. Top-k selection
    // (and capacity) is piecewise constant: a coordinate whose +-eps changes it spans a jump, so its
    // finite difference says nothing about the gradient and is skipped (and counted).
    auto routing_stream = device->create_stream();
    auto routing = [&]() {
        std::vector<std::int32_t> f;
        for (MoeLayer* layer : stack.moe_layers()) {
            const MoeRouting r = layer->routing(*routing_stream);
            f.insert(f.end(), r.expert_index.begin(), r.expert_index.end());
            f.insert(f.end(), r.slot_of_choice.begin(), r.slot_of_choice.end());
        }
        return f;
    };
    loss();
    const std::vector<std::int32_t> base_routing = routing();
    const float eps = 5e-3f;
    int checked = 0, skipped = 0;
    // Checks `count` coordinates of `values` (perturbed in place) against the analytic gradient.
    auto check = [&](float* values, const float* analytic, std::int64_t n, const std::string& what) {
        float scale = 0;
        for (std::int64_t i = 0; i < n; ++i) scale = std::max(scale, std::abs(analytic[i]));
        const std::int64_t step = std::max<std::int64_t>(1, n / 5);
        for (std::int64_t i = (n > 1 ? 1 : 0); i < n; i += step) {
            const float keep = values[i];
            values[i] = keep + eps;
            const double up = loss();
            const bool up_flips = routing() != base_routing;
            values[i] = keep - eps;
            const double down = loss();
            const bool down_flips = routing() != base_routing;
            values[i] = keep;
            if (up_flips || down_flips) {
                ++skipped;
                continue;
            }
            const double fd = (up - down) / (2.0 * eps);
            EXPECT_NEAR(fd, analytic[i], 3e-3 + 3e-2 * scale) << c.variant << " " << what << "[" << i << "]";
            ++checked;
        }
    };
    check(x.data(), an.grad_in.data(), T * H, "input");
    const ParamSet& p = stack.backbone_params();
    std::int64_t off = 0;
    for (std::size_t i = 0; i < p.specs().size(); ++i) {
        check(static_cast<float*>(p[i].data), an.backbone_grads.data() + off, p.specs()[i].numel(), p.specs()[i].name);
        off += p.specs()[i].numel();
    }
    for (std::size_t m = 0; m < stack.moe_params().size(); ++m) {
        const auto specs = moe_param_specs(config.moe);
        const MoeParams& mp = stack.moe_params()[m]->view();
        std::int64_t moff = 0;
        std::size_t t = 0;
        for (const Tensor& tensor : mp) {
            const std::int64_t n = specs[t].numel();
            if (n) check(static_cast<float*>(tensor.data), an.moe_grads[m].data() + moff, n, "moe." + specs[t].name);
            moff += n;
            ++t;
        }
    }
    EXPECT_GT(checked, 50) << skipped << " coordinates skipped for a routing change";
    EXPECT_LE(skipped, checked / 2) << "too many routing changes for a fair check";
}

INSTANTIATE_TEST_SUITE_P(Cpu, BlockGradcheck,
                         ::testing::Values(GradCase{"top2"}, GradCase{"top1"}, GradCase{"shared"},
                                           GradCase{"scmoe-pos1"}, GradCase{"scmoe-pos2"}, GradCase{"scmoe-pos3"},
                                           GradCase{"scmoe2", true, DispatchMode::kDropless},
                                           GradCase{"scmoe-pos2", false, DispatchMode::kDropless},
                                           GradCase{"every-block-pos1"}, GradCase{"top3"},
                                           GradCase{"top3", true, DispatchMode::kDropless},
                                           GradCase{"every-block-top2"}, GradCase{"every-block-shared"},
                                           GradCase{"every-block-shared", false, DispatchMode::kDropless}),
                         [](const ::testing::TestParamInfo<GradCase>& p) {
                             return testing::gtest_name(p.param.variant + (p.param.cg ? "_cg1" : "_add") +
                                                        (p.param.dispatch == DispatchMode::kDropless ? "_dropless" : ""));
                         });

}  // namespace
}  // namespace scmoe
