// cuDNN's fused flash attention (AttentionProvider::kCudnn, bf16) against scmoe's own CUDA kernel
// (kOwn) and the CPU f32 reference on the same bf16-rounded inputs, forward (out, lse) and backward
// (grad_qkv); lse interchangeable between the providers; determinism; the provider choice at run
// time (environment, alignment, errors), each asserting which provider ran (attention_stats); the
// architecture's contract: cuDNN runs head_dim 256 on sm_90, its backward is deterministic by default
// from sm_90 on (bitwise over 5 repeats at 8x12x1024) and atomic below. Skips without a GPU, and
// without cuDNN in the build.
//
// Tolerances (|got - want| <= tol * max(1, |want|) elementwise; relative L2 over the tensor):
//   out vs CPU, vs own:              2e-2 elementwise  (one bf16 rounding of out, 3.9e-3 relative, and
//                                                       cuDNN rounds P to bf16 before P.V)
//   lse vs CPU, vs own:              2e-4              (fp32 on every side; sum order only)
//   grad_qkv vs CPU, vs own:         5e-2 elementwise, 2e-2 relative L2 (cuDNN rounds P and dS to bf16
//                                                       for its dV, dQ, dK GEMMs: a few bf16 ulps)
// The CPU backward reference is given the GPU's own `out` and the CPU's lse, as in
// gpu_backbone_ops_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <utility>

#include "gpu_test_util.h"
#include "scmoe/kernels/attention.h"
#include "scmoe/kernels/error.h"
#include "scmoe/kernels/grouped_gemm.h"

