// The stack model (scmoe/kernels/emu/stack.h, launch/emu_stack.h): unfused attention costs its formula,
// framework time delays every launch by the per-op time, the all-to-all factor scales the all-to-all
// and nothing else, the small-GEMM curve is monotone with the ceiling at large sizes, the default
// (scmoe) stack leaves a hand-checked timeline as it was, and bad stack files are refused naming the
// field. Each expected time is worked out by hand on test::round_spec()'s round numbers.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "emu/emu_test_util.h"
#include "launch/emu_choice.h"
#include "launch/emu_stack.h"
#include "scmoe/comm/emu_communicator.h"
#include "scmoe/comm/topology.h"
#include "scmoe/kernels/emu/cost_model.h"
#include "scmoe/kernels/emu/emu_device.h"
#include "scmoe/kernels/emu/emu_ops.h"
#include "scmoe/kernels/emu/stack.h"
#include "scmoe/kernels/error.h"
#include "scmoe/kernels/gemm.h"
#include "scmoe/kernels/permute.h"
#include "scmoe/moe/backbone.h"

namespace scmoe {
namespace {

using test::device_with;
using test::elapsed_us;

emu::Stack unfused(bool dropout) {
    emu::Stack s;
    s.name = "unfused-test";
    s.attention = emu::AttentionImpl::kUnfused;
    s.attention_dropout = dropout;
    return s;
}

// batch 1, 10 heads of 128, seq 1280, bf16: Q = 10*1280*128 = 1,638,400 elements of q (k, v, out),
// S = 10*1280*1280 = 16,384,000 scores. round_spec: 1e8 tensor FLOP/us, 1e7 vector FLOP/us, 1e6 B/us,
// 100 SMs, no launch cost here (launch_us 0), a 1 us gap before each kernel.
TEST(EmuStack, UnfusedAttentionCostsWhatTheFormulaSays) {
    emu::GpuSpec spec = test::round_spec();
    spec.launch_us = 0;
    const std::vector<emu::StackKernel> fwd = emu::unfused_attention_forward(test::hand_attention_shape(), {.dropout = true});
    ASSERT_EQ(fwd.size(), 6u);
    // Per kernel, us: max(FLOPs / rate, bytes / 1e6).
    //   q_scale  reads and writes Q bf16: 4Q B = 6,553,600 B                         -> 6.5536
    //   qk_bmm   2*S*128 = 4.194e9 FLOP -> 41.94304 (1000 tiles: 10 full waves);
    //            q, k and the mask read, the scores written: 2(2Q + S) + 2S = 72,089,600 B -> 72.0896
    //   softmax  4S B                                                                 -> 65.536
    //   dropout  4S B + the S-byte mask                                               -> 81.92
    //   pv_bmm   4.194e9 FLOP over 10 x 10 tiles = one full wave -> 41.94304; 2(S + Q) + 2Q B -> 39.3216
    //   out_copy 4Q B                                                                 -> 6.5536
    const double expect_fwd[] = {6.5536, 72.0896, 65.536, 81.92, 41.94304, 6.5536};
    const char* names_fwd[] = {"attn_q_scale", "attn_qk_bmm", "attn_softmax", "attn_dropout", "attn_pv_bmm",
                               "attn_out_copy"};
    double sum = 0;
    for (std::size_t i = 0; i < fwd.size(); ++i) {
        EXPECT_STREQ(fwd[i].name, names_fwd[i]);
        EXPECT_NEAR(emu::model_kernel(fwd[i].cost, spec).work_us, expect_fwd[i], 1e-9) << fwd[i].name;
        sum += 1.0 + expect_fwd[i];
    }
    EXPECT_NEAR(sum, 280.59584, 1e-9);
    // On the emulated device under the stack: the kernels back to back on the stream.
    auto device = device_with(unfused(true), spec);
    test::HandAttention h(*device);
    EXPECT_NEAR(elapsed_us(*device, [&](Stream& s) { emu::attention_forward(h.fwd, s); }), 280.59584, 1e-4);
    // Without the dropout pass: 5 kernels, 280.59584 - 82.92.
    auto no_dropout = device_with(unfused(false), spec);
    test::HandAttention h2(*no_dropout);
    EXPECT_NEAR(elapsed_us(*no_dropout, [&](Stream& s) { emu::attention_forward(h2.fwd, s); }), 280.59584 - 82.92,
                1e-4);

    // Backward, us: out_copy 6.5536; dP = dO v^T 41.94304 (2*2Q + 2S = 39,321,600 B is less); dV = P^T dO
    // 41.94304; dropout 81.92; softmax reads dP and P, writes dS: 6S B -> 98.304; dQ, dK 41.94304
    // each; q_scale 6.5536. With the 8 gaps: 369.10336.
    const std::vector<emu::StackKernel> bwd = emu::unfused_attention_backward(h.bwd, {.dropout = true});
    ASSERT_EQ(bwd.size(), 8u);
    const double expect_bwd[] = {6.5536, 41.94304, 41.94304, 81.92, 98.304, 41.94304, 41.94304, 6.5536};
    for (std::size_t i = 0; i < bwd.size(); ++i)
        EXPECT_NEAR(emu::model_kernel(bwd[i].cost, spec).work_us, expect_bwd[i], 1e-9) << bwd[i].name;
    EXPECT_NEAR(elapsed_us(*device, [&](Stream& s) { emu::attention_backward(h.bwd, s); }), 369.10336, 1e-4);
}

// Bidirectional attention (causal = false) under the unfused stack: PyTorch's MHA without attn_mask
// runs bmm(q, k^T), not baddbmm(mask, q, k^T), so attn_qk_bmm reads no mask (S elements fewer) and
// every other kernel is unchanged; the backward's kernels are the same (the mask had no gradient
// kernel). Same shapes as above: qk_bmm reads and writes 2(2Q) + 2S = 39,321,600 B -> 39.3216 us,
// below its 41.94304 us of FLOPs, so the forward is 72.0896 - 41.94304 = 30.14656 us shorter.
TEST(EmuStack, UnfusedBidirectionalAttentionReadsNoMask) {
    emu::GpuSpec spec = test::round_spec();
    spec.launch_us = 0;
    auto device = device_with(unfused(true), spec);
    test::HandAttention h(*device);
    AttentionArgs& a = h.fwd;
    const std::vector<emu::StackKernel> causal = emu::unfused_attention_forward(a, {.dropout = true});
    a.causal = false;
    const std::vector<emu::StackKernel> bidir = emu::unfused_attention_forward(a, {.dropout = true});
    ASSERT_EQ(bidir.size(), causal.size());
    const double S = 10.0 * 1280 * 1280;
    for (std::size_t i = 0; i < bidir.size(); ++i) {
        EXPECT_STREQ(bidir[i].name, causal[i].name);
        EXPECT_EQ(bidir[i].cost.flops, causal[i].cost.flops) << bidir[i].name;
        const double fewer = std::string(bidir[i].name) == "attn_qk_bmm" ? 2.0 * S : 0.0;  // the bf16 mask
        EXPECT_DOUBLE_EQ(bidir[i].cost.bytes, causal[i].cost.bytes - fewer) << bidir[i].name;
    }
    EXPECT_NEAR(emu::model_kernel(bidir[1].cost, spec).work_us, 41.94304, 1e-9);
    EXPECT_NEAR(elapsed_us(*device, [&](Stream& s) { emu::attention_forward(a, s); }), 280.59584 - 30.14656, 1e-4);

    AttentionBackwardArgs& b = h.bwd;
    const std::vector<emu::StackKernel> causal_bwd = emu::unfused_attention_backward(b, {.dropout = true});
    b.causal = false;
    const std::vector<emu::StackKernel> bidir_bwd = emu::unfused_attention_backward(b, {.dropout = true});
    ASSERT_EQ(bidir_bwd.size(), causal_bwd.size());
    for (std::size_t i = 0; i < bidir_bwd.size(); ++i) {
        EXPECT_STREQ(bidir_bwd[i].name, causal_bwd[i].name);
        EXPECT_EQ(bidir_bwd[i].cost.flops, causal_bwd[i].cost.flops) << bidir_bwd[i].name;
        EXPECT_EQ(bidir_bwd[i].cost.bytes, causal_bwd[i].cost.bytes) << bidir_bwd[i].name;
    }
    EXPECT_NEAR(elapsed_us(*device, [&](Stream& s) { emu::attention_backward(b, s); }), 369.10336, 1e-4);
}

// The fused kernel (the default stack) costs the full square without causal: twice the FLOPs at the
// same bytes (attention.h's op_cost), so a FLOP-bound shape takes twice as long.
TEST(EmuStack, FusedBidirectionalAttentionCountsTwiceTheFlops) {
    emu::GpuSpec spec = test::round_spec();
    spec.launch_us = 0;
    auto device = device_with(emu::Stack{}, spec);
    test::HandAttention h(*device);
    AttentionArgs& a = h.fwd;
    const double causal_us = elapsed_us(*device, [&](Stream& s) { emu::attention_forward(a, s); });
    a.causal = false;
    const double bidir_us = elapsed_us(*device, [&](Stream& s) { emu::attention_forward(a, s); });
    OpCost c = op_cost(a);
    a.causal = true;
    EXPECT_DOUBLE_EQ(c.flops, 2.0 * op_cost(a).flops);
    // 4.194e9 FLOPs causal: 41.94 us of tensor work at the 1e8 FLOP/us, far above the bytes' 6.6 us.
    EXPECT_GT(causal_us, 0.0);
    EXPECT_NEAR(bidir_us - 1.0, 2.0 * (causal_us - 1.0), 1e-3 * causal_us) << "the 1 us gap aside";
}

// An inference forward (one that keeps no statistics for a backward: lse null, as an
// AttentionSublayer in inference mode passes it) runs no dropout pass: PyTorch's dropout is off in
// eval mode. Same shapes and times as above.
TEST(EmuStack, AnInferenceForwardRunsNoDropoutPass) {
    emu::GpuSpec spec = test::round_spec();
    spec.launch_us = 0;
    auto device = device_with(unfused(true), spec);
    test::HandAttention h(*device);
    AttentionArgs& a = h.fwd;
    EXPECT_NEAR(elapsed_us(*device, [&](Stream& s) { emu::attention_forward(a, s); }), 280.59584, 1e-4);
    a.lse = nullptr;
    EXPECT_NEAR(elapsed_us(*device, [&](Stream& s) { emu::attention_forward(a, s); }), 280.59584 - 82.92, 1e-4);
}

// The signal comes from the model: an AttentionSublayer in inference mode (BlockStack::set_training,
// which the trainer's evaluation and forward timing set) passes no lse, so under the paper stack its
// forward is shorter by exactly the dropout kernel (and its gap), and a backward after it throws.
TEST(EmuStack, TheBackbonesInferenceForwardSkipsTheDropoutPass) {
    emu::GpuSpec spec = test::round_spec();
    spec.launch_us = 0;
    auto device = device_with(emu::builtin_stack("paper"), spec);
    BackboneShape shape;
    shape.hidden = 1280, shape.heads = 10, shape.seq_len = 1280, shape.ffn = 1280;
    shape.dtype = DType::kBF16;
    const std::int64_t T = 1280, H = 1280;
    AttentionSublayer attn(shape, *device, T);
    DeviceBuffer params(*device, (H + 3 * H * H + H * H) * 2), grads(*device, (H + 3 * H * H + H * H) * 4);
    DeviceBuffer h(*device, T * H * 2), out(*device, T * H * 2), grad_in(*device, T * H * 2);
    auto* pb = static_cast<char*>(params.data());
    auto* gb = static_cast<char*>(grads.data());
    const std::vector<Tensor> p = {Tensor(pb, DType::kBF16, {H}), Tensor(pb + H * 2, DType::kBF16, {H, 3 * H}),
                                   Tensor(pb + (H + 3 * H * H) * 2, DType::kBF16, {H, H})};
    const std::vector<Tensor> g = {Tensor(gb, DType::kF32, {H}), Tensor(gb + H * 4, DType::kF32, {H, 3 * H}),
                                   Tensor(gb + (H + 3 * H * H) * 4, DType::kF32, {H, H})};
    const Tensor in(h.data(), DType::kBF16, {T, H}), y(out.data(), DType::kBF16, {T, H}),
        gin(grad_in.data(), DType::kBF16, {T, H});
    const double train_us = elapsed_us(*device, [&](Stream& s) { attn.forward(in, p, y, s); });
    attn.set_training(false);
    const double infer_us = elapsed_us(*device, [&](Stream& s) { attn.forward(in, p, y, s); });
    // The dropout kernel: 4S + S bytes = 81.92 us on round_spec, plus its 1 us gap.
    EXPECT_NEAR(train_us - infer_us, 82.92, 1e-4);
    auto stream = device->create_stream();
    EXPECT_THROW(attn.backward(y, p, g, gin, *stream), Error);
    attn.set_training(true);
    attn.forward(in, p, y, *stream);
    attn.backward(y, p, g, gin, *stream);
    stream->synchronize();
}

// BackboneShape::causal reaches the emulated op: the paper stack's bidirectional sublayer forward is
// shorter by exactly the mask read of attn_qk_bmm (30.14656 us, the test above).
TEST(EmuStack, TheBackbonesBidirectionalAttentionReadsNoMask) {
    emu::GpuSpec spec = test::round_spec();
    spec.launch_us = 0;
    auto device = device_with(emu::builtin_stack("paper"), spec);
    const std::int64_t T = 1280, H = 1280;
    DeviceBuffer params(*device, (H + 3 * H * H + H * H) * 2);
    DeviceBuffer h(*device, T * H * 2), out(*device, T * H * 2);
    auto* pb = static_cast<char*>(params.data());
    const std::vector<Tensor> p = {Tensor(pb, DType::kBF16, {H}), Tensor(pb + H * 2, DType::kBF16, {H, 3 * H}),
                                   Tensor(pb + (H + 3 * H * H) * 2, DType::kBF16, {H, H})};
    const Tensor in(h.data(), DType::kBF16, {T, H}), y(out.data(), DType::kBF16, {T, H});
    double us[2];
    for (const bool causal : {true, false}) {
        BackboneShape shape;
        shape.hidden = H, shape.heads = 10, shape.seq_len = 1280, shape.ffn = 1280;
        shape.dtype = DType::kBF16;
        shape.causal = causal;
        AttentionSublayer attn(shape, *device, T);
        us[causal ? 0 : 1] = elapsed_us(*device, [&](Stream& s) { attn.forward(in, p, y, s); });
    }
    EXPECT_NEAR(us[0] - us[1], 30.14656, 1e-4);
}

// Training under an unfused stack keeps the [b*h, s, s] tensors autograd saves, counted against the
// device's memory from the forward until the backward frees them (emu_ops.cpp). batch 1, 2 heads,
// seq 64, bf16: one score-sized tensor is Se = 2*64*64*2 = 16,384 B, the dropout mask S = 8,192 B.
TEST(EmuStack, UnfusedAttentionsSavedScoresCountAgainstDeviceMemory) {
    const std::uint64_t Se = 16384, S = 8192;
    for (const bool dropout : {true, false}) {
        auto device = device_with(unfused(dropout));
        emu::EmuDevice& emu_device = emu::as_emu(*device);
        test::SmallAttention attention(*device);
        AttentionArgs& a = attention.fwd;
        const AttentionBackwardArgs& b = attention.bwd;
        auto stream = device->create_stream();
        const std::uint64_t base = emu_device.memory().in_use;
        ASSERT_EQ(emu_device.memory().peak, base);
        // Training forward: kept: the probabilities, with dropout also the mask and the dropped
        // probabilities. Peak: that, or scores + probabilities while the softmax runs (without dropout).
        emu::attention_forward(a, *stream);
        const std::uint64_t saved = dropout ? 2 * Se + S : Se;
        EXPECT_EQ(emu_device.memory().in_use - base, saved) << dropout;
        EXPECT_EQ(emu_device.memory().peak - base, dropout ? 2 * Se + S : 2 * Se) << dropout;
        // Its backward frees them all; at its peak the saved tensors and two gradients live: with
        // dropout dP of the dropped probabilities and dP (4Se + S), without dP and dS beside P (3Se).
        emu::attention_backward(b, *stream);
        EXPECT_EQ(emu_device.memory().in_use, base) << dropout;
        EXPECT_EQ(emu_device.memory().peak - base, dropout ? 4 * Se + S : 3 * Se) << dropout;
        // An inference forward keeps nothing.
        a.lse = nullptr;
        emu::attention_forward(a, *stream);
        EXPECT_EQ(emu_device.memory().in_use, base) << dropout;
        stream->synchronize();
    }
    // Two layers' forwards keep both (keyed by each layer's output buffer); the fused stack keeps none.
    auto device = device_with(unfused(true));
    emu::EmuDevice& emu_device = emu::as_emu(*device);
    test::SmallAttention attention(*device);
    DeviceBuffer out2(*device, 2048 * 2);
    auto stream = device->create_stream();
    const std::uint64_t base = emu_device.memory().in_use;
    AttentionArgs a = attention.fwd;
    emu::attention_forward(a, *stream);
    a.out = out2.data();
    emu::attention_forward(a, *stream);
    EXPECT_EQ(emu_device.memory().in_use - base, 2 * (2 * Se + S));
    auto fused = device_with(emu::builtin_stack("scmoe"));
    test::SmallAttention fused_attention(*fused);
    const std::uint64_t fused_base = emu::as_emu(*fused).memory().in_use;
    auto fused_stream = fused->create_stream();
    emu::attention_forward(fused_attention.fwd, *fused_stream);
    EXPECT_EQ(emu::as_emu(*fused).memory().peak, fused_base);
    stream->synchronize();
    fused_stream->synchronize();
}

// A 3 us kernel (3e6 bytes at 1e6 B/us) after round_spec's 1 us gap; launch_us 2.
void three_us_kernel(Stream& s) {
    OpCost c;
    c.bytes = 3e6;
    c.threads = 1e6;
    emu::as_emu(s).launch("k", c);
}

TEST(EmuStack, FrameworkTimeDelaysEachLaunchByThePerOpTime) {
    emu::Stack stack;
    stack.name = "framework-test";
    stack.framework_us = 5;
    auto device = device_with(stack);
    auto stream = device->create_stream();
    // Each launch costs the host 2 us of launch + 5 us of framework: launched at 7, 14, 21. The GPU,
    // idle, starts each at its launch: 1 + 3 us each, the last ends at 25; the sync returns 3 us later.
    for (int i = 1; i <= 3; ++i) {
        three_us_kernel(*stream);
        EXPECT_DOUBLE_EQ(device->host_time_us(), 7.0 * i);
    }
    stream->synchronize();
    EXPECT_DOUBLE_EQ(device->host_time_us(), 28.0);
    // The scmoe stack: launched at 2, 4, 6; the kernels queue behind each other (2-6, 6-10, 10-14).
    auto plain = device_with(emu::builtin_stack("scmoe"));
    auto s2 = plain->create_stream();
    for (int i = 0; i < 3; ++i) three_us_kernel(*s2);
    EXPECT_DOUBLE_EQ(plain->host_time_us(), 6.0);
    s2->synchronize();
    EXPECT_DOUBLE_EQ(plain->host_time_us(), 17.0);
}

// The communicator's launches carry it too (a framework's collective is an op like any other): one
// member's all-reduce of a large buffer (not moved for real) costs the host launch + framework.
TEST(EmuStack, FrameworkTimeDelaysTheCommunicatorsLaunchesToo) {
    for (const double framework : {0.0, 5.0}) {
        emu::Stack stack;
        stack.framework_us = framework;
        auto device = device_with(stack);
        auto group = EmuGroup::create(cluster_topology("a800-nvlink-8"), {0});
        auto comm = group->communicator(0);
        auto stream = device->create_stream();
        DeviceBuffer buf(*device, 64 << 20);
        const double t0 = device->host_time_us();
        comm->all_reduce_sum(buf.data(), 32 << 20, DType::kBF16, *stream);
        EXPECT_DOUBLE_EQ(device->host_time_us() - t0, 2.0 + framework) << "framework " << framework;
        stream->synchronize();
    }
}

TEST(EmuStack, TheAllToAllFactorScalesTheAllToAllAndNotTheAllReduce) {
    const std::vector<int> ranks = {0, 1, 2, 3, 4, 5, 6, 7};
    const std::vector<double> bytes(64, 1e6);
    for (const char* preset : {"a800-nvlink-8", "a30-pcie-8", "a800-2x8"}) {
        Topology t = cluster_topology(preset);
        const std::vector<int> members = t.nodes > 1 ? std::vector<int>{0, 1, 2, 3, 8, 9, 10, 11} : ranks;
        const double latency = t.base_latency_us + (t.nodes > 1 ? t.net_latency_us : t.hop_latency_us);
        const auto base = all_to_all_us(t, members, bytes);
        const double reduce = all_reduce_us(t, members, 64e6), gather = all_gather_us(t, members, 8e6);
        t.all_to_all_efficiency = 0.5;
        const auto half = all_to_all_us(t, members, bytes);
        for (std::size_t i = 0; i < base.size(); ++i)
            EXPECT_NEAR(half[i] - latency, 2.0 * (base[i] - latency), 1e-9) << preset << " member " << i;
        EXPECT_DOUBLE_EQ(all_reduce_us(t, members, 64e6), reduce) << preset;
        EXPECT_DOUBLE_EQ(all_gather_us(t, members, 8e6), gather) << preset;
        // The stack carries it onto the topology the tools build.
        emu::Stack stack;
        stack.all_to_all_efficiency = 0.5;
        EXPECT_DOUBLE_EQ(launch::stack_topology(preset, stack).all_to_all_efficiency, 0.5);
        EXPECT_DOUBLE_EQ(launch::stack_topology(preset, emu::builtin_stack("scmoe")).all_to_all_efficiency, 1.0);
    }
}

TEST(EmuStack, TheSmallGemmCurveIsMonotoneAndTheCeilingAtLargeSizes) {
    emu::Stack s;
    s.small_gemm = {{64, 0.4}, {1024, 0.8}, {8192, 1.0}};
    emu::check_stack(s);
    EXPECT_DOUBLE_EQ(emu::small_gemm_fraction(s, 1), 0.4);
    EXPECT_DOUBLE_EQ(emu::small_gemm_fraction(s, 64), 0.4);
    EXPECT_NEAR(emu::small_gemm_fraction(s, 256), 0.6, 1e-12);  // 2 of log2's 4 steps from 64 to 1024
    EXPECT_DOUBLE_EQ(emu::small_gemm_fraction(s, 8192), 1.0);
    EXPECT_DOUBLE_EQ(emu::small_gemm_fraction(s, 1e7), 1.0);
    double last = 0;
    for (double size = 1; size < 1e6; size *= 1.1) {
        const double f = emu::small_gemm_fraction(s, size);
        EXPECT_GE(f, last) << size;
        last = f;
    }
    // On a compute-bound GEMM (smallest side 256 rows): its time over the fraction; at 8192 rows the ceiling.
    const emu::GpuSpec spec = test::round_spec();
    GemmArgs g;
    g.m = 256, g.n = 4096, g.k = 4096, g.ab_dtype = g.c_dtype = DType::kBF16;
    const OpCost c = op_cost(g);
    EXPECT_NEAR(emu::small_gemm_fraction(s, c), 0.6, 1e-12);
    EXPECT_NEAR(emu::model_kernel(c, spec, 0, emu::small_gemm_fraction(s, c)).work_us,
                emu::model_kernel(c, spec).work_us / 0.6, 1e-9);
    GemmArgs big = g;
    big.m = big.n = big.k = 8192;
    EXPECT_DOUBLE_EQ(emu::small_gemm_fraction(s, op_cost(big)), 1.0);
    // Through the device: the GEMM kernel under the stack takes that time.
    emu::GpuSpec no_launch = spec;
    no_launch.launch_us = 0;
    auto device = device_with(s, no_launch);
    g.m = 256;
    DeviceBuffer a(*device, 256 * 4096 * 2), b(*device, 4096 * 4096 * 2), out(*device, 256 * 4096 * 2);
    g.a = a.data(), g.b = b.data(), g.c = out.data();
    EXPECT_NEAR(elapsed_us(*device, [&](Stream& st) { emu::gemm(g, st); }),
                1.0 + emu::model_kernel(c, spec).work_us / 0.6, 1e-4);
    // Refused: fractions falling, sizes out of order, a ceiling below 1.
    emu::Stack bad = s;
    bad.small_gemm = {{64, 0.8}, {1024, 0.4}, {8192, 1.0}};
    EXPECT_THROW(emu::check_stack(bad), Error);
    bad.small_gemm = {{1024, 0.4}, {64, 0.8}, {8192, 1.0}};
    EXPECT_THROW(emu::check_stack(bad), Error);
    bad.small_gemm = {{64, 0.4}, {1024, 0.8}};
    EXPECT_THROW(emu::check_stack(bad), Error);
}

// The default stack adds nothing: a GEMM, a fused attention and a copy on round_spec, by hand, the
// same with no stack named, with the built-in scmoe stack, and through the launch layer's "scmoe".
TEST(EmuStack, TheScmoeStackLeavesAHandCheckedTimelineUnchanged) {
    const emu::GpuSpec spec = test::round_spec();
    GemmArgs g;
    g.m = 1280, g.n = 1280, g.k = 4096, g.ab_dtype = g.c_dtype = DType::kBF16;  // 1 full wave: 134.217728 us
    const AttentionArgs a = test::hand_attention_shape();
    // Fused: 2*10*1280*1280*128 FLOP = 41.94304 us at 1000 tiles of 128x128 (gemm_threads(1280, 128) x 10
    // = 100 tiles: one full wave); it reads qkv and writes out and lse: far less than 41.9 MB.
    const double gemm_us = 2.0 * 1280 * 1280 * 4096 / 1e8, attn_us = 41.94304;
    ASSERT_NEAR(emu::model_kernel(op_cost(g), spec).work_us, gemm_us, 1e-9);
    ASSERT_NEAR(emu::model_kernel(op_cost(a), spec).work_us, attn_us, 1e-9);
    // Launched at 2 and 4 us; the GEMM runs 3..137.217728, the attention 138.217728..180.160768; the
    // host waits for it and 3 us more.
    const double expected_host = 2 + 1 + gemm_us + 1 + attn_us + 3;
    auto run = [&](Device& device) {
        auto stream = device.create_stream();
        DeviceBuffer A(device, 1280 * 4096 * 2), B(device, 4096 * 1280 * 2), C(device, 1280 * 1280 * 2);
        test::HandAttention h(device);
        GemmArgs gg = g;
        gg.a = A.data(), gg.b = B.data(), gg.c = C.data();
        const double t0 = device.host_time_us();
        emu::gemm(gg, *stream);
        emu::attention_forward(h.fwd, *stream);
        stream->synchronize();
        return device.host_time_us() - t0;
    };
    emu::EmuOptions none;
    none.spec = spec;
    auto default_device = emu::make_device(none);
    auto scmoe_device = device_with(emu::builtin_stack("scmoe"));
    const double by_default = run(*default_device), by_scmoe = run(*scmoe_device);
    EXPECT_NEAR(by_default, expected_host, 1e-9);
    EXPECT_EQ(by_scmoe, by_default);  // bitwise
    // The paper stack on the same ops takes longer (its attention is unfused, each launch has framework time).
    auto paper_device = device_with(emu::builtin_stack("paper"));
    EXPECT_GT(run(*paper_device), by_default);
    // The launch layer's default choice is the scmoe stack, and its all-to-all factor is 1.
    const launch::EmuChoice choice = launch::resolve_emu_choice("a800", "", "", 8);
    EXPECT_EQ(choice.stack, "scmoe");
    const emu::Stack loaded = launch::load_stack(choice.stack);
    EXPECT_EQ(loaded.attention, emu::AttentionImpl::kFused);
    EXPECT_EQ(loaded.framework_us, 0.0);
    EXPECT_EQ(loaded.all_to_all_efficiency, 1.0);
    EXPECT_TRUE(loaded.small_gemm.empty());
    const Topology base = cluster_topology("a800-nvlink-8"), with = launch::stack_topology("a800-nvlink-8", loaded);
    const std::vector<double> bytes(64, 3e6);
    const std::vector<int> ranks = {0, 1, 2, 3, 4, 5, 6, 7};
    EXPECT_EQ(all_to_all_us(with, ranks, bytes), all_to_all_us(base, ranks, bytes));
}

std::string write_stack(const std::string& name, const std::string& json) {
    const std::string path = ::testing::TempDir() + name;
    std::ofstream(path) << json;
    return path;
}

// The error of loading `json` as a stack file ("" when it loads).
std::string stack_error(const std::string& json) {
    try {
        launch::load_stack(write_stack("bad_stack.json", json));
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

TEST(EmuStack, AStackFileOverridesItsBase) {
    const emu::Stack s = launch::load_stack(write_stack(
        "ours_stack.json", R"({"base": "paper", "name": "ours", "framework_us": 10, "all_to_all_efficiency": 0.7,
                              "small_gemm": [[128, 0.5], [4096, 1.0]], "sources": ["our profile"]})"));
    EXPECT_EQ(s.name, "ours");
    EXPECT_EQ(s.attention, emu::AttentionImpl::kUnfused);  // the base's
    EXPECT_TRUE(s.attention_dropout);
    EXPECT_DOUBLE_EQ(s.framework_us, 10);
    EXPECT_DOUBLE_EQ(s.all_to_all_efficiency, 0.7);
    ASSERT_EQ(s.small_gemm.size(), 2u);
    EXPECT_DOUBLE_EQ(s.small_gemm[0].fraction, 0.5);
    EXPECT_EQ(s.sources.front(), "our profile");
    EXPECT_TRUE(s.tutel_dispatch);  // the base's
    EXPECT_FALSE(launch::load_stack(write_stack("no_tutel.json", R"({"base": "paper", "tutel_dispatch": false})"))
                     .tutel_dispatch);
    const emu::Stack ddp = launch::load_stack(write_stack(
        "ddp.json", R"({"base": "paper", "grad_reduce": "overlapped", "grad_reduce_dtype": "f32"})"));
    EXPECT_EQ(ddp.grad_reduce, emu::GradReduce::kOverlapped);
    EXPECT_EQ(ddp.grad_reduce_dtype, DType::kF32);
}

// Tutel's dispatch (paper stack): fast_encode and fast_decode and their backwards as their kernels,
// each at its memory traffic on round_spec (1e6 B/us; a 1 us gap before each kernel, no launch cost):
// T = 1000 tokens, H = 100, R = 4000 capacity slots, k = 2, bf16 activations, fp32 in between.
//   encode:          cast in T*H (2+4 B) 0.6, zero fill R*H*4 1.6, 2 x scatter T*H*8 0.8, cast out R*H*6 2.4
//   decode:          cast in R*H 2.4, 2 x gather 0.8, 1 add T*H*12 1.2, cast out T*H 0.6
//   decode backward: cast T*H 0.6, zero fill 1.6, 2 x scatter 0.8, 2 x gate grad (2 T*H + T)*4 0.804, cast R*H 2.4
//   encode backward: cast R*H 2.4, 2 x gather 0.8, 1 add 1.2, cast T*H 0.6; accumulating: + a bf16 add T*H*6 0.6
// scmoe's own permute on the same shapes: one kernel reading and writing R*H bf16, 1.6.
TEST(EmuStack, TutelDispatchCostsItsKernels) {
    emu::GpuSpec spec = test::round_spec();
    spec.launch_us = 0;
    emu::Stack tutel = emu::builtin_stack("scmoe");
    tutel.tutel_dispatch = true;
    auto device = device_with(tutel, spec);
    PermuteArgs p;
    p.rows = 4000, p.tokens = 1000, p.hidden = 100, p.top_k = 2, p.dtype = DType::kBF16;
    CombineArgs c;
    c.rows = 4000, c.tokens = 1000, c.hidden = 100, c.top_k = 2, c.dtype = DType::kBF16;
    CombineBackwardArgs cb;
    cb.rows = 4000, cb.tokens = 1000, cb.hidden = 100, cb.top_k = 2, cb.dtype = DType::kBF16;
    PermuteBackwardArgs pb;
    pb.rows = 4000, pb.tokens = 1000, pb.hidden = 100, pb.top_k = 2, pb.dtype = DType::kBF16;
    EXPECT_NEAR(elapsed_us(*device, [&](Stream& s) { emu::permute(p, s); }), 5 + 0.6 + 1.6 + 0.8 + 0.8 + 2.4, 1e-3);
    EXPECT_NEAR(elapsed_us(*device, [&](Stream& s) { emu::combine(c, s); }), 5 + 2.4 + 0.8 + 0.8 + 1.2 + 0.6, 1e-3);
    EXPECT_NEAR(elapsed_us(*device, [&](Stream& s) { emu::combine_backward(cb, s); }),
                7 + 0.6 + 1.6 + 0.8 + 0.8 + 0.804 + 0.804 + 2.4, 1e-3);
    EXPECT_NEAR(elapsed_us(*device, [&](Stream& s) { emu::permute_backward(pb, s); }), 5 + 2.4 + 0.8 + 0.8 + 1.2 + 0.6,
                1e-3);
    pb.accumulate = true;
    EXPECT_NEAR(elapsed_us(*device, [&](Stream& s) { emu::permute_backward(pb, s); }),
                6 + 2.4 + 0.8 + 0.8 + 1.2 + 0.6 + 0.6, 1e-3);
    // One choice: no add in the decode.
    c.top_k = 1;
    EXPECT_NEAR(elapsed_us(*device, [&](Stream& s) { emu::combine(c, s); }), 3 + 2.4 + 0.8 + 0.6, 1e-3);
    // Without it, scmoe's one permute kernel; and a shape Tutel's cost cannot take is refused.
    auto plain = device_with(emu::builtin_stack("scmoe"), spec);
    EXPECT_NEAR(elapsed_us(*plain, [&](Stream& s) { emu::permute(p, s); }), 1 + 1.6, 1e-3);
    p.tokens = 0;
    EXPECT_THROW(elapsed_us(*device, [&](Stream& s) { emu::permute(p, s); }), Error);
    EXPECT_TRUE(emu::builtin_stack("paper").tutel_dispatch);
    EXPECT_FALSE(emu::builtin_stack("scmoe").tutel_dispatch);
}

TEST(EmuStack, BadStackFilesAreRefusedNamingTheField) {
    const struct {
        const char* json;
        const char* names;
    } cases[] = {
        {R"({"framwork_us": 3})", "framwork_us"},      // an unknown key (a typo)
        {R"({"framework_us": "3"})", "framework_us"},  // a wrong type
        {R"({"framework_us": -1})", "framework_us"},   // out of range
        {R"({"attention": "flash"})", "attention"},    // not fused or unfused
        {R"({"attention": 1})", "attention"},
        {R"({"attention_dropout": "yes"})", "attention_dropout"},
        {R"({"all_to_all_efficiency": 1.5})", "all_to_all_efficiency"},
        {R"({"all_to_all_efficiency": null})", "all_to_all_efficiency"},
        {R"({"small_gemm": {"64": 0.5}})", "small_gemm"},
        {R"({"small_gemm": [[64]]})", "small_gemm[0]"},
        {R"({"small_gemm": [[64, "0.5"], [128, 1]]})", "small_gemm[0][1]"},
        {R"({"small_gemm": [[64, 0.5], [32, 1]]})", "small_gemm[1]"},
        {R"({"tutel_dispatch": 1})", "tutel_dispatch"},
        {R"({"attention_bias": 1})", "attention_bias"},
        {R"({"attention_softmax_f32": "yes"})", "attention_softmax_f32"},
        {R"({"activation_f32": "yes"})", "activation_f32"},
        {R"({"expert_activation": 0})", "expert_activation"},
        {R"({"loss_f32": null})", "loss_f32"},
        {R"({"fairseq_optimizer": "yes"})", "fairseq_optimizer"},
        {R"({"attention_scale_scores": 1})", "attention_scale_scores"},
        {R"({"attention_mask_add": "yes"})", "attention_mask_add"},
        {R"({"attention_softmax_cast_in": null})", "attention_softmax_cast_in"},
        {R"({"norm_f32": 0})", "norm_f32"},
        {R"({"grad_reduce": "later"})", "grad_reduce"},
        {R"({"grad_reduce_dtype": "f16"})", "grad_reduce_dtype"},
        {R"({"sources": "a paper"})", "sources"},
        {R"({"sources": ["ok", 3]})", "sources[1]"},
        {R"({"name": 7})", "name"},
        {R"({"base": "pytorch"})", "field 'base'"},
        {R"({"base": 2})", "field 'base'"},
    };
    for (const auto& c : cases) {
        const std::string error = stack_error(c.json);
        EXPECT_NE(error.find(c.names), std::string::npos) << c.json << " -> " << error;
    }
    EXPECT_NE(stack_error("[1, 2]").find("JSON object"), std::string::npos);
    EXPECT_NE(stack_error("{not json").find("not JSON"), std::string::npos);
    EXPECT_THROW(launch::load_stack("pytorch"), Error);
    EXPECT_EQ(launch::load_stack("PAPER").name, "paper");
}

}  // namespace
}  // namespace scmoe

