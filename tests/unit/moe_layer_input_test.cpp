// Bad input gives a clear scmoe::Error naming what is wrong, never a crash or silent garbage.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>

#include "scmoe/kernels/emu/emu_device.h"
#include "scmoe/kernels/error.h"
#include "scmoe/kernels/router.h"
#include "scmoe/kernels/workspace.h"
#include "scmoe/moe/params.h"
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
        {[](MoeConfig& c) { c.top_k = 0; }, "MoeConfig.top_k = 0: must be in [1, 8]"},
        {[](MoeConfig& c) { c.top_k = 5; }, "MoeConfig.top_k = 5: exceeds num_experts = 4"},
        {[](MoeConfig& c) { c.num_experts = 1; }, "MoeConfig.top_k = 2: exceeds num_experts = 1"},
        {[](MoeConfig& c) {
             c.num_experts = 16;
             c.top_k = 9;
         },
         "MoeConfig.top_k = 9: must be in [1, 8]"},
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

// Any k from 1 to min(E, kMaxTopK) is a valid config (the paper's top-3 among them).
TEST(MoeConfigValidate, EveryTopKUpToTheExpertsAndTheKernelLimitIsValid) {
    for (int experts : {1, 3, 8, 16})
        for (int k = 1; k <= std::min(experts, kMaxTopK); ++k) {
            MoeConfig c = valid_config();
            c.num_experts = experts;
            c.top_k = k;
            EXPECT_NO_THROW(c.validate()) << experts << " experts, top_k " << k;
        }
}

