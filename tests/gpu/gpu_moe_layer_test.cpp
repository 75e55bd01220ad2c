// The whole MoE layer on CUDA (bf16) against the CPU layer (f32, same bf16-rounded parameters and
// inputs): ScMoE-2 shape (top-2 routed on a separate shortcut + shared expert with CG-1), capacity
// and dropless dispatch, every grouped GEMM provider; bitwise repeatability; NaN input errors.
//
// Tolerances: routing (expert indices, slots, offsets, counts, dropped) exactly equal; gate weights
// 1e-4; aux / z losses 1e-4 relative; y and every gradient ||gpu - cpu||_2 <= 3e-2 ||cpu||_2 and
// max |gpu - cpu| <= 1e-1 max |cpu| (bf16 storage rounds every intermediate: xp, h, act, yp, y,
// and the backward's grad buffers, each to 8 significant bits).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "gpu_test_util.h"
#include "scmoe/kernels/error.h"
#include "scmoe/moe/moe_layer.h"
#include "scmoe/moe/params.h"

namespace scmoe {
namespace {

using namespace gpu_testing;

MoeConfig small_config(DispatchMode dispatch, DType dtype, int top_k = 2) {
    MoeConfig c;
    c.hidden = 64;
    c.ffn = 128;
    c.num_experts = 4;
    c.top_k = top_k;
    c.capacity_factor = 1.0f;  // with 96 tokens some expert usually overflows: drops are exercised
    c.dispatch = dispatch;
    c.activation = Activation::kSwiGLU;
    c.dtype = dtype;
    c.shared_expert = true;
    c.coefficient_gate = true;
    c.noise_std = 0.0f;
    c.aux_loss_coef = 0.01f;
    c.z_loss_coef = 0.001f;
    return c;
}

constexpr std::int64_t kTokens = 96;

struct LayerOutputs {
    F y, grad_x, grad_s, grads;
    MoeStats stats;
    MoeRouting routing;
};

struct Inputs {
    F params, x, s, grad_y;
    explicit Inputs(const MoeConfig& c) {
        std::int64_t numel = 0;
        for (const ParamSpec& p : moe_param_specs(c)) numel += p.numel();
        params = round_bf16(random_uniform(numel, 0.1f, 11));
        x = round_bf16(random_uniform(kTokens * c.hidden, 1.0f, 12));
        s = round_bf16(random_uniform(kTokens * c.hidden, 1.0f, 13));
        grad_y = round_bf16(random_uniform(kTokens * c.hidden, 1.0f, 14));
    }
};

LayerOutputs run_cpu(Backends& b, const MoeConfig& c, const Inputs& in) {
    MoeLayer layer(c, *b.cpu, kTokens);
    layer.set_grouped_gemm_provider(GroupedGemmProvider::kAuto);  // ignore SCMOE_GROUPED_GEMM_PROVIDER here
    MoeParamStore params(*b.cpu, c, DType::kF32), grads(*b.cpu, c, DType::kF32);
    std::copy(in.params.begin(), in.params.end(), static_cast<float*>(params.data()));
    F x = in.x, s = in.s, gy = in.grad_y;
    LayerOutputs out;
    out.y.resize(x.size());
    out.grad_x.resize(x.size());
    out.grad_s.resize(x.size());
    const std::int64_t H = c.hidden;
    layer.forward(Tensor(x.data(), DType::kF32, {kTokens, H}), Tensor(s.data(), DType::kF32, {kTokens, H}),
                  params.view(), Tensor(out.y.data(), DType::kF32, {kTokens, H}), *b.cpu_stream);
    out.stats = layer.stats(*b.cpu_stream);
    out.routing = layer.routing(*b.cpu_stream);
    layer.backward(Tensor(gy.data(), DType::kF32, {kTokens, H}), params.view(), grads.view(),
                   Tensor(out.grad_x.data(), DType::kF32, {kTokens, H}),
                   Tensor(out.grad_s.data(), DType::kF32, {kTokens, H}), *b.cpu_stream);
    b.cpu_stream->synchronize();
    const auto* g = static_cast<const float*>(grads.data());
    out.grads.assign(g, g + grads.numel());
    return out;
}

struct GpuLayer {
    MoeConfig config;
    MoeLayer layer;
    MoeParamStore params, grads;
    DeviceBuffer x, s, grad_y, y, grad_x, grad_s;