namespace scmoe {
namespace {

using namespace gpu_testing;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kOutTol = 2e-2f, kLseTol = 2e-4f, kGradTol = 5e-2f;
constexpr double kGradRelL2 = 2e-2;

#define SCMOE_REQUIRE_CUDNN()                                                               \
    do {                                                                                    \
        SCMOE_REQUIRE_GPU();                                                                \
        if (!::scmoe::attention_cudnn_built()) GTEST_SKIP() << "scmoe built without cuDNN"; \
    } while (0)

using Shape = gpu_testing::AttentionCase;

struct Result {
    F out, lse, grad_qkv;
};

struct Inputs {
    F qkv, grad_out;
};

Inputs make_inputs(const Shape& s, std::uint64_t seed, float scale = 1.0f) {
    return {round_bf16(random_uniform(s.qkv_size(), scale, seed)),
            round_bf16(random_uniform(s.out_size(), 1.0f, seed + 1))};
}

// Forward with `fwd`, then backward with `bwd` on that forward's out and lse. Outputs start as NaN
// so that an element a provider leaves unwritten fails every comparison.
Result run_gpu(Backends& b, const Shape& s, const Inputs& in, AttentionProvider fwd, AttentionProvider bwd) {
    const DType dt = DType::kBF16;
    DeviceBuffer dqkv = upload(b, in.qkv, dt), dgo = upload(b, in.grad_out, dt);
    DeviceBuffer dout = upload(b, F(static_cast<std::size_t>(s.out_size()), kNaN), dt);
    DeviceBuffer dlse = upload(b, F(static_cast<std::size_t>(s.lse_size()), kNaN), DType::kF32);
    DeviceBuffer dg = upload(b, F(static_cast<std::size_t>(s.qkv_size()), kNaN), dt);
    attention_forward(s.fwd(dt, dqkv.data(), dout.data(), dlse.as<float>()), *b.gpu_stream, fwd);
    attention_backward(s.bwd(dt, dqkv.data(), dout.data(), dlse.as<float>(), dgo.data(), dg.data()), *b.gpu_stream,
                       bwd);
    return {download(b, dout.data(), s.out_size(), dt), download(b, dlse.data(), s.lse_size(), DType::kF32),
            download(b, dg.data(), s.qkv_size(), dt)};
}

// The CPU f32 reference: forward on the inputs, backward on the GPU's `gpu_out`.
Result run_cpu(Backends& b, const Shape& s, const Inputs& in, const F& gpu_out) {
    F out(static_cast<std::size_t>(s.out_size())), lse(static_cast<std::size_t>(s.lse_size())),
        grad(static_cast<std::size_t>(s.qkv_size()));
    attention_forward(s.fwd(DType::kF32, in.qkv.data(), out.data(), lse.data()), *b.cpu_stream);
    attention_backward(s.bwd(DType::kF32, in.qkv.data(), gpu_out.data(), lse.data(), in.grad_out.data(), grad.data()),
                       *b.cpu_stream);
    b.cpu_stream->synchronize();
    return {out, lse, grad};
}

void expect_grad_close(const F& got, const F& want, const char* what) {
    expect_close(got, want, kGradTol, what);
    expect_rel_l2(got, want, kGradRelL2, what);
}

// The calls each provider ran since `before`.
struct Ran {
    long long cudnn_forward, cudnn_backward, cudnn_deterministic_backward, own_forward, own_backward;
};
Ran ran_since(const AttentionStats& before) {
    const AttentionStats now = attention_stats();
    return {now.cudnn_forward - before.cudnn_forward, now.cudnn_backward - before.cudnn_backward,
            now.cudnn_deterministic_backward - before.cudnn_deterministic_backward,
            now.own_forward - before.own_forward, now.own_backward - before.own_backward};
}

// The compute capability of the test's GPU, 90 for 9.0 (public through the grouped GEMM's target).
int compute_capability(Backends& b) {
    const GroupedGemmTarget t = grouped_gemm_target(*b.gpu_stream);
    return t.cc_major * 10 + t.cc_minor;
}

// Forward and backward under auto, checked against the CPU; returns the calls each provider ran.
Ran run_auto_against_cpu(Backends& b, const Shape& s, std::uint64_t seed) {
    const Inputs in = make_inputs(s, seed);
    const AttentionStats before = attention_stats();
    const Result got = run_gpu(b, s, in, AttentionProvider::kAuto, AttentionProvider::kAuto);
    const Ran ran = ran_since(before);
    const Result cpu = run_cpu(b, s, in, got.out);
    expect_close(got.out, cpu.out, kOutTol, "out");
    expect_close(got.lse, cpu.lse, kLseTol, "lse");
    expect_grad_close(got.grad_qkv, cpu.grad_qkv, "grad_qkv");
    return ran;
}

void check_cudnn_against_own_and_cpu(Backends& b, const Shape& s, std::uint64_t seed, float input_scale = 1.0f) {
    SCOPED_TRACE("cuDNN attention bf16 " + s.name());
    const Inputs in = make_inputs(s, seed, input_scale);
    const Result cudnn = run_gpu(b, s, in, AttentionProvider::kCudnn, AttentionProvider::kCudnn);
    const Result own = run_gpu(b, s, in, AttentionProvider::kOwn, AttentionProvider::kOwn);
    const Result cpu = run_cpu(b, s, in, cudnn.out);
    expect_close(cudnn.out, cpu.out, kOutTol, "out vs cpu");
    expect_close(cudnn.lse, cpu.lse, kLseTol, "lse vs cpu (the same natural-log lse)");
    expect_grad_close(cudnn.grad_qkv, cpu.grad_qkv, "grad_qkv vs cpu");
    expect_close(cudnn.out, own.out, kOutTol, "out vs own kernel");
    expect_close(cudnn.lse, own.lse, kLseTol, "lse vs own kernel");
    expect_grad_close(cudnn.grad_qkv, own.grad_qkv, "grad_qkv vs own kernel");
}

TEST(GpuAttentionCudnn, MatchesOwnKernelAndCpu) {
    SCMOE_REQUIRE_CUDNN();
    Backends b;
    std::uint64_t seed = 700;
    check_cudnn_against_own_and_cpu(b, {2, 100, 4, 64}, seed += 5);       // batch > 1, seq not a multiple of 64
    check_cudnn_against_own_and_cpu(b, {1, 300, 2, 128}, seed += 5);      // head_dim 128
    check_cudnn_against_own_and_cpu(b, {3, 65, 2, 64}, seed += 5);        // one past a 64-row tile
    check_cudnn_against_own_and_cpu(b, {2, 37, 3, 128}, seed += 5);       // shorter than one tile
    check_cudnn_against_own_and_cpu(b, {1, 77, 2, 64}, seed += 5, 3.0f);  // peaky softmax
}

// Grouped-query attention (K/V views of kv_heads heads, cuDNN's native GQA). Under auto the result
// matches the CPU whichever provider ran; where cuDNN ran it also matches the own kernel. What ran is
// printed: a cuDNN that refuses GQA is routed to the own kernel (said once on stderr), not an error.
TEST(GpuAttentionCudnn, GroupedQueryMatchesOwnKernelAndCpuUnderAuto) {
    SCMOE_REQUIRE_CUDNN();
    Backends b;
    std::uint64_t seed = 760;
    for (const Shape s : {Shape{2, 100, 4, 64, 2}, Shape{1, 300, 16, 128, 4}, Shape{2, 65, 8, 64, 1}}) {
        SCOPED_TRACE("GQA " + s.name());
        const Ran ran = run_auto_against_cpu(b, s, seed += 5);
        std::printf("GQA %s: cuDNN forward %lld backward %lld, own forward %lld backward %lld\n", s.name().c_str(),
                    ran.cudnn_forward, ran.cudnn_backward, ran.own_forward, ran.own_backward);
        if (ran.cudnn_forward > 0 && ran.cudnn_backward > 0) check_cudnn_against_own_and_cpu(b, s, seed += 5);
    }
}

// seq 1 (out = v, grad_q = grad_k = 0) under auto: cuDNN may turn a one-token backward down (its
// samples never cover it); auto then runs the own kernel. Either way the result matches the CPU, and
// what ran is printed.
TEST(GpuAttentionCudnn, SingleTokenSequencesUnderAuto) {
    SCMOE_REQUIRE_CUDNN();
    Backends b;
    const Ran ran = run_auto_against_cpu(b, {2, 1, 2, 64}, 740);
    EXPECT_EQ(ran.cudnn_forward + ran.own_forward, 1);
    EXPECT_EQ(ran.cudnn_backward + ran.own_backward, 1);
    std::printf("seq 1: forward by %s, backward by %s\n", ran.cudnn_forward ? "cuDNN" : "the own kernel",
                ran.cudnn_backward ? "cuDNN" : "the own kernel");
}

// Bidirectional attention (causal = false): cuDNN's SDPA graph without the causal mask (its own
// graph: the key separates it) against the own kernel and the CPU, then a causal call of the same
// shape still masked (the cached bidirectional graph is not reused for it). GQA under auto.
TEST(GpuAttentionCudnn, BidirectionalMatchesOwnKernelAndCpu) {
    SCMOE_REQUIRE_CUDNN();
    Backends b;
    std::uint64_t seed = 780;
    check_cudnn_against_own_and_cpu(b, {2, 100, 4, 64, 0, false}, seed += 5);
    check_cudnn_against_own_and_cpu(b, {1, 300, 2, 128, 0, false}, seed += 5);
    check_cudnn_against_own_and_cpu(b, {3, 65, 2, 64, 0, false}, seed += 5);
    check_cudnn_against_own_and_cpu(b, {1, 77, 2, 64, 0, false}, seed += 5, 3.0f);  // peaky softmax
    check_cudnn_against_own_and_cpu(b, {8, 144, 12, 64, 0, false}, seed += 5);      // SwinV2 stage 3's seq and heads
    check_cudnn_against_own_and_cpu(b, {2, 100, 4, 64}, seed += 5);  // causal again after the bidirectional graph
    for (const Shape s : {Shape{2, 100, 4, 64, 2, false}, Shape{2, 65, 8, 64, 1, false}}) {
        SCOPED_TRACE("GQA " + s.name());
        const Ran ran = run_auto_against_cpu(b, s, seed += 5);
        std::printf("GQA %s: cuDNN forward %lld backward %lld, own forward %lld backward %lld\n", s.name().c_str(),
                    ran.cudnn_forward, ran.cudnn_backward, ran.own_forward, ran.own_backward);
        if (ran.cudnn_forward > 0 && ran.cudnn_backward > 0) check_cudnn_against_own_and_cpu(b, s, seed += 5);
    }
}

TEST(GpuAttentionCudnn, LongSequenceMatchesOwnKernelAndCpu) {
    SCMOE_REQUIRE_CUDNN();
    Backends b;
    check_cudnn_against_own_and_cpu(b, {2, 1000, 2, 64}, 800);
    check_cudnn_against_own_and_cpu(b, {1, 1030, 2, 128}, 801);
}

// lse means the same on both providers: each backward takes the other forward's out and lse.
TEST(GpuAttentionCudnn, LseIsInterchangeableBetweenProviders) {
    SCMOE_REQUIRE_CUDNN();
    Backends b;
    for (const Shape& s : {Shape{2, 129, 2, 64}, Shape{1, 200, 3, 128}}) {
        SCOPED_TRACE(s.name());
        const Inputs in = make_inputs(s, 900);
        const Result own_then_cudnn = run_gpu(b, s, in, AttentionProvider::kOwn, AttentionProvider::kCudnn);
        const Result cudnn_then_own = run_gpu(b, s, in, AttentionProvider::kCudnn, AttentionProvider::kOwn);
        expect_grad_close(own_then_cudnn.grad_qkv, run_cpu(b, s, in, own_then_cudnn.out).grad_qkv,
                          "cuDNN backward on the own forward's lse");
        expect_grad_close(cudnn_then_own.grad_qkv, run_cpu(b, s, in, cudnn_then_own.out).grad_qkv,
                          "own backward on cuDNN's lse");
    }
}

TEST(GpuAttentionCudnn, InferenceWithoutLseGivesTheSameOutput) {
    SCMOE_REQUIRE_CUDNN();
    Backends b;
    const Shape s{2, 90, 2, 64};
    const Inputs in = make_inputs(s, 1000);
    const Result with_lse = run_gpu(b, s, in, AttentionProvider::kCudnn, AttentionProvider::kCudnn);
    DeviceBuffer dqkv = upload(b, in.qkv, DType::kBF16), dout = upload(b, F(with_lse.out.size(), kNaN), DType::kBF16);
    attention_forward({s.batch, s.seq, s.heads, s.head_dim, DType::kBF16, dqkv.data(), dout.data(), nullptr},
                      *b.gpu_stream, AttentionProvider::kCudnn);
    // A different graph (no Stats output): not promised bitwise, within one bf16 rounding.
    expect_close(download(b, dout.data(), s.out_size(), DType::kBF16), with_lse.out, 1e-2f, "out without lse");
}

// From sm_90 on, the default backward (SCMOE_ATTENTION_DETERMINISTIC unset) is cuDNN's deterministic
// algorithm: bitwise equal over 5 repeats at a training shape (8 x 12 heads x 1024, many key blocks
// per query block: where atomic dQ accumulation differs run to run). Below sm_90 the default is the
// atomic backward, and determinism is not promised.
TEST(GpuAttentionCudnn, ForwardAndBackwardAreBitwiseDeterministic) {
    SCMOE_REQUIRE_CUDNN();
    Backends b;
    const Shape s{8, 1024, 12, 64};
    const Inputs in = make_inputs(s, 1100);
    const AttentionStats before = attention_stats();
    const Result first = run_gpu(b, s, in, AttentionProvider::kCudnn, AttentionProvider::kCudnn);
    if (compute_capability(b) < 90) {
        EXPECT_EQ(ran_since(before).cudnn_deterministic_backward, 0) << "below sm_90 the default is atomic";
        GTEST_SKIP() << "sm_" << compute_capability(b) << ": cuDNN's backward is not deterministic by default here";
    }
    for (int run = 0; run < 5; ++run) {
        const Result again = run_gpu(b, s, in, AttentionProvider::kCudnn, AttentionProvider::kCudnn);
        expect_bitwise_equal(again.out, first.out, "out");
        expect_bitwise_equal(again.lse, first.lse, "lse");
        expect_bitwise_equal(again.grad_qkv, first.grad_qkv, "grad_qkv");
    }
    const Ran ran = ran_since(before);
    EXPECT_EQ(ran.cudnn_forward, 6);
    EXPECT_EQ(ran.cudnn_deterministic_backward, 6) << "every backward must be cuDNN's deterministic one";
    std::printf("deterministic backward workspace: %.1f MiB\n",
                static_cast<double>(attention_stats().cudnn_max_workspace_bytes) / (1 << 20));
}

// SCMOE_ATTENTION_DETERMINISTIC=0: cuDNN's faster backward (atomic dQ), same values within tolerance.
TEST(GpuAttentionCudnn, NonDeterministicBackwardStillMatches) {
    SCMOE_REQUIRE_CUDNN();
    Backends b;
    const Shape s{2, 200, 4, 64};
    const Inputs in = make_inputs(s, 1150);
    const Result deterministic = run_gpu(b, s, in, AttentionProvider::kCudnn, AttentionProvider::kCudnn);
    ScopedEnv env("SCMOE_ATTENTION_DETERMINISTIC", "0");
    const AttentionStats before = attention_stats();
    const Result fast = run_gpu(b, s, in, AttentionProvider::kCudnn, AttentionProvider::kCudnn);
    const Ran ran = ran_since(before);
    EXPECT_EQ(ran.cudnn_backward, 1);
    EXPECT_EQ(ran.cudnn_deterministic_backward, 0) << "SCMOE_ATTENTION_DETERMINISTIC=0 ran the deterministic one";
    expect_grad_close(fast.grad_qkv, deterministic.grad_qkv, "grad_qkv, atomic vs deterministic dQ");
}

// auto runs cuDNN for bf16; SCMOE_ATTENTION_PROVIDER=own turns auto into the own kernel; an explicit
// argument is not overridden.
TEST(GpuAttentionCudnn, EnvironmentSelectsTheProviderOfAuto) {
    SCMOE_REQUIRE_CUDNN();
    Backends b;
    const Shape s{1, 70, 2, 64};
    const Inputs in = make_inputs(s, 1200);
    const Result cudnn = run_gpu(b, s, in, AttentionProvider::kCudnn, AttentionProvider::kCudnn);
    const Result own = run_gpu(b, s, in, AttentionProvider::kOwn, AttentionProvider::kOwn);
    {
        ScopedEnv env("SCMOE_ATTENTION_PROVIDER", "");
        const AttentionStats before = attention_stats();
        const Result autod = run_gpu(b, s, in, AttentionProvider::kAuto, AttentionProvider::kAuto);
        const Ran ran = ran_since(before);
        EXPECT_TRUE(ran.cudnn_forward == 1 && ran.cudnn_backward == 1 && ran.own_forward + ran.own_backward == 0)
            << "auto on bf16, head_dim 64 must run cuDNN";
        expect_bitwise_equal(autod.grad_qkv, cudnn.grad_qkv, "auto = cudnn");
    }
    {
        ScopedEnv env("SCMOE_ATTENTION_PROVIDER", "own");
        AttentionStats before = attention_stats();
        const Result autod = run_gpu(b, s, in, AttentionProvider::kAuto, AttentionProvider::kAuto);
        Ran ran = ran_since(before);
        EXPECT_TRUE(ran.own_forward == 1 && ran.own_backward == 1 && ran.cudnn_forward + ran.cudnn_backward == 0)
            << "SCMOE_ATTENTION_PROVIDER=own must make auto run the own kernel";
        expect_bitwise_equal(autod.out, own.out, "SCMOE_ATTENTION_PROVIDER=own: out");
        expect_bitwise_equal(autod.grad_qkv, own.grad_qkv, "SCMOE_ATTENTION_PROVIDER=own: grad_qkv");
        before = attention_stats();
        const Result explicit_cudnn = run_gpu(b, s, in, AttentionProvider::kCudnn, AttentionProvider::kCudnn);
        ran = ran_since(before);
        EXPECT_TRUE(ran.cudnn_forward == 1 && ran.cudnn_backward == 1) << "an explicit cudnn is not overridden";
        expect_bitwise_equal(explicit_cudnn.grad_qkv, cudnn.grad_qkv, "explicit cudnn under the variable");
    }
    {
        ScopedEnv env("SCMOE_ATTENTION_PROVIDER", "sometimes");
        EXPECT_THROW(run_gpu(b, s, in, AttentionProvider::kAuto, AttentionProvider::kAuto), Error);
    }
}

// Where cuDNN cannot run: explicit cudnn throws, auto runs the own kernel (same bits as kOwn).
TEST(GpuAttentionCudnn, AutoFallsBackWhereCudnnCannotRun) {
    SCMOE_REQUIRE_CUDNN();
    Backends b;
    {
        // f32: cuDNN's SDPA is bf16 here.
        const Shape s{1, 40, 2, 64};
        DeviceBuffer buf(*b.gpu, static_cast<std::size_t>(s.qkv_size()) * 4);
        EXPECT_THROW(
            attention_forward({s.batch, s.seq, s.heads, s.head_dim, DType::kF32, buf.data(), buf.data(), nullptr},
                              *b.gpu_stream, AttentionProvider::kCudnn),
            Error);
    }
    {
        // head_dim 20 (not a multiple of 8), and qkv one element past a 16-byte boundary.
        const Shape s{2, 33, 2, 20};
        const Inputs in = make_inputs(s, 1300);
        const Result own = run_gpu(b, s, in, AttentionProvider::kOwn, AttentionProvider::kOwn);
        const Result autod = run_gpu(b, s, in, AttentionProvider::kAuto, AttentionProvider::kAuto);
        expect_bitwise_equal(autod.grad_qkv, own.grad_qkv, "auto on head_dim 20 = own");
        EXPECT_THROW(run_gpu(b, s, in, AttentionProvider::kCudnn, AttentionProvider::kCudnn), Error);
    }
    {
        const Shape s{1, 50, 2, 64};
        const Inputs in = make_inputs(s, 1400);
        F padded(in.qkv.size() + 1, 0.0f);
        std::copy(in.qkv.begin(), in.qkv.end(), padded.begin() + 1);
        DeviceBuffer dqkv = upload(b, padded, DType::kBF16);
        const void* unaligned = dqkv.as<char>() + 2;  // one bf16 element in
        DeviceBuffer auto_out = upload(b, F(static_cast<std::size_t>(s.out_size()), kNaN), DType::kBF16);
        DeviceBuffer own_out = upload(b, F(static_cast<std::size_t>(s.out_size()), kNaN), DType::kBF16);
        const AttentionArgs a{s.batch, s.seq, s.heads, s.head_dim, DType::kBF16, unaligned, auto_out.data(), nullptr};
        AttentionArgs own = a;
        own.out = own_out.data();
        attention_forward(a, *b.gpu_stream, AttentionProvider::kAuto);
        attention_forward(own, *b.gpu_stream, AttentionProvider::kOwn);
        expect_bitwise_equal(download(b, auto_out.data(), s.out_size(), DType::kBF16),
                             download(b, own_out.data(), s.out_size(), DType::kBF16), "auto on an unaligned qkv = own");
        EXPECT_THROW(attention_forward(a, *b.gpu_stream, AttentionProvider::kCudnn), Error);
    }
    b.gpu_stream->synchronize();
}

// head_dim 256: cuDNN runs it on sm_90 (cuDNN >= 9.9), forward and backward (asserted); on sm_80 its
// support check turns the backward down and auto runs the own kernel (saying so once on stderr).
// Either way the result matches the CPU.
TEST(GpuAttentionCudnn, LargestHeadDimRunsUnderAuto) {
    SCMOE_REQUIRE_CUDNN();
    Backends b;
    const Ran ran = run_auto_against_cpu(b, {1, 130, 2, 256}, 1500);
    if (compute_capability(b) >= 90) {
        EXPECT_EQ(ran.cudnn_forward, 1) << "head_dim 256 forward must run cuDNN on sm_90";
        EXPECT_EQ(ran.cudnn_backward, 1) << "head_dim 256 backward must run cuDNN on sm_90";
    } else {
        EXPECT_EQ(ran.cudnn_backward + ran.own_backward, 1);
    }
}

}  // namespace
}  // namespace scmoe
