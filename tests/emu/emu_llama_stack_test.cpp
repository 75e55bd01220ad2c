// LLaMA-2's reference model code as a stack (scmoe/kernels/emu/stack.h: attention_scale_scores,
// attention_mask_add, attention_softmax_cast_in, norm_f32; the unfused attention's K/V repeat under
// GQA; docs/emu/stack/paper-llama.json): the attention's score passes cost their formula, its saved and
// transient score tensors count against device memory, the fp32 RMSNorm runs its eager passes, and the
// stack file loads and is checked. Times on test::round_spec() (1e6 B/us, a 1 us gap before each
// kernel, no launch cost here), worked out by hand.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "emu/emu_test_util.h"
#include "launch/emu_stack.h"
#include "scmoe/kernels/emu/cost_model.h"
#include "scmoe/kernels/emu/emu_device.h"
#include "scmoe/kernels/emu/emu_ops.h"
#include "scmoe/kernels/emu/stack.h"
#include "scmoe/kernels/error.h"
#include "scmoe/kernels/rmsnorm.h"

namespace scmoe {
namespace {

using test::device_with;
using test::elapsed_us;
using test::round_spec_without_launch;

emu::Stack llama_attention() {
    emu::Stack s;
    s.name = "llama-test";
    s.attention = emu::AttentionImpl::kUnfused;
    s.attention_softmax_f32 = true;
    s.attention_softmax_cast_in = true;
    s.attention_scale_scores = true;
    s.attention_mask_add = true;
    return s;
}

// The hand-checked attention (batch 1, 10 heads of 128, seq 1280, bf16, causal; Q = 1,638,400 elements,
// S = 16,384,000 scores) as LLaMA's reference runs it, us (max(FLOPs / rate, bytes / 1e6)):
//   qk_bmm         4.194e9 FLOP -> 41.94304 (no mask read: 2(2Q) + 2S B = 39.3216 is less)
//   scores_scale   reads and writes S bf16: 4S B                                   -> 65.536
//   mask_add       4S B and the [s, s] bf16 mask (3,276,800 B)                     -> 68.8128
//   scores_cast    reads S bf16, writes S fp32: 6S B                               -> 98.304
//   softmax        reads and writes S fp32: 8S B                                   -> 131.072
//   probs_cast     6S B                                                            -> 98.304
//   pv_bmm         41.94304;  out_copy 4Q B -> 6.5536
// No q scaling and no dropout: 8 kernels, 552.46848 us of work and 8 gaps: 560.46848.
// Backward: out_copy 6.5536; dP, dV 41.94304 each; the probabilities' cast 6S -> 98.304; softmax reads
// dP and P in fp32 and writes dS in fp32: 12S -> 196.608; dS cast back 6S -> 98.304; dS / sqrt(d) 4S ->
// 65.536; dQ, dK 41.94304 each. 9 kernels: 633.07776 + 9 = 642.07776.
TEST(EmuLlamaStack, TheReferenceAttentionCostsItsScorePasses) {
    const emu::GpuSpec spec = round_spec_without_launch();
    const emu::ScorePasses passes = emu::score_passes(llama_attention(), true);
    EXPECT_FALSE(passes.dropout);
    const std::vector<emu::StackKernel> fwd = emu::unfused_attention_forward(test::hand_attention_shape(), passes);
    const char* names_fwd[] = {"attn_qk_bmm",  "attn_scores_scale", "attn_mask_add", "attn_scores_cast",
                               "attn_softmax", "attn_probs_cast",   "attn_pv_bmm",   "attn_out_copy"};
    const double expect_fwd[] = {41.94304, 65.536, 68.8128, 98.304, 131.072, 98.304, 41.94304, 6.5536};
    ASSERT_EQ(fwd.size(), 8u);
    for (std::size_t i = 0; i < fwd.size(); ++i) {
        EXPECT_STREQ(fwd[i].name, names_fwd[i]);
        EXPECT_NEAR(emu::model_kernel(fwd[i].cost, spec).work_us, expect_fwd[i], 1e-9) << fwd[i].name;
    }
    auto device = device_with(llama_attention(), spec);
    test::HandAttention h(*device);
    EXPECT_NEAR(elapsed_us(*device, [&](Stream& s) { emu::attention_forward(h.fwd, s); }), 560.46848, 1e-4);

    const std::vector<emu::StackKernel> bwd = emu::unfused_attention_backward(h.bwd, passes);
    const char* names_bwd[] = {"attn_out_copy_backward",     "attn_pv_bmm_grad_p",    "attn_pv_bmm_grad_v",
                               "attn_probs_cast_backward",   "attn_softmax_backward", "attn_scores_cast_backward",
                               "attn_scores_scale_backward", "attn_qk_bmm_grad_q",    "attn_qk_bmm_grad_k"};
    const double expect_bwd[] = {6.5536, 41.94304, 41.94304, 98.304, 196.608, 98.304, 65.536, 41.94304, 41.94304};
    ASSERT_EQ(bwd.size(), 9u);
    for (std::size_t i = 0; i < bwd.size(); ++i) {
        EXPECT_STREQ(bwd[i].name, names_bwd[i]);
        EXPECT_NEAR(emu::model_kernel(bwd[i].cost, spec).work_us, expect_bwd[i], 1e-9) << bwd[i].name;
    }
    EXPECT_NEAR(elapsed_us(*device, [&](Stream& s) { emu::attention_backward(h.bwd, s); }), 642.07776, 1e-4);

    // An fp32 model casts nothing: no scores cast and no probabilities cast, forward or backward.
    AttentionArgs f32 = test::hand_attention_shape();
    f32.dtype = DType::kF32;
    const std::vector<emu::StackKernel> f32_fwd = emu::unfused_attention_forward(f32, passes);
    ASSERT_EQ(f32_fwd.size(), 6u);
    for (const emu::StackKernel& k : f32_fwd) EXPECT_EQ(std::string(k.name).find("cast"), std::string::npos) << k.name;
    AttentionBackwardArgs f32_bwd = h.bwd;
    f32_bwd.dtype = DType::kF32;
    EXPECT_EQ(emu::unfused_attention_backward(f32_bwd, passes).size(), 7u);

    // Bidirectional: no mask to add (the pass is the causal mask's), everything else the same.
    AttentionArgs bidir = test::hand_attention_shape();
    bidir.causal = false;
    const std::vector<emu::StackKernel> no_mask = emu::unfused_attention_forward(bidir, passes);
    ASSERT_EQ(no_mask.size(), 7u);
    for (const emu::StackKernel& k : no_mask) EXPECT_STRNE(k.name, "attn_mask_add");
}

// Grouped-query attention under the unfused attention: k and v are repeated to every query head before
// the batched GEMMs (repeat_kv's copy), and the gradients summed back after. 2 K/V heads of the hand
// shape's 10: KV = 1280 * 2 * 128 = 327,680 elements; the copy reads 2 KV and writes 2Q bf16
// (1,310,720 + 6,553,600 B) -> 7.86432 us, its backward the reverse. Multi-head attention has neither.
TEST(EmuLlamaStack, GroupedQueryAttentionRepeatsKeysAndValues) {
    const emu::GpuSpec spec = round_spec_without_launch();
    const emu::ScorePasses passes = emu::score_passes(llama_attention(), true);
    AttentionArgs mha = test::hand_attention_shape();
    AttentionArgs gqa = mha;
    gqa.kv_heads = 2;
    const std::vector<emu::StackKernel> a = emu::unfused_attention_forward(mha, passes);
    const std::vector<emu::StackKernel> b = emu::unfused_attention_forward(gqa, passes);
    ASSERT_EQ(b.size(), a.size() + 1);
    EXPECT_STREQ(b.front().name, "attn_repeat_kv");
    EXPECT_NEAR(emu::model_kernel(b.front().cost, spec).work_us, 7.86432, 1e-9);
    for (std::size_t i = 0; i < a.size(); ++i) EXPECT_STREQ(b[i + 1].name, a[i].name);

    AttentionBackwardArgs mha_bwd;
    mha_bwd.batch = 1, mha_bwd.seq = 1280, mha_bwd.heads = 10, mha_bwd.head_dim = 128, mha_bwd.dtype = DType::kBF16;
    AttentionBackwardArgs gqa_bwd = mha_bwd;
    gqa_bwd.kv_heads = 2;
    const std::vector<emu::StackKernel> c = emu::unfused_attention_backward(mha_bwd, passes);
    const std::vector<emu::StackKernel> d = emu::unfused_attention_backward(gqa_bwd, passes);
    ASSERT_EQ(d.size(), c.size() + 1);
    EXPECT_STREQ(d.back().name, "attn_repeat_kv_backward");
    EXPECT_NEAR(emu::model_kernel(d.back().cost, spec).work_us, 7.86432, 1e-9);
}

// The small training attention (2 heads, seq 64: S = 8192 scores, Se = 16384 bytes of them in bf16).
// Forward: QK^T (Se), scaled (Se, the first freed), masked (Se), cast to fp32 (2Se) while the masked
// ones live: 3Se; then the fp32 probabilities (2Se, kept) beside the fp32 scores: 4Se, the peak; then
// their bf16 cast for PV (Se, kept). Saved: 3Se. Backward: dP (Se), its fp32 cast (2Se) while dP and
// the saved 3Se live: 6Se (the model frees PV's saved input after the cast, autograd before it); then
// dP and PV's saved input go; the softmax's fp32 dS (2Se) beside the fp32 dP and the saved fp32
// probabilities: 6Se again, the peak either way; then the probabilities go, dS cast back (Se), dS
// scaled (Se); all freed.
TEST(EmuLlamaStack, ItsScoreTensorsCountAgainstDeviceMemory) {
    const std::uint64_t Se = 16384;
    auto device = device_with(llama_attention());
    emu::EmuDevice& emu_device = emu::as_emu(*device);
    test::SmallAttention attention(*device);
    auto stream = device->create_stream();
    const std::uint64_t base = emu_device.memory().in_use;
    emu::attention_forward(attention.fwd, *stream);
    EXPECT_EQ(emu_device.memory().in_use - base, 3 * Se);
    EXPECT_EQ(emu_device.memory().peak - base, 4 * Se);
    emu::attention_backward(attention.bwd, *stream);
    EXPECT_EQ(emu_device.memory().in_use, base);
    EXPECT_EQ(emu_device.memory().peak - base, 6 * Se);
    stream->synchronize();
}

// LLaMA's reference RMSNorm over n = T*H elements (T = 1000 tokens, H = 1000, bf16): forward 8 kernels,
// 36 bytes an element (28 + 4e) plus 24 T and 2 H bytes (the per-token statistics, the weight); backward
// with the weight's gradient 16 kernels, 92 bytes an element (76 + 8e) plus 40 T and 4 H, and one more
// kernel of 6 bytes an element accumulating into the residual's gradient; without the weight's gradient
// two kernels fewer. An fp32 model casts nothing: 6 and 14 kernels. Every kernel here is memory-bound on
// round_spec (1e6 B/us against at most 3 FLOPs an element at 1e7 FLOP/us), so on the device each takes
// its bytes / 1e6 us after a 1 us gap. scmoe's fused forward reads n + H and writes n bf16 elements
// (4n + 2H bytes) and writes 4T bytes of rstd: 4.006 us and a gap.
TEST(EmuLlamaStack, TheFp32RmsNormRunsItsEagerPasses) {
    const std::int64_t T = 1000, H = 1000, n = T * H;
    auto bytes = [](const std::vector<emu::StackKernel>& ks) {
        double b = 0;
        for (const emu::StackKernel& k : ks) b += k.cost.bytes;
        return b;
    };
    const double fwd_bytes = 36.0 * n + 24.0 * T + 2.0 * H, bwd_bytes = 92.0 * n + 40.0 * T + 4.0 * H;
    const auto fwd = emu::fp32_rmsnorm_forward(T, H, DType::kBF16);
    EXPECT_EQ(fwd.size(), 8u);
    EXPECT_DOUBLE_EQ(bytes(fwd), fwd_bytes);
    const auto bwd = emu::fp32_rmsnorm_backward(T, H, DType::kBF16, false, true);
    EXPECT_EQ(bwd.size(), 16u);
    EXPECT_DOUBLE_EQ(bytes(bwd), bwd_bytes);
    const auto bwd_acc = emu::fp32_rmsnorm_backward(T, H, DType::kBF16, true, true);
    EXPECT_EQ(bwd_acc.size(), 17u);
    EXPECT_DOUBLE_EQ(bytes(bwd_acc), bwd_bytes + 6.0 * n);
    EXPECT_STREQ(bwd_acc.back().name, "rmsnorm_grad_accumulate");
    EXPECT_EQ(emu::fp32_rmsnorm_backward(T, H, DType::kBF16, false, false).size(), 14u);
    EXPECT_EQ(emu::fp32_rmsnorm_forward(T, H, DType::kF32).size(), 6u);
    EXPECT_EQ(emu::fp32_rmsnorm_backward(T, H, DType::kF32, false, true).size(), 14u);

    emu::Stack f32 = emu::builtin_stack("scmoe");
    f32.norm_f32 = true;
    auto device = device_with(f32, round_spec_without_launch());
    auto fused = device_with(emu::builtin_stack("scmoe"), round_spec_without_launch());
    DeviceBuffer x(*device, 2 * n), y(*device, 2 * n), w(*device, 2 * H), g(*device, 2 * n), gx(*device, 2 * n);
    std::vector<float> rstd(T), gw(H);
    RmsNormArgs a;
    a.tokens = T, a.hidden = H, a.dtype = DType::kBF16, a.x = x.data(), a.weight = w.data(), a.y = y.data();
    a.rstd = rstd.data();
    EXPECT_NEAR(elapsed_us(*device, [&](Stream& s) { emu::rmsnorm_forward(a, s); }), 8 + fwd_bytes / 1e6, 1e-4);
    EXPECT_NEAR(elapsed_us(*fused, [&](Stream& s) { emu::rmsnorm_forward(a, s); }), 5.006, 1e-4);
    RmsNormBackwardArgs b;
    b.tokens = T, b.hidden = H, b.dtype = DType::kBF16, b.x = x.data(), b.weight = w.data(), b.rstd = rstd.data();
    b.grad_y = g.data(), b.grad_x = gx.data(), b.accumulate = true, b.grad_weight = gw.data();
    EXPECT_NEAR(elapsed_us(*device, [&](Stream& s) { emu::rmsnorm_backward(b, s); }), 17 + (bwd_bytes + 6.0 * n) / 1e6,
                1e-4);
}

// docs/emu/stack/paper-llama.json: the paper stack with the reference model's attention and norm; a
// cast before the softmax needs an fp32 softmax (check_stack, and the stack reader names the field).
TEST(EmuLlamaStack, TheStackFileAndItsChecks) {
    const emu::Stack s = launch::load_stack(std::string(SCMOE_SOURCE_DIR) + "/docs/emu/stack/paper-llama.json");
    EXPECT_EQ(s.name, "paper-llama");
    EXPECT_FALSE(s.attention_dropout);
    EXPECT_TRUE(s.attention_scale_scores && s.attention_mask_add && s.attention_softmax_f32 &&
                s.attention_softmax_cast_in && s.norm_f32);
    EXPECT_TRUE(s.fairseq_optimizer && s.tutel_dispatch);  // paper's, its base
    const std::string d = emu::describe(s);
    for (const char* part : {"fp32 softmax of fp32 scores", "scores scaled", "mask added", "fp32 RMSNorm"})
        EXPECT_NE(d.find(part), std::string::npos) << part << " in " << d;
    for (const char* name : {"scmoe", "paper", "paper-swin"}) {
        const emu::Stack& b = emu::builtin_stack(name);
        EXPECT_FALSE(b.attention_scale_scores || b.attention_mask_add || b.attention_softmax_cast_in || b.norm_f32)
            << name;
    }
    emu::Stack bad = llama_attention();
    bad.attention_softmax_f32 = false;
    EXPECT_THROW(emu::check_stack(bad), Error);
    const std::string file = ::testing::TempDir() + "/cast_without_f32.json";
    std::ofstream(file) << R"({"base": "paper", "attention_softmax_cast_in": true})";
    try {
        launch::load_stack(file);
        ADD_FAILURE() << "a cast before an fp16 softmax was accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("attention_softmax_cast_in"), std::string::npos) << e.what();
    }
}

}  // namespace
}  // namespace scmoe
