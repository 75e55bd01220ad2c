// CUDA RMSNorm and attention (causal, and bidirectional: AttentionArgs::causal false) against the CPU
// ops on the same (bf16-rounded) inputs, forward and backward, f32 and bf16 storage; bitwise
// run-to-run determinism of the CUDA results.
//
// Tolerances (|gpu - cpu| <= tol * max(1, |cpu|)):
//   bf16 outputs (y, grad_x, out, grad_qkv):   2e-2  (one bf16 rounding, 3.9e-3 relative, plus fp32 sum order)
//   f32 RMSNorm y, rstd:                       2e-5  (same inputs; only the sum order of mean(x^2) differs)
//   f32 RMSNorm grad_x, attention out, lse:    1e-4
//   f32 grad_weight (sum over tokens):         5e-4
//   f32 attention grad_qkv (sums over seq):    1e-3
//   grad_qkv relative L2 error:                1e-2 bf16, 1e-4 f32
// The CPU attention backward reference is given the GPU's own `out` (widened from bf16 when so
// stored), so D_i = dO_i . O_i sees the same values on both sides.
// Attention here is scmoe's own CUDA kernel (AttentionProvider::kOwn, the reference);
// gpu_attention_cudnn_test.cpp checks cuDNN's against it and against the CPU.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <utility>

#include "gpu_test_util.h"
#include "scmoe/kernels/attention.h"
#include "scmoe/kernels/error.h"
#include "scmoe/kernels/rmsnorm.h"