// Found by tests/fuzz/config_fuzz (corpus/config/regression-expert-width-overflow.bin): validate()
// accepted any positive ffn, so expert_inner_width() (2 x ffn for SwiGLU) overflowed (UBSan:
// "2 * 7710463101583943477"), as did the weights' sizes derived from it.
TEST(MoeConfigValidate, WeightSizesThatOverflowAreRefused) {
    constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
    MoeConfig c = valid_config();
    c.ffn = 7710463101583943477;
    expect_error([&] { c.validate(); }, "MoeConfig.ffn");
    c.activation = Activation::kGeLU;  // inner width ffn: still, hidden x ffn overflows
    expect_error([&] { c.validate(); }, "MoeConfig.ffn");
    c = valid_config();
    c.hidden = kMax / 64;  // hidden x 2F fits; only the 4 experts' copies overflow
    expect_error([&] { c.validate(); }, "MoeConfig.ffn");
    c = valid_config();
    c.shared_expert = true;
    c.shared_ffn = kMax / 4;
    expect_error([&] { c.validate(); }, "MoeConfig.shared_ffn");
    c.shared_ffn = 1 << 20;
    EXPECT_NO_THROW(c.validate());
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

// The message names what the caller passed (x, or x and the shortcut; route's routed input) and
// says the tokens exceed max_tokens.
TEST(MoeLayerInput, TooManyTokensIsRejected) {
    MoeConfig c = valid_config();
    c.shared_expert = true;
    testing::CpuLayerHarness h(c, 6, false);
    std::vector<float> big(7 * 8), big_s(7 * 8);
    Tensor y = testing::host_tensor(big, 7, 8);
    try {
        h.layer.forward(testing::host_tensor(big, 7, 8), Tensor(), h.params.view(), y, *h.stream);
        ADD_FAILURE() << "no error for 7 tokens > max_tokens 6";
    } catch (const Error& e) {
        const std::string m = e.what();
        EXPECT_NE(m.find("MoeLayer.forward: x has 7 tokens ([7, 8] f32) > max_tokens = 6"), std::string::npos) << m;
        EXPECT_EQ(m.find("shortcut"), std::string::npos) << "no shortcut was given: " << m;
    }
    expect_error(
        [&] {
            h.layer.forward(testing::host_tensor(big, 7, 8), testing::host_tensor(big_s, 7, 8), h.params.view(), y,
                            *h.stream);
        },
        "MoeLayer.forward: x and shortcut have 7 tokens ([7, 8] f32) > max_tokens = 6");
    expect_error([&] { h.layer.route(testing::host_tensor(big, 7, 8), h.params.view(), *h.stream); },
                 "MoeLayer.route: routed input (shortcut, or x) [7, 8] f32 has 7 tokens > max_tokens = 6");
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

// check_finite is a device count read at the next sync (review L2): on an emulated GPU, where ops
// are kernels and a host task is a driver callback as on CUDA, it adds no host task to the stream
// (on CUDA those stall every other stream's callbacks). On the CPU, two forwards enqueued back to
// back keep their own results: the first one's NaN is reported at the one sync after both.
TEST(MoeLayerInput, NonFiniteCheckAddsNoHostTaskAndKeepsEachPassResult) {
    auto emu = make_device("emu", 0, "a800");
    MoeConfig c = valid_config();
    c.shared_expert = true;
    c.dtype = DType::kBF16;
    const std::int64_t T = 6, H = c.hidden;
    const std::size_t bytes = static_cast<std::size_t>(T * H) * dtype_size(c.dtype);
    DeviceBuffer x(*emu, bytes), s(*emu, bytes), y(*emu, bytes);
    MoeParamStore params(*emu, c, c.dtype);
    auto& timeline = dynamic_cast<emu::EmuDevice&>(*emu).timeline();
    std::uint64_t tasks[2] = {0, 0};
    for (bool check : {false, true}) {
        c.check_finite = check;
        MoeLayer layer(c, *emu, T);
        auto stream = emu->create_stream();
        for (DeviceBuffer* b : {&x, &s}) stream->fill_zero(b->data(), bytes);
        const std::uint64_t before = timeline.stats().host_tasks;
        layer.forward(Tensor(x.data(), c.dtype, {T, H}), Tensor(s.data(), c.dtype, {T, H}), params.view(),
                      Tensor(y.data(), c.dtype, {T, H}), *stream);
        stream->synchronize();
        tasks[check] = timeline.stats().host_tasks - before;
    }
    EXPECT_EQ(tasks[1], tasks[0]) << "check_finite added host tasks to the stream";

    testing::CpuLayerHarness h(valid_config(), 6, false);
    std::vector<float> bad = h.x;
    bad[1 * 8 + 3] = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> y2(h.y.size());
    h.layer.forward(testing::host_tensor(bad, 6, 8), Tensor(), h.params.view(), testing::host_tensor(h.y, 6, 8),
                    *h.stream);
    h.layer.forward(h.xt(), Tensor(), h.params.view(), testing::host_tensor(y2, 6, 8), *h.stream);
    expect_error([&] { h.stream->synchronize(); }, "holds 1 NaN/Inf value(s), first at [token 1, column 3]");
    EXPECT_NO_THROW(h.stream->synchronize());
}

TEST(MoeLayerInput, WorkspaceTooSmallIsRejected) {
    auto device = make_device("cpu");
    const std::size_t need = MoeLayer::workspace_bytes(valid_config(), 16);
    DeviceBuffer ws(*device, need - 256);
    expect_error([&] { MoeLayer layer(valid_config(), *device, 16, nullptr, ws.data(), ws.bytes()); }, "workspace");
}

void backward_with(testing::CpuLayerHarness& h, bool grad_x, bool grad_shortcut) {
    h.layer.backward(testing::host_tensor(h.grad_y, h.tokens, 8), h.params.view(), h.grads.view(),
                     grad_x ? testing::host_tensor(h.grad_x, h.tokens, 8) : Tensor(),
                     grad_shortcut ? testing::host_tensor(h.grad_s, h.tokens, 8) : Tensor(), *h.stream);
    h.stream->synchronize();
}

// A forward without a shortcut routes on x: a defined grad_shortcut is refused (without a shared
// expert it used to take the whole input gradient while grad_x was zero-filled).
TEST(MoeLayerInput, BackwardRefusesGradShortcutWithoutAShortcut) {
    for (bool shared : {false, true}) {
        SCOPED_TRACE(shared ? "shared expert" : "no shared expert");
        MoeConfig c = valid_config();
        c.shared_expert = shared;
        testing::CpuLayerHarness h(c, 6, false);
        h.forward();
        expect_error([&] { backward_with(h, true, true); },
                     "the forward had no shortcut (it routed on x), so grad_shortcut must be undefined");
        expect_error([&] { backward_with(h, false, false); }, "grad_x is undefined");
        EXPECT_NO_THROW(backward_with(h, true, false));
    }
}

// A forward with a shortcut sends the routed gradient to grad_shortcut: leaving it undefined is
// refused (it used to land in grad_x, added to the shared expert's gradient of x).
TEST(MoeLayerInput, BackwardRequiresGradShortcutAfterAShortcut) {
    for (bool shared : {false, true}) {
        SCOPED_TRACE(shared ? "shared expert" : "no shared expert");
        MoeConfig c = valid_config();
        c.shared_expert = shared;
        testing::CpuLayerHarness h(c, 6, true);
        h.forward();
        expect_error([&] { backward_with(h, true, false); },
                     "the forward routed on a separate shortcut, so grad_shortcut must be given");
        EXPECT_NO_THROW(backward_with(h, true, true));
        if (shared) {
            expect_error([&] { backward_with(h, false, true); }, "grad_x is undefined");
        } else {
            EXPECT_NO_THROW(backward_with(h, false, true));  // x feeds nothing without a shared expert
        }
    }
}

TEST(MoeLayerInput, BackwardBeforeAnyForwardSaysSo) {
    testing::CpuLayerHarness h(valid_config(), 6, false);
    expect_error([&] { backward_with(h, true, false); }, "MoeLayer.backward: called with no forward in flight");
    expect_error([&] { h.layer.combine_backward(testing::host_tensor(h.grad_y, 6, 8), *h.stream); },
                 "MoeLayer.combine_backward: called with no forward in flight");
    h.forward();
    EXPECT_NO_THROW(backward_with(h, true, false));
}

// A fresh store reads zeros on any backend; init(seed) is reproducible, differs by seed, has the
// documented spread, and gives a layer finite outputs.
TEST(MoeParamStore, FreshStoreIsZeroAndInitIsSeeded) {
    auto device = make_device("cpu");
    auto stream = device->create_stream();
    MoeConfig c = valid_config();
    c.shared_expert = true;
    c.coefficient_gate = true;
    const std::size_t bytes = MoeParamStore(*device, c, DType::kF32).bytes();
    {
        // Leave garbage in the memory the next store is likely to get.
        DeviceBuffer garbage(*device, bytes);
        std::memset(garbage.data(), 0xab, bytes);
    }
    MoeParamStore a(*device, c, DType::kF32), b(*device, c, DType::kF32);
    auto values = [](const MoeParamStore& p) {
        const auto* f = static_cast<const float*>(p.data());
        return std::vector<float>(f, f + p.numel());
    };
    for (float v : values(a)) ASSERT_EQ(v, 0.0f);
    a.init(7, *stream);
    b.init(7, *stream);
    EXPECT_TRUE(testing::bitwise_equal(values(a), values(b)));
    b.init(8, *stream);
    EXPECT_FALSE(testing::bitwise_equal(values(a), values(b)));
    double sum_sq = 0;
    for (float v : values(a)) sum_sq += static_cast<double>(v) * v;
    EXPECT_NEAR(std::sqrt(sum_sq / static_cast<double>(a.numel())), MoeParamStore::kInitStd, 0.1 * MoeParamStore::kInitStd);

    // Expert-parallel stores of the same seed hold the full store's slices of the experts.
    MoeParamStore half(*device, c, DType::kF32, 2);
    half.init(7, *stream, 1);
    const auto full_w1 = a.view().expert_w1, half_w1 = half.view().expert_w1;
    const std::int64_t per_expert = full_w1.numel() / c.num_experts;
    EXPECT_EQ(0, std::memcmp(half_w1.as<float>(), full_w1.as<float>() + 2 * per_expert,
                             static_cast<std::size_t>(2 * per_expert) * sizeof(float)));
    EXPECT_EQ(0, std::memcmp(half.view().gate_w.as<float>(), a.view().gate_w.as<float>(), a.view().gate_w.bytes()));
    expect_error([&] { half.init(7, *stream, 2); }, "MoeParamStore.init: ep_rank = 2");

    testing::CpuLayerHarness h(c, 6, false);
    h.params.init(3, *h.stream);
    h.forward();
    for (float v : h.y) ASSERT_TRUE(std::isfinite(v));
    EXPECT_GT(*std::max_element(h.y.begin(), h.y.end()), 0.0f);
}

}  // namespace
}  // namespace scmoe