    GpuLayer(Backends& b, const MoeConfig& c, const Inputs& in, GroupedGemmProvider provider)
        : config(c),
          layer(c, *b.gpu, kTokens),
          params(*b.gpu, c, DType::kBF16),
          grads(*b.gpu, c, DType::kF32),
          x(upload(b, in.x, DType::kBF16)),
          s(upload(b, in.s, DType::kBF16)),
          grad_y(upload(b, in.grad_y, DType::kBF16)),
          y(*b.gpu, in.x.size() * 2),
          grad_x(*b.gpu, in.x.size() * 2),
          grad_s(*b.gpu, in.x.size() * 2) {
        layer.set_grouped_gemm_provider(provider);
        DeviceBuffer p = upload(b, in.params, DType::kBF16);
        b.gpu_stream->copy(params.data(), p.data(), params.bytes());
        b.gpu_stream->synchronize();
    }
    Tensor t(const DeviceBuffer& buf) const { return Tensor(buf.data(), DType::kBF16, {kTokens, config.hidden}); }

    LayerOutputs run(Backends& b) {
        LayerOutputs out;
        layer.forward(t(x), t(s), params.view(), t(y), *b.gpu_stream);
        out.stats = layer.stats(*b.gpu_stream);
        out.routing = layer.routing(*b.gpu_stream);
        layer.backward(t(grad_y), params.view(), grads.view(), t(grad_x), t(grad_s), *b.gpu_stream);
        const std::int64_t n = kTokens * config.hidden;
        out.y = download(b, y.data(), n, DType::kBF16);
        out.grad_x = download(b, grad_x.data(), n, DType::kBF16);
        out.grad_s = download(b, grad_s.data(), n, DType::kBF16);
        out.grads = download(b, grads.data(), grads.numel(), DType::kF32);
        return out;
    }
};

void expect_near_field(const F& got, const F& want, const char* what) {
    expect_rel_l2(got, want, 3e-2, what);
    float max_ref = 0.0f, max_diff = 0.0f;
    for (std::size_t i = 0; i < want.size(); ++i) {
        max_ref = std::max(max_ref, std::abs(want[i]));
        max_diff = std::max(max_diff, std::abs(got[i] - want[i]));
    }
    EXPECT_LE(max_diff, 1e-1f * max_ref) << what << ": largest elementwise difference";
}

struct LayerCase {
    const char* name;
    DispatchMode dispatch;
    GroupedGemmProvider provider;
    int top_k = 2;
};

void PrintTo(const LayerCase& c, std::ostream* os) { *os << c.name; }

class GpuMoeLayer : public ::testing::TestWithParam<LayerCase> {};

TEST_P(GpuMoeLayer, ForwardBackwardMatchesCpuAndRepeatsBitwise) {
    SCMOE_REQUIRE_GPU();
    const LayerCase& lc = GetParam();
    if (!grouped_gemm_provider_built(lc.provider))
        GTEST_SKIP() << grouped_gemm_provider_name(lc.provider, Backend::kCuda) << " is not built (no CUTLASS)";
    Backends b;
    const MoeConfig cpu_config = small_config(lc.dispatch, DType::kF32, lc.top_k);
    const MoeConfig gpu_config = small_config(lc.dispatch, DType::kBF16, lc.top_k);
    const Inputs in(cpu_config);
    const LayerOutputs want = run_cpu(b, cpu_config, in);
    GpuLayer gpu(b, gpu_config, in, lc.provider);
    const LayerOutputs got = gpu.run(b);

    // Routing is decided on f32 logits of the same bf16 values: identical.
    EXPECT_EQ(got.routing.expert_index, want.routing.expert_index);
    EXPECT_EQ(got.routing.slot_of_choice, want.routing.slot_of_choice);
    EXPECT_EQ(got.routing.group_offsets, want.routing.group_offsets);
    expect_close(got.routing.gate_weight, want.routing.gate_weight, 1e-4f, "gate_weight");
    EXPECT_EQ(got.stats.expert_counts, want.stats.expert_counts);
    EXPECT_EQ(got.stats.dropped_tokens, want.stats.dropped_tokens);
    EXPECT_EQ(got.stats.capacity, want.stats.capacity);
    EXPECT_NEAR(got.stats.aux_loss, want.stats.aux_loss, 1e-4f * std::abs(want.stats.aux_loss));
    EXPECT_NEAR(got.stats.z_loss, want.stats.z_loss, 1e-4f * std::abs(want.stats.z_loss));

    expect_near_field(got.y, want.y, "y");
    expect_near_field(got.grad_x, want.grad_x, "grad_x");
    expect_near_field(got.grad_s, want.grad_s, "grad_shortcut");
    std::size_t offset = 0;
    for (const ParamSpec& p : moe_param_specs(cpu_config)) {
        const auto n = static_cast<std::size_t>(p.numel());
        if (n == 0) continue;
        const F g(got.grads.begin() + static_cast<std::ptrdiff_t>(offset),
                  got.grads.begin() + static_cast<std::ptrdiff_t>(offset + n));
        const F w(want.grads.begin() + static_cast<std::ptrdiff_t>(offset),
                  want.grads.begin() + static_cast<std::ptrdiff_t>(offset + n));
        expect_near_field(g, w, ("grad " + p.name).c_str());
        offset += n;
    }

    // Determinism: the same layer, inputs and stream give bitwise the same results.
    const LayerOutputs again = gpu.run(b);
    expect_bitwise_equal(again.y, got.y, "y (second run)");
    expect_bitwise_equal(again.grad_x, got.grad_x, "grad_x (second run)");
    expect_bitwise_equal(again.grad_s, got.grad_s, "grad_shortcut (second run)");
    expect_bitwise_equal(again.grads, got.grads, "weight grads (second run)");

    // Gradient accumulation: a third pass adds the same gradients into those the second wrote, so
    // they double (up to the fp32 rounding of the GEMM adding into C in its own order:
    // |acc - 2g| <= 1e-5 |2g| + 1e-6 max|2g|). cutlass-grouped overwrites C, so the layer runs the
    // accumulating weight gradients on auto's other choice there.
    gpu.layer.set_grad_accumulation(true);
    const LayerOutputs acc = gpu.run(b);
    expect_bitwise_equal(acc.grad_x, got.grad_x, "grad_x (accumulating: input gradients are written)");
    float max_g = 0.0f;
    for (float v : got.grads) max_g = std::max(max_g, 2.0f * std::abs(v));
    int bad = 0;
    for (std::size_t i = 0; i < got.grads.size(); ++i) {
        const float want2 = 2.0f * got.grads[i];
        if (!(std::abs(acc.grads[i] - want2) <= 1e-5f * std::abs(want2) + 1e-6f * max_g) && bad++ < 3)
            ADD_FAILURE() << "accumulated weight grad " << i << ": " << acc.grads[i] << ", want " << want2;
    }
    EXPECT_EQ(bad, 0) << "accumulated weight gradients that are not twice one pass's";
}

INSTANTIATE_TEST_SUITE_P(
    GpuScMoE2, GpuMoeLayer,
    ::testing::Values(LayerCase{"capacity_auto", DispatchMode::kCapacity, GroupedGemmProvider::kAuto},
                      LayerCase{"capacity_loop", DispatchMode::kCapacity, GroupedGemmProvider::kLoop},
                      LayerCase{"capacity_device_grouped", DispatchMode::kCapacity,
                                GroupedGemmProvider::kDeviceGrouped},
                      LayerCase{"dropless_auto", DispatchMode::kDropless, GroupedGemmProvider::kAuto},
                      LayerCase{"dropless_loop", DispatchMode::kDropless, GroupedGemmProvider::kLoop},
                      LayerCase{"capacity_cutlass_grouped", DispatchMode::kCapacity,
                                GroupedGemmProvider::kCutlassGrouped},
                      LayerCase{"dropless_cutlass_grouped", DispatchMode::kDropless,
                                GroupedGemmProvider::kCutlassGrouped},
                      // Top-3 (of 4 experts): three renormalised gates per token through every stage.
                      LayerCase{"top3_capacity_auto", DispatchMode::kCapacity, GroupedGemmProvider::kAuto, 3},
                      LayerCase{"top3_dropless_auto", DispatchMode::kDropless, GroupedGemmProvider::kAuto, 3},
                      LayerCase{"top3_dropless_cutlass_grouped", DispatchMode::kDropless,
                                GroupedGemmProvider::kCutlassGrouped, 3}),
    [](const ::testing::TestParamInfo<LayerCase>& param_info) { return std::string(param_info.param.name); });

TEST(GpuMoeLayerErrors, NanInputRaisesOnSynchronize) {
    SCMOE_REQUIRE_GPU();
    Backends b;
    const MoeConfig c = small_config(DispatchMode::kCapacity, DType::kBF16);
    Inputs in(c);
    in.x[static_cast<std::size_t>(3 * c.hidden + 5)] = std::numeric_limits<float>::quiet_NaN();
    GpuLayer gpu(b, c, in, GroupedGemmProvider::kAuto);
    try {
        gpu.layer.forward(gpu.t(gpu.x), Tensor(), gpu.params.view(), gpu.t(gpu.y), *b.gpu_stream);
        b.gpu_stream->synchronize();
        FAIL() << "forward on NaN input did not raise";
    } catch (const Error& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("NaN"), std::string::npos) << msg;
        EXPECT_NE(msg.find("token 3"), std::string::npos) << msg;
    }
}

// CUDA graphs (issue 14 part 7): a capacity-mode single-rank layer's forward + backward captured
// once and replayed equals the eager pass bit for bit, also on new input values written into the
// same buffers; a NaN check refuses to be captured.
TEST(GpuMoeLayerGraph, ReplayIsBitwiseEqualToEager) {
    SCMOE_REQUIRE_GPU();
    Backends b;
    MoeConfig c = small_config(DispatchMode::kCapacity, DType::kBF16);
    const Inputs in(c);
    GpuLayer eager(b, c, in, GroupedGemmProvider::kAuto);
    c.check_finite = false;
    GpuLayer graphed(b, c, in, GroupedGemmProvider::kAuto);
    auto pass = [&](Stream& s) {
        graphed.layer.forward(graphed.t(graphed.x), graphed.t(graphed.s), graphed.params.view(), graphed.t(graphed.y),
                              s);
        graphed.layer.backward(graphed.t(graphed.grad_y), graphed.params.view(), graphed.grads.view(),
                               graphed.t(graphed.grad_x), graphed.t(graphed.grad_s), s);
    };
    pass(*b.gpu_stream);  // eager once: cuBLAS and the layer's first-use work outside the capture
    b.gpu_stream->synchronize();
    const std::unique_ptr<StreamGraph> graph = b.gpu->capture(*b.gpu_stream, pass);
    const std::int64_t n = kTokens * c.hidden;
    auto outputs = [&](GpuLayer& g) {
        return std::vector<F>{download(b, g.y.data(), n, DType::kBF16), download(b, g.grad_x.data(), n, DType::kBF16),
                              download(b, g.grad_s.data(), n, DType::kBF16),
                              download(b, g.grads.data(), g.grads.numel(), DType::kF32)};
    };
    const char* names[] = {"y", "grad_x", "grad_shortcut", "weight grads"};
    for (int round = 0; round < 2; ++round) {
        if (round == 1) {  // new values in the same buffers: the graph reads them on replay
            const F x2 = round_bf16(random_uniform(n, 1.0f, 21)), gy2 = round_bf16(random_uniform(n, 1.0f, 22));
            for (GpuLayer* g : {&eager, &graphed}) {
                DeviceBuffer ux = upload(b, x2, DType::kBF16), ugy = upload(b, gy2, DType::kBF16);
                b.gpu_stream->copy(g->x.data(), ux.data(), ux.bytes());
                b.gpu_stream->copy(g->grad_y.data(), ugy.data(), ugy.bytes());
                b.gpu_stream->synchronize();
            }
        }
        eager.run(b);
        graph->replay(*b.gpu_stream);
        b.gpu_stream->synchronize();
        const std::vector<F> want = outputs(eager), got = outputs(graphed);
        for (std::size_t i = 0; i < want.size(); ++i)
            expect_bitwise_equal(got[i], want[i], (std::string(names[i]) + ", round " + std::to_string(round)).c_str());
    }

    // With the NaN check on, capture is refused with a message that says what to do.
    try {
        b.gpu->capture(*b.gpu_stream, [&](Stream& s) {
            eager.layer.forward(eager.t(eager.x), eager.t(eager.s), eager.params.view(), eager.t(eager.y), s);
        });
        ADD_FAILURE() << "check_finite was captured";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("check_finite = false"), std::string::npos) << e.what();
    }
    EXPECT_NO_THROW(eager.run(b)) << "the stream is usable after a refused capture";
}

}  // namespace
}  // namespace scmoe
