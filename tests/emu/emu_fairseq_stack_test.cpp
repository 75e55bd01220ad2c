// The paper stack's model code (scmoe/kernels/emu/stack.h: activation_f32, expert_activation,
// loss_f32): fairseq's GELU runs in fp32 between two casts in a dense FFN, Tutel's fairseq experts run
// no activation (a routed GELU launches nothing, the shared expert's and SwiGLU's still run), and the
// LM loss is fairseq's fp32 log_softmax and nll_loss. Times on test::round_spec() (1e6 B/us, a 1 us gap
// before each kernel, no launch cost here), worked out by hand.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "emu/emu_test_util.h"
#include "launch/emu_stack.h"
#include "scmoe/kernels/activation.h"
#include "scmoe/kernels/adamw.h"
#include "scmoe/kernels/cross_entropy.h"
#include "scmoe/kernels/emu/emu_device.h"
#include "scmoe/kernels/emu/emu_ops.h"
#include "scmoe/kernels/emu/stack.h"
#include "scmoe/kernels/error.h"
#include "scmoe/moe/moe_layer.h"
#include "scmoe/moe/params.h"

namespace scmoe {
namespace {

using test::device_with;
using test::elapsed_us;
using test::round_spec_without_launch;

emu::Stack with(bool activation_f32, bool expert_activation, bool loss_f32) {
    emu::Stack s;
    s.name = "fairseq-test";
    s.activation_f32 = activation_f32;
    s.expert_activation = expert_activation;
    s.loss_f32 = loss_f32;
    return s;
}

// 1000 rows of a 1000-wide GELU, bf16: n = 1e6 elements.
//   scmoe's kernel: reads and writes 2 B each: 4e6 B -> 4 us (+ 1 us gap) = 5
//   fairseq's: cast in (2 + 4) 6 us, fp32 GELU (4 + 4) 8 us, cast out (4 + 2) 6 us; 3 gaps -> 23
//   backward: scmoe's reads h and the gradient, writes dh: 6 us + 1 = 7; fairseq's cast 6, fp32 GELU
//   backward (4 + 4 + 4) 12, cast 6; 3 gaps -> 27
TEST(EmuFairseqStack, ADenseGeluRunsInFp32BetweenTwoCasts) {
    ActivationArgs a{Activation::kGeLU, 1000, 1000, DType::kBF16};
    ActivationBackwardArgs b{Activation::kGeLU, 1000, 1000, DType::kBF16};
    auto plain = device_with(with(false, true, false), round_spec_without_launch());
    auto fairseq = device_with(with(true, true, false), round_spec_without_launch());
    EXPECT_NEAR(elapsed_us(*plain, [&](Stream& s) { emu::activation_forward(a, s); }), 5.0, 1e-6);
    EXPECT_NEAR(elapsed_us(*fairseq, [&](Stream& s) { emu::activation_forward(a, s); }), 23.0, 1e-6);
    EXPECT_NEAR(elapsed_us(*plain, [&](Stream& s) { emu::activation_backward(b, s); }), 7.0, 1e-6);
    EXPECT_NEAR(elapsed_us(*fairseq, [&](Stream& s) { emu::activation_backward(b, s); }), 27.0, 1e-6);
    // SwiGLU is not fairseq's gelu: unchanged (reads 2000 wide, writes 1000: 6 us + 1).
    a.activation = b.activation = Activation::kSwiGLU;
    EXPECT_NEAR(elapsed_us(*fairseq, [&](Stream& s) { emu::activation_forward(a, s); }), 7.0, 1e-6);
    // A routed expert's GELU never upcasts (Tutel's experts are not fairseq's FFN).
    a.activation = Activation::kGeLU;
    a.routed_expert = true;
    EXPECT_NEAR(elapsed_us(*fairseq, [&](Stream& s) { emu::activation_forward(a, s); }), 5.0, 1e-6);
}

// expert_activation false: a routed expert's GELU launches nothing, forward or backward; a routed
// SwiGLU and a non-routed GELU (the shared expert's, a dense FFN's) still run.
TEST(EmuFairseqStack, TutelsFairseqExpertsRunNoActivation) {
    auto device = device_with(with(false, false, false), round_spec_without_launch());
    ActivationArgs a{Activation::kGeLU, 1000, 1000, DType::kBF16};
    ActivationBackwardArgs b{Activation::kGeLU, 1000, 1000, DType::kBF16};
    a.routed_expert = b.routed_expert = true;
    EXPECT_NEAR(elapsed_us(*device, [&](Stream& s) { emu::activation_forward(a, s); }), 0.0, 1e-9);
    EXPECT_NEAR(elapsed_us(*device, [&](Stream& s) { emu::activation_backward(b, s); }), 0.0, 1e-9);
    a.activation = Activation::kSwiGLU;
    EXPECT_NEAR(elapsed_us(*device, [&](Stream& s) { emu::activation_forward(a, s); }), 7.0, 1e-6);
    a.activation = Activation::kGeLU;
    a.routed_expert = false;
    EXPECT_NEAR(elapsed_us(*device, [&](Stream& s) { emu::activation_forward(a, s); }), 5.0, 1e-6);
}

// The MoE layer marks its routed experts' activation and nothing else: on one emulated GPU, its experts
// stage is shorter under expert_activation false by exactly one GELU over its rows (the capacity
// slots, E x C = 8 x ceil(2.0 x 512 x 2 / 8) = 2048 rows of ffn 256: 2048 * 256 * 4 B = 2.097152 us + 1 us
// gap), and its shared expert's stage is not shorter at all.
TEST(EmuFairseqStack, TheMoeLayerMarksOnlyItsRoutedExpertsActivation) {
    double experts_us[2], shared_us[2];
    for (const bool expert_activation : {true, false}) {
        auto device = device_with(with(false, expert_activation, false), round_spec_without_launch());
        MoeConfig c;
        c.hidden = 128, c.ffn = 256, c.num_experts = 8, c.top_k = 2;
        c.activation = Activation::kGeLU, c.dtype = DType::kBF16;
        c.dispatch = DispatchMode::kCapacity, c.capacity_factor = 2.0f;
        c.shared_expert = true;
        const std::int64_t T = 512;
        MoeLayer layer(c, *device, T);
        MoeParamStore params(*device, c, DType::kBF16, 1);
        DeviceBuffer x(*device, T * c.hidden * 2);  // the input (the emulator computes nothing)
        const Tensor in(x.data(), DType::kBF16, {T, c.hidden});
        auto stream = device->create_stream();
        auto e0 = device->create_event(), e1 = device->create_event(), e2 = device->create_event(),
             e3 = device->create_event();
        layer.route(in, params.view(), *stream);
        layer.permute(*stream);
        e0->record(*stream);
        layer.experts(params.view(), *stream);
        e1->record(*stream);
        e2->record(*stream);
        layer.shared_expert_compute(in, params.view(), *stream);
        e3->record(*stream);
        stream->synchronize();
        experts_us[expert_activation ? 0 : 1] = e1->elapsed_ms_since(*e0) * 1000.0;
        shared_us[expert_activation ? 0 : 1] = e3->elapsed_ms_since(*e2) * 1000.0;
    }
    EXPECT_NEAR(experts_us[0] - experts_us[1], 2048.0 * 256 * 4 / 1e6 + 1.0, 1e-3);
    EXPECT_NEAR(shared_us[0], shared_us[1], 1e-6);
    EXPECT_GT(shared_us[0], 0.0);
}

// fairseq's loss over 100 tokens x 10,000 vocab bf16 (tv = 1e6): log_softmax reads 2, writes 4 B: 6 us;
// nll_loss 100 fp32 gathers: 0.0008 us; 2 gaps -> 8.0008. With the backward: a zeroed fp32 [tv] 4 us,
// the scatter 0.0008, log_softmax's backward reads 8 B and writes 2 B: 10 us; 3 more gaps -> 25.0016.
// scmoe's fused kernel: reads the logits (2e6 B) and, training, writes their gradient (2e6 B), plus its
// per-token fp32 loss: 2.0008 / 4.0008 us + 1 us gap.
TEST(EmuFairseqStack, TheLossIsFairseqsFp32LogSoftmaxAndNllLoss) {
    CrossEntropyArgs a;
    a.tokens = 100, a.vocab = 10000, a.dtype = DType::kBF16;
    auto plain = device_with(with(false, true, false), round_spec_without_launch());
    auto fairseq = device_with(with(false, true, true), round_spec_without_launch());
    EXPECT_NEAR(elapsed_us(*fairseq, [&](Stream& s) { emu::cross_entropy(a, s); }), 8.0008, 1e-6);
    EXPECT_NEAR(elapsed_us(*plain, [&](Stream& s) { emu::cross_entropy(a, s); }), 3.0008, 1e-6);
    DeviceBuffer grad(*fairseq, 100 * 10000 * 2);
    a.grad_logits = grad.data();
    EXPECT_NEAR(elapsed_us(*fairseq, [&](Stream& s) { emu::cross_entropy(a, s); }), 25.0016, 1e-6);
    EXPECT_NEAR(elapsed_us(*plain, [&](Stream& s) { emu::cross_entropy(a, s); }), 5.0008, 1e-6);
}

// fairseq's optimizer step (Stack::fairseq_optimizer) over n = 1e6 parameters of a bf16 model (e = 2):
// eleven passes of 6, 8, 8, 12, 8, 12, 8, 8, 16, 6 and 4 bytes a parameter (stack_kernels.cpp lists them:
// 92 + 2e) -> 96 us, and 11 gaps -> 107 us. scmoe's fused AdamW: one kernel reading the gradient, the
// master and the two moments (16 B) and writing the three (12 B) and the bf16 parameter (2 B): 30 us and
// a gap. An fp32 model runs no FP16Optimizer: no copies and no zeroing, the multiply and Adam's seven
// passes, 80 bytes a parameter.
TEST(EmuFairseqStack, TheOptimizerStepIsFairseqsFp16OptimizerAroundItsAdam) {
    auto plain = device_with(with(false, true, false), round_spec_without_launch());
    emu::Stack fairseq_stack = with(false, true, false);
    fairseq_stack.fairseq_optimizer = true;
    auto fairseq = device_with(fairseq_stack, round_spec_without_launch());
    DeviceBuffer params(*fairseq, 2'000'000);
    AdamWArgs a;
    a.n = 1'000'000;
    a.param = params.data();
    a.param_dtype = DType::kBF16;
    EXPECT_NEAR(elapsed_us(*plain, [&](Stream& s) { emu::adamw_step(a, s); }), 31.0, 1e-6);
    EXPECT_NEAR(elapsed_us(*fairseq, [&](Stream& s) { emu::adamw_step(a, s); }), 107.0, 1e-6);

    auto bytes = [](const std::vector<emu::StackKernel>& ks) {
        double b = 0;
        for (const emu::StackKernel& k : ks) b += k.cost.bytes;
        return b;
    };
    const std::vector<emu::StackKernel> fp16 = emu::fairseq_adam_step(1000, DType::kBF16);
    ASSERT_EQ(fp16.size(), 11u);
    EXPECT_DOUBLE_EQ(bytes(fp16), 1000.0 * 96);
    EXPECT_STREQ(fp16.front().name, "fp16_grads_to_fp32");
    EXPECT_STREQ(fp16.back().name, "zero_fp32_grads");
    const std::vector<emu::StackKernel> fp32 = emu::fairseq_adam_step(1000, DType::kF32);
    ASSERT_EQ(fp32.size(), 8u);
    EXPECT_DOUBLE_EQ(bytes(fp32), 1000.0 * 80);
    EXPECT_STREQ(fp32.front().name, "unscale_grads");
    EXPECT_STREQ(fp32.back().name, "adam_param_addcdiv");
    EXPECT_THROW(emu::fairseq_adam_step(-1, DType::kBF16), Error);
}

// The built-in stacks: paper runs fairseq's model code, paper-swin Swin's (none of the three), scmoe
// its own; a stack file takes the fields (EmuStack.BadStackFilesAreRefusedNamingTheField: strictly).
TEST(EmuFairseqStack, TheBuiltInStacksAndStackFiles) {
    const emu::Stack& paper = emu::builtin_stack("paper");
    EXPECT_TRUE(paper.activation_f32);
    EXPECT_FALSE(paper.expert_activation);
    EXPECT_TRUE(paper.loss_f32);
    EXPECT_TRUE(paper.fairseq_optimizer);
    for (const char* name : {"scmoe", "paper-swin"}) {
        const emu::Stack& s = emu::builtin_stack(name);
        EXPECT_FALSE(s.activation_f32) << name;
        EXPECT_TRUE(s.expert_activation) << name;
        EXPECT_FALSE(s.loss_f32) << name;
        EXPECT_FALSE(s.fairseq_optimizer) << name;
    }
    EXPECT_NE(emu::describe(paper).find("fp32 GELU"), std::string::npos);
    EXPECT_NE(emu::describe(paper).find("fairseq FP16Optimizer"), std::string::npos);
    EXPECT_NE(emu::describe(paper).find("no expert activation"), std::string::npos);

    const std::string dir = ::testing::TempDir();
    const std::string ok = dir + "/fairseq_like_stack.json";
    std::ofstream(ok) << R"({"base": "paper", "expert_activation": true, "loss_f32": false, "fairseq_optimizer": false})";
    const emu::Stack s = launch::load_stack(ok);
    EXPECT_TRUE(s.activation_f32);  // the base's
    EXPECT_TRUE(s.expert_activation);
    EXPECT_FALSE(s.loss_f32);
    EXPECT_FALSE(s.fairseq_optimizer);
}

}  // namespace
}  // namespace scmoe
