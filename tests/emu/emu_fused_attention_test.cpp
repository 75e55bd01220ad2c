// The GPU's measured fused-attention rate (GpuSpec::fused_attention, scmoe/kernels/emu/gpu_spec.h):
// the fused kernels run at it, forward and backward apart, interpolated in log2(head_dim), and the
// built-in H200 reproduces the measurement its points come from. Times worked out by hand on
// test::round_spec()'s round numbers.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "emu/emu_test_util.h"
#include "scmoe/kernels/attention.h"
#include "scmoe/kernels/emu/emu_ops.h"
#include "scmoe/kernels/emu/gpu_spec.h"
#include "scmoe/kernels/emu/stack.h"

namespace scmoe {
namespace {

using test::device_with;
using test::elapsed_us;

// The GPU's measured fused-attention rate (GpuSpec::fused_attention): a fraction of the peak after
// wave quantization, by head_dim, piecewise linear in log2(head_dim) and flat beyond its ends; the
// gemm_efficiency when the spec has none. The fused kernels run at it, forward and backward apart, and
// it does not follow gemm_efficiency (a measured rate, not a share of the GEMM's).
TEST(EmuFusedAttention, TheSpecsMeasuredFractionsSetTheFusedKernelsRate) {
    emu::GpuSpec spec = test::round_spec();
    spec.launch_us = 0;
    spec.gemm_efficiency = 0.5;
    EXPECT_DOUBLE_EQ(emu::fused_attention_efficiency(spec, 64, false), 0.5);  // none: the GEMM's
    spec.fused_attention = {{64, 0.5, 0.25}, {128, 0.8, 0.4}};
    EXPECT_DOUBLE_EQ(emu::fused_attention_efficiency(spec, 32, false), 0.5);
    EXPECT_DOUBLE_EQ(emu::fused_attention_efficiency(spec, 256, true), 0.4);
    EXPECT_NEAR(emu::fused_attention_efficiency(spec, std::sqrt(64.0 * 128.0), false), 0.65, 1e-12);
    EXPECT_NEAR(emu::fused_attention_efficiency(spec, std::sqrt(64.0 * 128.0), true), 0.325, 1e-12);
    // batch 1, 10 heads of 128, seq 1280: 100 tiles on 100 SMs (no wave loss); forward 2*10*1280^2*128
    // FLOP = 41.94304 us at the 1e8 FLOP/us peak, backward 2.5x that. Each kernel follows a 1 us gap.
    auto device = device_with(emu::builtin_stack("scmoe"), spec);
    test::HandAttention h(*device);
    const AttentionArgs& a = h.fwd;
    const AttentionBackwardArgs& b = h.bwd;
    EXPECT_NEAR(elapsed_us(*device, [&](Stream& s) { emu::attention_forward(a, s); }), 1 + 41.94304 / 0.8, 1e-3);
    EXPECT_NEAR(elapsed_us(*device, [&](Stream& s) { emu::attention_backward(b, s); }), 1 + 2.5 * 41.94304 / 0.4,
                1e-3);
    // The same measured rate whatever the GEMM ceiling.
    spec.gemm_efficiency = 1.0;
    auto other = device_with(emu::builtin_stack("scmoe"), spec);
    EXPECT_NEAR(elapsed_us(*other, [&](Stream& s) { emu::attention_forward(a, s); }), 1 + 41.94304 / 0.8, 1e-3);
}

// The built-in H200's and H100's points reproduce the measurements they come from (scmoe-bench
// attention, cuDNN, b8 s1024 h12: docs/results/gpu-h200-2026-11-26 and gpu-h100-2026-11-27, forward
// and backward at head_dim 64 / 128), to the rounding of the fractions (3 digits) plus the kernel gap.
struct MeasuredAttention {
    const char* gpu;
    double us[2][2];  // [head_dim 64, 128][forward, backward]
};

class EmuFusedAttentionMeasured : public ::testing::TestWithParam<MeasuredAttention> {};

TEST_P(EmuFusedAttentionMeasured, TheBuiltInSpecReproducesItsMeasurement) {
    emu::GpuSpec spec = emu::builtin_gpu_spec(GetParam().gpu);
    spec.launch_us = 0;
    auto device = device_with(emu::builtin_stack("scmoe"), spec);
    for (int i = 0; i < 2; ++i) {
        const std::int64_t d = i == 0 ? 64 : 128;
        const std::size_t q = 8 * 1024 * 12 * static_cast<std::size_t>(d);
        DeviceBuffer qkv(*device, 3 * q * 2), out(*device, q * 2), grad_out(*device, q * 2), grad_qkv(*device, 3 * q * 2);
        std::vector<float> lse(8 * 12 * 1024);
        AttentionArgs a;
        a.batch = 8, a.seq = 1024, a.heads = 12, a.head_dim = d, a.dtype = DType::kBF16;
        a.qkv = qkv.data(), a.out = out.data(), a.lse = lse.data();
        AttentionBackwardArgs b;
        b.batch = 8, b.seq = 1024, b.heads = 12, b.head_dim = d, b.dtype = DType::kBF16;
        b.qkv = qkv.data(), b.out = out.data(), b.lse = lse.data(), b.grad_out = grad_out.data(),
        b.grad_qkv = grad_qkv.data();
        const double fwd = elapsed_us(*device, [&](Stream& s) { emu::attention_forward(a, s); }) - spec.kernel_gap_us;
        const double bwd = elapsed_us(*device, [&](Stream& s) { emu::attention_backward(b, s); }) - spec.kernel_gap_us;
        EXPECT_NEAR(fwd / GetParam().us[i][0], 1.0, 0.005) << "head_dim " << d;
        EXPECT_NEAR(bwd / GetParam().us[i][1], 1.0, 0.005) << "head_dim " << d;
    }
}

INSTANTIATE_TEST_SUITE_P(Gh100, EmuFusedAttentionMeasured,
                         ::testing::Values(MeasuredAttention{"h200", {{47.918, 175.877}, {64.981, 230.203}}},
                                           MeasuredAttention{"h100", {{47.819, 193.613}, {65.192, 251.669}}}),
                         [](const ::testing::TestParamInfo<MeasuredAttention>& p) { return std::string(p.param.gpu); });

}  // namespace
}  // namespace scmoe