namespace scmoe {
namespace {

using namespace gpu_testing;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

F maybe_round(F v, DType dtype) { return dtype == DType::kBF16 ? round_bf16(std::move(v)) : v; }

// ---- RMSNorm ----------------------------------------------------------------------------------

struct NormResult {
    F y, rstd, grad_x, grad_weight;
};

NormResult run_rmsnorm_gpu(Backends& b, DType dt, std::int64_t tokens, std::int64_t hidden, float eps, const F& x,
                           const F& w, const F& gy, const F& base, bool accumulate) {
    DeviceBuffer dx = upload(b, x, dt), dw = upload(b, w, dt), dgy = upload(b, gy, dt);
    DeviceBuffer dy = upload(b, F(x.size(), kNaN), dt), dgx = upload(b, accumulate ? base : F(x.size(), kNaN), dt);
    DeviceBuffer drstd = upload(b, F(static_cast<std::size_t>(tokens), kNaN), DType::kF32);
    DeviceBuffer dgw = upload(b, F(static_cast<std::size_t>(hidden), kNaN), DType::kF32);
    rmsnorm_forward({tokens, hidden, eps, dt, dx.data(), dw.data(), dy.data(), drstd.as<float>()}, *b.gpu_stream);
    rmsnorm_backward({tokens, hidden, eps, dt, dx.data(), dw.data(), drstd.as<float>(), dgy.data(), dgx.data(),
                      accumulate, dgw.as<float>()},
                     *b.gpu_stream);
    return {download(b, dy.data(), tokens * hidden, dt), download(b, drstd.data(), tokens, DType::kF32),
            download(b, dgx.data(), tokens * hidden, dt), download(b, dgw.data(), hidden, DType::kF32)};
}

void check_rmsnorm(Backends& b, DType dt, std::int64_t tokens, std::int64_t hidden, bool accumulate,
                   std::uint64_t seed) {
    SCOPED_TRACE(std::string("rmsnorm ") + dtype_name(dt) + " tokens=" + std::to_string(tokens) +
                 " hidden=" + std::to_string(hidden) + " accumulate=" + std::to_string(accumulate));
    const float eps = 1e-5f;
    const F x = maybe_round(random_uniform(tokens * hidden, 2.0f, seed), dt);
    const F w = maybe_round(random_uniform(hidden, 1.5f, seed + 1), dt);
    const F gy = maybe_round(random_uniform(tokens * hidden, 1.0f, seed + 2), dt);
    const F base = maybe_round(random_uniform(tokens * hidden, 1.0f, seed + 3), dt);
    NormResult want{F(x.size()), F(static_cast<std::size_t>(tokens)), accumulate ? base : F(x.size()),
                    F(static_cast<std::size_t>(hidden))};
    rmsnorm_forward({tokens, hidden, eps, DType::kF32, x.data(), w.data(), want.y.data(), want.rstd.data()},
                    *b.cpu_stream);
    rmsnorm_backward({tokens, hidden, eps, DType::kF32, x.data(), w.data(), want.rstd.data(), gy.data(),
                      want.grad_x.data(), accumulate, want.grad_weight.data()},
                     *b.cpu_stream);
    b.cpu_stream->synchronize();
    const NormResult got = run_rmsnorm_gpu(b, dt, tokens, hidden, eps, x, w, gy, base, accumulate);
    const bool bf16 = dt == DType::kBF16;
    expect_close(got.y, want.y, bf16 ? 2e-2f : 2e-5f, "y");
    expect_close(got.rstd, want.rstd, 2e-5f, "rstd");
    expect_close(got.grad_x, want.grad_x, bf16 ? 2e-2f : 1e-4f, "grad_x");
    expect_close(got.grad_weight, want.grad_weight, 5e-4f, "grad_weight");
}

TEST(GpuBackboneRmsNorm, ForwardBackwardMatchCpu) {
    SCMOE_REQUIRE_GPU();
    Backends b;
    std::uint64_t seed = 100;
    for (DType dt : {DType::kF32, DType::kBF16}) {
        for (bool accumulate : {false, true}) {
            check_rmsnorm(b, dt, 37, 600, accumulate, seed += 5);  // hidden not a multiple of 32
            check_rmsnorm(b, dt, 256, 512, accumulate, seed += 5);
            check_rmsnorm(b, dt, 3, 4096, accumulate, seed += 5);
            check_rmsnorm(b, dt, 1000, 96, accumulate, seed += 5);   // grad_weight in 7 chunks of 143 tokens
            check_rmsnorm(b, dt, 1000, 600, accumulate, seed += 5);  // 7 chunks, hidden not a multiple of 32
            check_rmsnorm(b, dt, 4099, 768, accumulate, seed += 5);  // grad_weight in 32 chunks, the last short
        }
        // grad_weight's chunks limited by the stream's scratch (16 rows of 16384 partials)
        check_rmsnorm(b, dt, 2600, 16384, false, seed += 5);
    }
}

TEST(GpuBackboneRmsNorm, BackwardIsBitwiseDeterministic) {
    SCMOE_REQUIRE_GPU();
    Backends b;
    for (DType dt : {DType::kF32, DType::kBF16}) {
        const std::int64_t tokens = 2048, hidden = 512;
        const F x = random_uniform(tokens * hidden, 1.0f, 7), w = random_uniform(hidden, 1.0f, 8);
        const F gy = random_uniform(tokens * hidden, 1.0f, 9), base = random_uniform(tokens * hidden, 1.0f, 10);
        const NormResult first = run_rmsnorm_gpu(b, dt, tokens, hidden, 1e-5f, x, w, gy, base, true);
        for (int run = 0; run < 3; ++run) {
            const NormResult again = run_rmsnorm_gpu(b, dt, tokens, hidden, 1e-5f, x, w, gy, base, true);
            expect_bitwise_equal(again.y, first.y, "y");
            expect_bitwise_equal(again.rstd, first.rstd, "rstd");
            expect_bitwise_equal(again.grad_x, first.grad_x, "grad_x");
            expect_bitwise_equal(again.grad_weight, first.grad_weight, "grad_weight");
        }
    }
}

// ---- Attention --------------------------------------------------------------------------------

using AttnShape = gpu_testing::AttentionCase;

struct AttnResult {
    F out, lse, grad_qkv;
};

AttnResult run_attention_gpu(Backends& b, DType dt, const AttnShape& s, const F& qkv, const F& go) {
    DeviceBuffer dqkv = upload(b, qkv, dt), dgo = upload(b, go, dt);
    DeviceBuffer dout = upload(b, F(static_cast<std::size_t>(s.out_size()), kNaN), dt);
    DeviceBuffer dlse = upload(b, F(static_cast<std::size_t>(s.lse_size()), kNaN), DType::kF32);
    DeviceBuffer dg = upload(b, F(static_cast<std::size_t>(s.qkv_size()), kNaN), dt);  // must be overwritten
    attention_forward(s.fwd(dt, dqkv.data(), dout.data(), dlse.as<float>()), *b.gpu_stream, AttentionProvider::kOwn);
    attention_backward(s.bwd(dt, dqkv.data(), dout.data(), dlse.as<float>(), dgo.data(), dg.data()), *b.gpu_stream,
                       AttentionProvider::kOwn);
    return {download(b, dout.data(), s.out_size(), dt), download(b, dlse.data(), s.lse_size(), DType::kF32),
            download(b, dg.data(), s.qkv_size(), dt)};
}

void check_attention(Backends& b, DType dt, const AttnShape& s, float input_scale, std::uint64_t seed) {
    SCOPED_TRACE(std::string("attention ") + dtype_name(dt) + " " + s.name());
    const F qkv = maybe_round(random_uniform(s.qkv_size(), input_scale, seed), dt);
    const F go = maybe_round(random_uniform(s.out_size(), 1.0f, seed + 1), dt);
    const AttnResult got = run_attention_gpu(b, dt, s, qkv, go);
    F out(static_cast<std::size_t>(s.out_size())), lse(static_cast<std::size_t>(s.lse_size())),
        grad(static_cast<std::size_t>(s.qkv_size()));
    attention_forward(s.fwd(DType::kF32, qkv.data(), out.data(), lse.data()), *b.cpu_stream);
    // Backward reference on the GPU's `out` (what the GPU's D_i sees) and the CPU's own lse.
    attention_backward(s.bwd(DType::kF32, qkv.data(), got.out.data(), lse.data(), go.data(), grad.data()),
                       *b.cpu_stream);
    b.cpu_stream->synchronize();
    const bool bf16 = dt == DType::kBF16;
    expect_close(got.out, out, bf16 ? 2e-2f : 1e-4f, "out");
    expect_close(got.lse, lse, 1e-4f, "lse");
    expect_close(got.grad_qkv, grad, bf16 ? 2e-2f : 1e-3f, "grad_qkv");
    expect_rel_l2(got.grad_qkv, grad, bf16 ? 1e-2 : 1e-4, "grad_qkv");
}

TEST(GpuBackboneAttention, ForwardBackwardMatchCpu) {
    SCMOE_REQUIRE_GPU();
    Backends b;
    std::uint64_t seed = 200;
    for (DType dt : {DType::kF32, DType::kBF16}) {
        check_attention(b, dt, {2, 37, 3, 64}, 1.0f, seed += 5);
        check_attention(b, dt, {2, 20, 2, 24}, 1.0f, seed += 5);  // head_dim < 32: idle lanes
        check_attention(b, dt, {1, 33, 1, 40}, 2.0f, seed += 5);  // partial second lane slot, peakier softmax
        check_attention(b, dt, {1, 300, 2, 128}, 1.0f, seed += 5);
        check_attention(b, dt, {1, 17, 2, 256}, 1.0f, seed += 5);  // the largest head_dim
        check_attention(b, dt, {3, 1, 2, 64}, 1.0f, seed += 5);    // seq 1: out = v, grad_q = grad_k = 0
    }
}

// Grouped-query attention: the own kernel against the CPU's (itself checked against MHA with repeated
// K/V and finite differences in tests/unit/attention_gqa_test.cpp); dK/dV sum over a group's heads.
TEST(GpuBackboneAttention, GroupedQueryForwardBackwardMatchCpu) {
    SCMOE_REQUIRE_GPU();
    Backends b;
    std::uint64_t seed = 250;
    for (DType dt : {DType::kF32, DType::kBF16}) {
        check_attention(b, dt, {2, 37, 4, 64, 2}, 1.0f, seed += 5);
        check_attention(b, dt, {1, 70, 6, 24, 1}, 1.0f, seed += 5);     // multi-query, head_dim < 32
        check_attention(b, dt, {1, 300, 16, 128, 4}, 1.0f, seed += 5);  // llama2-moe's 16 / 4 heads of 128
    }
}

// Bidirectional attention (causal = false): the own kernel's every-key loops against the CPU's (itself
// checked against a double-precision reference and finite differences in
// tests/unit/attention_bidirectional_test.cpp), MHA, GQA and MQA, seq 1 and seq past a warp's rows.
TEST(GpuBackboneAttention, BidirectionalForwardBackwardMatchCpu) {
    SCMOE_REQUIRE_GPU();
    Backends b;
    std::uint64_t seed = 270;
    for (DType dt : {DType::kF32, DType::kBF16}) {
        check_attention(b, dt, {2, 37, 3, 64, 0, false}, 1.0f, seed += 5);
        check_attention(b, dt, {1, 33, 1, 40, 0, false}, 2.0f, seed += 5);  // partial lane slot, peakier softmax
        check_attention(b, dt, {2, 37, 4, 64, 2, false}, 1.0f, seed += 5);  // GQA
        check_attention(b, dt, {1, 70, 6, 24, 1, false}, 1.0f, seed += 5);  // multi-query, head_dim < 32
        check_attention(b, dt, {1, 300, 16, 128, 4, false}, 1.0f, seed += 5);
        check_attention(b, dt, {3, 1, 2, 64, 0, false}, 1.0f, seed += 5);     // seq 1
        check_attention(b, dt, {1, 144, 12, 32, 0, false}, 1.0f, seed += 5);  // the SwinV2 stage-3 shape
    }
}

TEST(GpuBackboneAttention, LongSequenceLargeHeadMatchesCpu) {
    SCMOE_REQUIRE_GPU();
    Backends b;
    check_attention(b, DType::kBF16, {1, 2048, 1, 256}, 1.0f, 300);
    check_attention(b, DType::kF32, {1, 2048, 2, 64}, 1.0f, 301);
}

TEST(GpuBackboneAttention, NullLseGivesTheSameOutput) {
    SCMOE_REQUIRE_GPU();
    Backends b;
    const AttnShape s{2, 50, 2, 32};
    const F qkv = round_bf16(random_uniform(s.qkv_size(), 1.0f, 400)), go = random_uniform(s.out_size(), 1.0f, 401);
    const AttnResult with_lse = run_attention_gpu(b, DType::kBF16, s, qkv, go);
    DeviceBuffer dqkv = upload(b, qkv, DType::kBF16), dout = upload(b, F(with_lse.out.size(), kNaN), DType::kBF16);
    attention_forward({s.batch, s.seq, s.heads, s.head_dim, DType::kBF16, dqkv.data(), dout.data(), nullptr},
                      *b.gpu_stream, AttentionProvider::kOwn);
    expect_bitwise_equal(download(b, dout.data(), s.out_size(), DType::kBF16), with_lse.out, "out");
}

TEST(GpuBackboneAttention, BackwardIsBitwiseDeterministic) {
    SCMOE_REQUIRE_GPU();
    Backends b;
    for (DType dt : {DType::kF32, DType::kBF16}) {
        const AttnShape s{2, 256, 8, 64};
        const F qkv = random_uniform(s.qkv_size(), 1.0f, 500), go = random_uniform(s.out_size(), 1.0f, 501);
        const AttnResult first = run_attention_gpu(b, dt, s, qkv, go);
        for (int run = 0; run < 3; ++run) {
            const AttnResult again = run_attention_gpu(b, dt, s, qkv, go);
            expect_bitwise_equal(again.out, first.out, "out");
            expect_bitwise_equal(again.lse, first.lse, "lse");
            expect_bitwise_equal(again.grad_qkv, first.grad_qkv, "grad_qkv");
        }
    }
}

TEST(GpuBackboneAttention, RejectsHeadDimPastTheKernelLimit) {
    SCMOE_REQUIRE_GPU();
    Backends b;
    DeviceBuffer buf(*b.gpu, 1 << 20);
    EXPECT_THROW(
        attention_forward({1, 2, 1, kAttentionCudaMaxHeadDim + 1, DType::kBF16, buf.data(), buf.data(), nullptr},
                          *b.gpu_stream),
        Error);
    b.gpu_stream->synchronize();
}

}  // namespace
}  // namespace scmoe
