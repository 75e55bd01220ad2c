// BlockStack::calibrate runs the passes' ops to time them, more than once, and a row slice's weight
// gradients add into the earlier slices'. A stack whose MoE layers accumulate their gradients over
// micro-batches (MoeLayer::set_grad_accumulation) must come out of it with those gradients as they
// were: two accumulated micro-batches with a calibration between them give bitwise the gradients of
// the same two without it.
#include <gtest/gtest.h>

#include "block_test_util.h"

namespace scmoe {
namespace {

// Every MoE gradient of the stack after micro-batches a, then b, accumulated; `calibrate_between`:
// calibrate on other data between them.
std::vector<std::vector<float>> accumulated_moe_grads(bool calibrate_between) {
    auto device = make_device("cpu");
    const std::int64_t T = 8;
    BlockStack stack(testing::small_variant("scmoe-pos2"), *device, T);
    testing::init_params(stack, 5);
    for (MoeLayer* layer : stack.moe_layers()) layer->set_grad_accumulation(true);
    const std::int64_t H = stack.config().backbone.hidden;
    auto pass = [&](std::uint64_t seed) {
        std::vector<float> x = testing::make_input(T, H, seed), gy = testing::make_input(T, H, seed + 1);
        std::vector<float> y(x.size()), gx(x.size());
        stack.forward(testing::host_tensor(x, T, H), testing::host_tensor(y, T, H), true);
        stack.backward(testing::host_tensor(gy, T, H), testing::host_tensor(gx, T, H), true);
        stack.synchronize();
    };
    for (const auto& g : stack.moe_grads()) std::fill_n(static_cast<float*>(g->data()), g->numel(), 0.0f);
    pass(10);
    if (calibrate_between) {
        std::vector<float> x = testing::make_input(T, H, 50), gy = testing::make_input(T, H, 51);
        stack.calibrate(testing::host_tensor(x, T, H), testing::host_tensor(gy, T, H), 2);
    }
    pass(20);
    std::vector<std::vector<float>> out;
    for (const auto& g : stack.moe_grads()) {
        const auto* p = static_cast<const float*>(g->data());
        out.emplace_back(p, p + g->numel());
    }
    return out;
}

TEST(BlockCalibrate, KeepsTheAccumulatedMoeGradients) {
    const auto plain = accumulated_moe_grads(false), calibrated = accumulated_moe_grads(true);
    ASSERT_EQ(plain.size(), calibrated.size());
    ASSERT_FALSE(plain.empty());
    for (std::size_t m = 0; m < plain.size(); ++m) EXPECT_EQ(plain[m], calibrated[m]) << "MoE block " << m;
}

}  // namespace
}  // namespace scmoe
