// Stack: what runs around the emulated kernels, the software stack a prediction is for (issue 25,
// "a stack model"). The GPU spec (gpu_spec.h) says what the hardware does with a kernel; the stack
// says which kernels a framework runs and what it adds around them:
//  - attention: scmoe's fused flash kernel (one op, attention.h's op_cost), or unfused, as PyTorch
//    1.x's F.multi_head_attention_forward runs it (scores [b*h, s, s] materialised: the q scaling,
//    QK^T as a batched GEMM with the causal mask read as its C operand, softmax, dropout, PV, the
//    output transpose; and their backward), each kernel costed through the same roofline; with
//    attention_bias, an additive position bias over the scores (Swin's), with
//    attention_softmax_f32, the softmax as torch.cuda.amp runs it (fp32 out, a cast back for PV), and
//    with attention_scale_scores, attention_mask_add and attention_softmax_cast_in the passes of
//    LLaMA's reference attention (the scores divided after QK^T, the mask added in a pass of its own,
//    the scores cast to fp32 before the softmax);
//  - norm_f32: RMSNorm as LLaMA's reference code runs it, in fp32 eager passes;
//  - framework_us: host time the framework spends before each op's launch (Python, eager dispatch),
//    on top of GpuSpec::launch_us; it delays the issuing host thread (emu_device.cpp, and the
//    communicator's launches);
//  - all_to_all_efficiency: a factor on the link and NIC efficiency of the all-to-all only
//    (Topology::all_to_all_efficiency, scmoe/comm/topology.h);
//  - tutel_dispatch: Tutel's fp32 encode/decode in place of scmoe's permute and combine;
//  - activation_f32, expert_activation, loss_f32: how the model code runs a dense FFN's GELU (fairseq
//    upcasts it to fp32), whether the routed experts run an activation at all (Tutel's fairseq patch
//    passes none), and the LM loss (fairseq's log_softmax in fp32, then nll_loss);
//  - small_gemm: the achieved fraction of the GEMM ceiling versus the GEMM's size (its smallest side,
//    e.g. the tokens of an expert), a piecewise-linear curve in log2(size), flat beyond its ends;
//  - fairseq_optimizer: the optimizer step as fairseq's FP16Optimizer runs its Adam (fp32 copies of the
//    gradients and parameters beside the fp16 model, one eager pass per tensor operation) in place of
//    scmoe's fused AdamW kernel;
//  - grad_reduce, grad_reduce_dtype: how the training loop sums the data-parallel gradients, per
//    block during the backward or all after it, and in which dtype (scmoe-train and scmoe-plan take
//    them for an emulated run unless their flags say otherwise: launch/emu_stack.h).
// The kernel lists the stack's fields select are in stack_kernels.h.
// Built-in stacks (stack.cpp cites every number; docs/emu-sources.md, "Stacks", quotes them): `scmoe`
// (this runtime, the default: changes nothing), `paper` (fairseq + Tutel on PyTorch, as the ScMoE
// paper ran its language models) and `paper-swin` (Swin-Transformer's Swin-MoE + Tutel under
// torch.cuda.amp, as it ran SwinV2-MoE-S). A stack JSON (launch/emu_stack.h) gives its own.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "scmoe/kernels/emu/stack_kernels.h"
#include "scmoe/kernels/op_cost.h"

