// Bad input gives a clear scmoe::Error naming what is wrong, never a crash or silent garbage.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "kernels/error.h"
#include "test_util.h"

namespace scmoe {
namespace {

MoeConfig valid_config() {
    MoeConfig c;
    c.hidden = 8;
    c.ffn = 16;
    c.num_experts = 4;
    c.top_k = 2;
    return c;
}

// Runs f, expects an scmoe::Error whose message contains `needle`.
template <class F>
void expect_error(F&& f, const std::string& needle) {
    try {
        f();
        ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << "message: " << e.what();
    }
}

TEST(MoeConfigValidate, NamesTheField) {
    struct Bad {
        void (*mutate)(MoeConfig&);
        const char* field;
    };
    const Bad cases[] = {
        {[](MoeConfig& c) { c.hidden = 0; }, "MoeConfig.hidden"},
        {[](MoeConfig& c) { c.ffn = -3; }, "MoeConfig.ffn"},
        {[](MoeConfig& c) { c.num_experts = 0; }, "MoeConfig.num_experts"},
        {[](MoeConfig& c) { c.top_k = 3; }, "MoeConfig.top_k"},
        {[](MoeConfig& c) { c.num_experts = 1; }, "MoeConfig.top_k"},
        {[](MoeConfig& c) { c.capacity_factor = 0.0f; }, "MoeConfig.capacity_factor"},
        {[](MoeConfig& c) { c.capacity_factor = std::numeric_limits<float>::quiet_NaN(); }, "MoeConfig.capacity_factor"},
        {[](MoeConfig& c) { c.dtype = DType::kI32; }, "MoeConfig.dtype"},
        {[](MoeConfig& c) { c.coefficient_gate = true; }, "MoeConfig.coefficient_gate"},
        {[](MoeConfig& c) { c.noise_std = -1.0f; }, "MoeConfig.noise_std"},
        {[](MoeConfig& c) { c.aux_loss_coef = -1.0f; }, "MoeConfig.aux_loss_coef"},
        {[](MoeConfig& c) { c.version = 2; }, "MoeConfig.version"},
    };
    for (const Bad& b : cases) {
        MoeConfig c = valid_config();
        b.mutate(c);
        expect_error([&] { c.validate(); }, b.field);
    }
    EXPECT_NO_THROW(valid_config().validate());
    expect_error([] { parse_dispatch_mode("lossy"); }, "MoeConfig.dispatch");
    expect_error([] { parse_activation("relu"); }, "MoeConfig.activation");
}

TEST(MoeConfigHash, DiffersWhenAFieldDiffers) {
    MoeConfig a = valid_config(), b = valid_config();
    EXPECT_EQ(a.hash(), b.hash());
    b.capacity_factor = 1.5f;
    EXPECT_NE(a.hash(), b.hash());
    b = valid_config();
    b.noise_seed = 99;
    EXPECT_NE(a.hash(), b.hash());
}

TEST(MoeLayerInput, WrongDtypeForBackendIsRejected) {
    auto device = make_device("cpu");
    MoeConfig c = valid_config();
    c.dtype = DType::kBF16;
    expect_error([&] { MoeLayer layer(c, *device, 4); }, "computes in f32");
}

TEST(MoeLayerInput, ShapeMismatchesAreRejected) {
    testing::CpuLayerHarness h(valid_config(), 6, false);
    std::vector<float> wrong(6 * 7);
    Tensor y = testing::host_tensor(h.y, 6, 8);
    expect_error([&] { h.layer.forward(testing::host_tensor(wrong, 6, 7), Tensor(), h.params.view(), y, *h.stream); },
                 "MoeLayer.forward: x");
    // Parameter with a wrong shape.
    MoeParams p = h.params.view();
    p.expert_w1.dims[2] = 5;
    expect_error([&] { h.layer.forward(h.xt(), Tensor(), p, y, *h.stream); }, "MoeParams.expert_w1: expected [4, 8, 32]");
    // Parameter the config does not use.
    p = h.params.view();
    p.cg_w = Tensor(h.x.data(), DType::kF32, {8, 1});
    expect_error([&] { h.layer.forward(h.xt(), Tensor(), p, y, *h.stream); }, "MoeParams.cg_w is set");
    // Output with the wrong number of tokens.
    expect_error(
        [&] { h.layer.forward(h.xt(), Tensor(), h.params.view(), testing::host_tensor(h.y, 3, 16), *h.stream); },
        "MoeLayer.forward: y");
}

TEST(MoeLayerInput, TooManyTokensIsRejected) {
    testing::CpuLayerHarness h(valid_config(), 6, false);
    std::vector<float> big(7 * 8);
    Tensor y = testing::host_tensor(big, 7, 8);
    expect_error([&] { h.layer.forward(testing::host_tensor(big, 7, 8), Tensor(), h.params.view(), y, *h.stream); },
                 "MoeLayer.route: shortcut has [7, 8] f32; expected [tokens <= 6, 8]");
}

TEST(MoeLayerInput, NaNInInputIsReportedWithItsPosition) {
    testing::CpuLayerHarness h(valid_config(), 6, false);
    h.x[2 * 8 + 5] = std::numeric_limits<float>::quiet_NaN();
    h.x[4 * 8 + 1] = std::numeric_limits<float>::infinity();
    expect_error([&] { h.forward(); }, "holds 2 NaN/Inf value(s), first at [token 2, column 5]");
    // The layer works again once the input is clean.
    h.x[2 * 8 + 5] = 0.0f;
    h.x[4 * 8 + 1] = 0.0f;
    EXPECT_NO_THROW(h.forward());
    for (float v : h.y) ASSERT_TRUE(std::isfinite(v));
}

TEST(MoeLayerInput, NaNInSeparateXAndInGradientAreReported) {
    MoeConfig c = valid_config();
    c.shared_expert = true;
    testing::CpuLayerHarness h(c, 6, true);
    h.x[3] = std::numeric_limits<float>::quiet_NaN();
    expect_error([&] { h.forward(); }, "input x of forward");
    h.x[3] = 0.0f;
    h.forward();
    h.grad_y[9] = -std::numeric_limits<float>::infinity();
    expect_error([&] { h.backward(); }, "grad_y of backward holds 1 NaN/Inf");
}

TEST(MoeLayerInput, WorkspaceTooSmallIsRejected) {
    auto device = make_device("cpu");
    const std::size_t need = MoeLayer::workspace_bytes(valid_config(), 16);
    DeviceBuffer ws(*device, need - 256);
    expect_error([&] { MoeLayer layer(valid_config(), *device, 16, nullptr, ws.data(), ws.bytes()); }, "workspace");
}

TEST(MoeLayerInput, BackwardGradShortcutRulesAreChecked) {
    testing::CpuLayerHarness h(valid_config(), 6, false);
    h.forward();
    // Without a shortcut in forward, a separate grad_shortcut makes no sense... unless there is no
    // shared expert (then x feeds only the routed path and both views are the same input).
    MoeConfig c = valid_config();
    c.shared_expert = true;
    testing::CpuLayerHarness hs(c, 6, false);
    hs.forward();
    expect_error(
        [&] {
            hs.layer.backward(testing::host_tensor(hs.grad_y, 6, 8), hs.params.view(), hs.grads.view(),
                              testing::host_tensor(hs.grad_x, 6, 8), testing::host_tensor(hs.grad_s, 6, 8),
                              *hs.stream);
        },
        "grad_shortcut must be undefined");
}

}  // namespace
}  // namespace scmoe
