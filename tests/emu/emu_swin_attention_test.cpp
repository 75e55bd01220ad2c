// The paper-swin stack's unfused attention (scmoe/kernels/emu/stack.h: attention_bias,
// attention_softmax_f32): Swin's position bias adds its table network and one pass over the scores,
// the autocast softmax writes fp32 probabilities and a cast back feeds PV, and their backward mirrors
// them; every other kernel is the plain unfused attention's. Memory follows autograd: the fp32
// probabilities and PV's fp16 input are kept for the backward. Bytes are worked out by hand.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "emu/emu_test_util.h"
#include "launch/emu_stack.h"
#include "scmoe/kernels/emu/cost_model.h"
#include "scmoe/kernels/emu/emu_device.h"
#include "scmoe/kernels/emu/emu_ops.h"
#include "scmoe/kernels/emu/stack.h"
#include "scmoe/kernels/error.h"

namespace scmoe {
namespace {

using test::device_with;
using test::elapsed_us;

std::vector<std::string> names(const std::vector<emu::StackKernel>& kernels) {
    std::vector<std::string> out;
    for (const emu::StackKernel& k : kernels) out.push_back(k.name);
    return out;
}

std::map<std::string, OpCost> by_name(const std::vector<emu::StackKernel>& kernels) {
    std::map<std::string, OpCost> out;
    for (const emu::StackKernel& k : kernels) out[k.name] = k.cost;
    return out;
}

// test::hand_attention_shape: batch 1, 10 heads of 128, seq 1280, bf16; S = 16,384,000 scores, and
// the bias [heads, s, s] has S elements too (batch 1).
constexpr double kS = 16384000.0;

TEST(EmuSwinAttention, TheBiasAndTheFp32SoftmaxAddTheirPassesAndNothingElse) {
    const AttentionArgs a = test::hand_attention_shape();
    const emu::ScorePasses swin{.bias = true, .softmax_f32 = true};
    const std::vector<emu::StackKernel> plain = emu::unfused_attention_forward(a, {});
    const std::vector<emu::StackKernel> fwd = emu::unfused_attention_forward(a, swin);
    EXPECT_EQ(names(fwd),
              (std::vector<std::string>{"attn_q_scale", "attn_qk_bmm", "attn_cpb_fc1", "attn_cpb_relu", "attn_cpb_fc2",
                                        "attn_bias_gather", "attn_bias_permute", "attn_bias_add", "attn_softmax",
                                        "attn_probs_cast", "attn_pv_bmm", "attn_out_copy"}));
    const auto f = by_name(fwd), p = by_name(plain);
    // bias add: reads the bf16 scores and the bias, writes the scores: (2 + 2 + 2) S.
    EXPECT_DOUBLE_EQ(f.at("attn_bias_add").bytes, 6 * kS);
    // autocast softmax: reads bf16, writes fp32 (the plain one reads and writes bf16: 4 S).
    EXPECT_DOUBLE_EQ(f.at("attn_softmax").bytes, 6 * kS);
    EXPECT_DOUBLE_EQ(p.at("attn_softmax").bytes, 4 * kS);
    EXPECT_DOUBLE_EQ(f.at("attn_softmax").flops, p.at("attn_softmax").flops);
    // the cast for PV: reads fp32, writes bf16.
    EXPECT_DOUBLE_EQ(f.at("attn_probs_cast").bytes, 6 * kS);
    // The table network: for seq 1280 the window side is round(sqrt(1280)) = 36, so (2*36 - 1)^2 =
    // 5041 relative coordinates through fc1 [5041, 2] x [2, 512] and fc2 [5041, 512] x [512, 10].
    EXPECT_DOUBLE_EQ(f.at("attn_cpb_fc1").flops, 2.0 * 5041 * 512 * 2);
    EXPECT_DOUBLE_EQ(f.at("attn_cpb_fc2").flops, 2.0 * 5041 * 10 * 512);
    for (const char* same : {"attn_q_scale", "attn_qk_bmm", "attn_pv_bmm", "attn_out_copy"}) {
        EXPECT_DOUBLE_EQ(f.at(same).bytes, p.at(same).bytes) << same;
        EXPECT_DOUBLE_EQ(f.at(same).flops, p.at(same).flops) << same;
    }

    AttentionBackwardArgs b;
    b.batch = a.batch, b.seq = a.seq, b.heads = a.heads, b.head_dim = a.head_dim, b.dtype = a.dtype;
    const std::vector<emu::StackKernel> bwd = emu::unfused_attention_backward(b, swin);
    EXPECT_EQ(names(bwd),
              (std::vector<std::string>{
                  "attn_out_copy_backward", "attn_pv_bmm_grad_p", "attn_pv_bmm_grad_v", "attn_probs_cast_backward",
                  "attn_softmax_backward", "attn_bias_reduce", "attn_bias_permute_backward", "attn_bias_gather_zero",
                  "attn_bias_gather_backward", "attn_cpb_fc2_grad_input", "attn_cpb_fc2_grad_weight",
                  "attn_cpb_relu_backward", "attn_cpb_fc1_grad_weight", "attn_qk_bmm_grad_q", "attn_qk_bmm_grad_k",
                  "attn_q_scale_backward"}));
    const auto g = by_name(bwd), pg = by_name(emu::unfused_attention_backward(b, {}));
    EXPECT_DOUBLE_EQ(g.at("attn_probs_cast_backward").bytes, 6 * kS);  // bf16 dP in, fp32 out
    EXPECT_DOUBLE_EQ(g.at("attn_softmax_backward").bytes, 10 * kS);    // fp32 dP and P in, bf16 dS out
    EXPECT_DOUBLE_EQ(pg.at("attn_softmax_backward").bytes, 6 * kS);
    EXPECT_DOUBLE_EQ(g.at("attn_bias_reduce").bytes, 4 * kS);  // dS in, the bias gradient out
    for (const char* same : {"attn_pv_bmm_grad_p", "attn_pv_bmm_grad_v", "attn_qk_bmm_grad_q", "attn_qk_bmm_grad_k"})
        EXPECT_DOUBLE_EQ(g.at(same).bytes, pg.at(same).bytes) << same;
}

// On the device under the paper-swin stack, a training forward takes exactly the plain unfused
// forward's time plus its added kernels (each after round_spec's 1 us gap), and an inference forward
// the same: Swin's attention has no dropout to drop.
TEST(EmuSwinAttention, TheStacksForwardIsThePlainOnePlusItsPasses) {
    emu::GpuSpec spec = test::round_spec();
    spec.launch_us = 0;
    emu::Stack swin = emu::builtin_stack("paper-swin");
    swin.framework_us = 0;
    emu::Stack plain = swin;
    plain.attention_bias = plain.attention_softmax_f32 = false;
    auto swin_device = device_with(swin, spec);
    auto plain_device = device_with(plain, spec);
    test::HandAttention hs(*swin_device), hp(*plain_device);
    double added = 0;
    const auto f = emu::unfused_attention_forward(hs.fwd, {.bias = true, .softmax_f32 = true});
    for (const emu::StackKernel& k : f)
        if (std::string(k.name).find("cpb") != std::string::npos ||
            std::string(k.name).find("bias") != std::string::npos || std::string(k.name) == "attn_probs_cast")
            added += 1.0 + emu::model_kernel(k.cost, spec).work_us;
    // The softmax writes 2 S bytes more: 32.768 us at 1e6 B/us.
    added += 2 * kS / 1e6;
    const double train_plain = elapsed_us(*plain_device, [&](Stream& s) { emu::attention_forward(hp.fwd, s); });
    const double train_swin = elapsed_us(*swin_device, [&](Stream& s) { emu::attention_forward(hs.fwd, s); });
    EXPECT_NEAR(train_swin - train_plain, added, 1e-6 * train_swin);
    EXPECT_GT(added, 3 * 98.0);  // at least the three 6 S passes
    hs.fwd.lse = nullptr;
    EXPECT_NEAR(elapsed_us(*swin_device, [&](Stream& s) { emu::attention_forward(hs.fwd, s); }), train_swin,
                1e-6 * train_swin);
}

// What autograd keeps: batch 1, 2 heads, seq 64, bf16: a bf16 score tensor Se = 16,384 B, the fp32
// probabilities 2 Se. Training forward: scores, biased scores (the first freed), the fp32 probabilities
// (kept), the bf16 cast PV reads (kept): 3 Se kept, peak 3 Se. Backward: dP (Se), its fp32 cast (2 Se)
// beside the kept 3 Se is the peak, 6 Se; everything freed after. Inference keeps nothing.
TEST(EmuSwinAttention, TheFp32ProbabilitiesAndPvsCastAreKeptForTheBackward) {
    const std::uint64_t Se = 16384;
    auto device = device_with(emu::builtin_stack("paper-swin"));
    emu::EmuDevice& emu_device = emu::as_emu(*device);
    test::SmallAttention attention(*device);
    AttentionArgs& a = attention.fwd;
    const AttentionBackwardArgs& b = attention.bwd;
    auto stream = device->create_stream();
    const std::uint64_t base = emu_device.memory().in_use;
    emu::attention_forward(a, *stream);
    EXPECT_EQ(emu_device.memory().in_use - base, 3 * Se);
    EXPECT_EQ(emu_device.memory().peak - base, 3 * Se);
    emu::attention_backward(b, *stream);
    EXPECT_EQ(emu_device.memory().in_use, base);
    EXPECT_EQ(emu_device.memory().peak - base, 6 * Se);
    a.lse = nullptr;
    emu::attention_forward(a, *stream);
    EXPECT_EQ(emu_device.memory().in_use, base);
    stream->synchronize();
}

// The built-in stack is the paper stack with Swin's training loop in place of fairseq's: its
// attention (bias, fp32 softmax, no dropout) and PyTorch DDP's overlapped fp32 gradient sums; a stack
// file takes the two new fields (EmuStack.BadStackFilesAreRefusedNamingTheField: strictly).
TEST(EmuSwinAttention, TheBuiltInStackAndStackFiles) {
    const emu::Stack& swin = emu::builtin_stack("paper-swin");
    const emu::Stack& paper = emu::builtin_stack("paper");
    EXPECT_EQ(swin.attention, emu::AttentionImpl::kUnfused);
    EXPECT_FALSE(swin.attention_dropout);
    EXPECT_TRUE(swin.attention_bias);
    EXPECT_TRUE(swin.attention_softmax_f32);
    EXPECT_FALSE(paper.attention_bias);
    EXPECT_FALSE(paper.attention_softmax_f32);
    EXPECT_EQ(swin.grad_reduce, emu::GradReduce::kOverlapped);
    EXPECT_EQ(swin.grad_reduce_dtype, DType::kF32);
    EXPECT_EQ(swin.framework_us, paper.framework_us);
    EXPECT_EQ(swin.tutel_dispatch, paper.tutel_dispatch);
    EXPECT_NE(emu::describe(swin).find("position bias"), std::string::npos);
    EXPECT_NE(emu::describe(swin).find("fp32 softmax"), std::string::npos);
    EXPECT_EQ(launch::load_stack("Paper-Swin").name, "paper-swin");

    const std::string dir = ::testing::TempDir();
    const std::string ok = dir + "/swin_like_stack.json";
    std::ofstream(ok) << R"({"base": "paper", "attention_bias": true, "attention_softmax_f32": true})";
    const emu::Stack s = launch::load_stack(ok);
    EXPECT_TRUE(s.attention_bias);
    EXPECT_TRUE(s.attention_softmax_f32);
    EXPECT_TRUE(s.attention_dropout);  // the base's
}

}  // namespace
}  // namespace scmoe