namespace scmoe::emu {

enum class AttentionImpl { kFused, kUnfused };

// The data-parallel gradient all-reduce: each block's as soon as its gradients are final, overlapped
// with the rest of the backward (scmoe; PyTorch's DistributedDataParallel), or all of it once the
// backward is done (fairseq's legacy_ddp).
enum class GradReduce { kOverlapped, kAfterBackward };

struct GemmEfficiencyPoint {
    double size = 0;      // the GEMM's smallest side (M, N or K), > 0
    double fraction = 1;  // achieved fraction of the GEMM ceiling (GpuSpec::gemm_efficiency), (0, 1]
};

struct Stack {
    std::string name = "scmoe";
    std::string description = "scmoe: fused attention, no framework time, NCCL all-to-all, no small-GEMM fall-off";
    AttentionImpl attention = AttentionImpl::kFused;
    bool attention_dropout = false;      // unfused: a dropout pass over the probabilities in training
                                         // forwards (those that keep lse for a backward) and their backward
    // unfused: an additive bias [heads, s, s] over the scores, made each forward by a small network
    // over the window's relative coordinates (Swin's continuous relative position bias: cpb_mlp, a
    // gather, a permute); one pass over the scores, and the bias gradient's reduction in the backward.
    bool attention_bias = false;
    // unfused: the softmax as torch.cuda.amp runs it: fp32 probabilities out of fp16 scores (autocast's
    // fp32 policy for softmax), cast back to fp16 for PV (autocast's fp16 policy for matmul); in the
    // backward the cast's and the softmax's, in fp32.
    bool attention_softmax_f32 = false;
    // unfused: the scores divided by sqrt(head_dim) after QK^T, a pass over the scores (and one over
    // their gradient), in place of PyTorch 1.x MHA's scaling of q (LLaMA's reference: "scores =
    // torch.matmul(xq, keys.transpose(2, 3)) / math.sqrt(self.head_dim)").
    bool attention_scale_scores = false;
    // unfused, causal: the mask added in a pass of its own ("scores = scores + mask"; its gradient
    // passes through) in place of baddbmm's C operand.
    bool attention_mask_add = false;
    // unfused, with attention_softmax_f32: the scores cast to fp32 before an fp32 softmax ("F.softmax(
    // scores.float(), dim=-1).type_as(xq)"), where autocast's softmax reads them in their dtype; its
    // backward writes fp32 and casts back.
    bool attention_softmax_cast_in = false;
    // RMSNorm as LLaMA's reference code runs it ("self._norm(x.float()).type_as(x) * self.weight",
    // "_norm: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)"): fp32 eager passes and their
    // autograd backward (fp32_rmsnorm_forward / _backward give the kernels) in place of scmoe's fused one.
    bool norm_f32 = false;
    double framework_us = 0;             // host time per op before its launch, us
    double all_to_all_efficiency = 1.0;  // factor on the all-to-all's link and NIC efficiency, (0, 1]
    std::vector<GemmEfficiencyPoint> small_gemm;  // sizes increasing, fractions non-decreasing; empty: 1
    // Tutel's fast_encode / fast_decode in place of scmoe's permute and combine (tutel_encode_forward
    // and the three below): fp32 with casts around them, a zeroed capacity buffer, one kernel per choice.
    bool tutel_dispatch = false;
    // A dense FFN's (and the shared expert's) GELU as fairseq's gelu runs it: "torch.nn.functional.
    // gelu(x.float()).type_as(x)", a cast to fp32, the GELU in fp32 and a cast back; the backward the
    // same in reverse. SwiGLU is left alone.
    bool activation_f32 = false;
    // false: the routed experts' GELU launches nothing (Tutel's fairseq patch gives its ffn experts an
    // activation_fn that is only the activation dropout, p 0 by default). SwiGLU experts (not Tutel's
    // two-matrix ffn) keep theirs.
    bool expert_activation = true;
    // The LM loss as fairseq's cross_entropy criterion runs it: log_softmax(logits, dtype=float32) (fp32
    // log-probabilities out of the fp16 logits) and nll_loss; in training nll_loss's backward (a zeroed
    // fp32 [tokens, vocab] and a scatter) and log_softmax's (fp32 in, fp16 out). scmoe's is one fused pass.
    bool loss_f32 = false;
    // The optimizer step as fairseq's FP16Optimizer (--fp16 --fp16-no-flatten-grads) runs fairseq's own
    // Adam (no apex): the fp16 gradients copied to fp32, unscaled, Adam as seven eager passes, the fp32
    // parameters copied back to fp16, the fp32 gradients zeroed (fairseq_adam_step gives the kernels).
    // false: scmoe's one fused AdamW kernel (adamw.h).
    bool fairseq_optimizer = false;
    GradReduce grad_reduce = GradReduce::kOverlapped;
    DType grad_reduce_dtype = DType::kF32;  // what the gradients travel in: kF32 or kBF16 (half the bytes)
    std::vector<std::string> sources;
};

// The built-in stacks: scmoe (the default), paper and paper-swin.
const std::vector<Stack>& builtin_stacks();
// Their names, for messages: "scmoe, paper, paper-swin".
std::string builtin_stack_names();
// A built-in stack by name; throws Error listing the names otherwise.
const Stack& builtin_stack(std::string_view name);
// Throws Error naming the first field out of range (framework_us < 0, all_to_all_efficiency not in
// (0, 1], a curve point out of range or out of order, grad_reduce_dtype neither f32 nor bf16).
void check_stack(const Stack& stack);
// One line: "paper: unfused attention (dropout), framework 3.3 us/op, all-to-all x1.00, ..."
std::string describe(const Stack& stack);

// The small-GEMM fraction at `size` (1 for an empty curve).
double small_gemm_fraction(const Stack& stack, double size);
// The fraction for a kernel's cost: the curve at its GEMM's smallest side for tensor ops that carry a
// GEMM shape (gemm_count > 0), else 1.
double small_gemm_fraction(const Stack& stack, const OpCost& cost);

// The stack's passes over the unfused attention's scores (dropout only in a training forward and its
// backward).
ScorePasses score_passes(const Stack& stack, bool training);

}  // namespace scmoe::emu
