// The kernels a framework runs around scmoe's ops, as lists of costed kernels in issue order: the
// unfused attention (PyTorch 1.x's, with the score passes a stack selects), Tutel's encode/decode,
// fairseq's fp32 GELU and loss, LLaMA's reference RMSNorm and fairseq's FP16Optimizer step. Which ones
// run is the stack's choice (stack.h, emu_ops.cpp); stack_kernels.cpp derives each list from the code
// it quotes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "scmoe/kernels/attention.h"
#include "scmoe/kernels/dtype.h"
#include "scmoe/kernels/op_cost.h"

namespace scmoe::emu {

// What an unfused attention runs over its [b*h, s, s] scores besides the two batched GEMMs and the
// softmax: the stack's passes (dropout only in a training forward and its backward).
struct ScorePasses {
    bool dropout = false;          // a dropout pass and its 1-byte mask
    bool bias = false;             // Stack::attention_bias
    bool softmax_f32 = false;      // Stack::attention_softmax_f32
    bool scale_scores = false;     // Stack::attention_scale_scores
    bool mask_add = false;         // Stack::attention_mask_add (causal attention only)
    bool softmax_cast_in = false;  // Stack::attention_softmax_cast_in (with softmax_f32)
};

// The score-sized tensors of the unfused attention, bytes: one [b*h, s, s] tensor in the op's dtype
// (scores, their gradients, the probabilities PV reads), the probabilities the softmax writes (in the
// op's dtype, or fp32 with softmax_f32) and the dropout's mask (1 byte per score: PyTorch's fused
// dropout keeps a bool mask). What autograd keeps from a training forward to its backward: the
// softmax's output (its backward reads it) and PV's input when it is another tensor (dropout's
// output, or the fp16 cast of the fp32 probabilities), with dropout also the mask. Transient, in host
// order: the scores (and each pass's new scores before the softmax: scaled, masked, biased, cast to
// fp32) until the softmax has run; with softmax_f32 and dropout the fp32 dropped probabilities until
// their cast; in the backward dP, the dP of each pass before the softmax's, and dS (and the gradient
// of each pass before it), each freed once the next exists (emu_ops.cpp). Not counted: the scaled q that
// baddbmm saves (b*s*h*d elements, d/s of the scores), and the bias [h, s, s] (1/b of the scores).
struct UnfusedAttentionMemory {
    std::size_t scores = 0, probs = 0, mask = 0;
};
UnfusedAttentionMemory unfused_attention_memory(std::int64_t batch, std::int64_t heads, std::int64_t seq,
                                                DType dtype, bool softmax_f32 = false);
// The slots of EmuDevice::hold the unfused attention keeps its saved tensors in (kSavedDropped: PV's
// saved input when it is not the softmax's output).
inline constexpr int kSavedProbs = 0, kSavedMask = 1, kSavedDropped = 2;

// One kernel of an unfused attention.
struct StackKernel {
    const char* name;
    OpCost cost;
};
// The kernels of the unfused attention forward and backward, in issue order (stack_kernels.cpp gives the
// formulas).
std::vector<StackKernel> unfused_attention_forward(const AttentionArgs& args, const ScorePasses& passes);
std::vector<StackKernel> unfused_attention_backward(const AttentionBackwardArgs& args, const ScorePasses& passes);

// The shape of one MoE layer's dispatch or combine: `tokens` rows of `hidden` in `dtype` on the token
// side, `rows` capacity slots (experts x capacity) on the expert side, `top_k` choices per token.
struct DispatchShape {
    std::int64_t tokens = 0, rows = 0, hidden = 0;
    int top_k = 1;
    DType dtype = DType::kBF16;
};
// Tutel's dispatch (Stack::tutel_dispatch; stack_kernels.cpp gives the sources and formulas): the kernels of
// fast_encode (in place of permute), fast_decode (combine) and their autograd backwards
// (combine_backward, permute_backward), in issue order.
std::vector<StackKernel> tutel_encode_forward(const DispatchShape& shape);
std::vector<StackKernel> tutel_decode_forward(const DispatchShape& shape);
std::vector<StackKernel> tutel_decode_backward(const DispatchShape& shape);
std::vector<StackKernel> tutel_encode_backward(const DispatchShape& shape);


// fairseq's fp32 GELU (Stack::activation_f32) and LM loss (Stack::loss_f32) as their kernels, in issue
// order (stack_kernels.cpp gives the formulas).
std::vector<StackKernel> fp32_gelu_forward(std::int64_t rows, std::int64_t ffn, DType dtype);
std::vector<StackKernel> fp32_gelu_backward(std::int64_t rows, std::int64_t ffn, DType dtype);
std::vector<StackKernel> fp32_loss(std::int64_t tokens, std::int64_t vocab, DType dtype, bool backward);

// LLaMA's reference RMSNorm (Stack::norm_f32) over tokens x hidden of dtype: its eager forward passes
// and their autograd backward, in issue order (stack_kernels.cpp gives the sources and formulas).
std::vector<StackKernel> fp32_rmsnorm_forward(std::int64_t tokens, std::int64_t hidden, DType dtype);
std::vector<StackKernel> fp32_rmsnorm_backward(std::int64_t tokens, std::int64_t hidden, DType dtype, bool accumulate,
                                               bool grad_weight);

// fairseq's optimizer step (Stack::fairseq_optimizer) over n parameters whose model copy is of
// param_dtype, as whole-buffer passes in issue order (stack_kernels.cpp gives the sources and formulas); the
// gradient norm is not among them (the trainer's own sum of squares stands for fairseq's).
std::vector<StackKernel> fairseq_adam_step(std::int64_t n, DType param_dtype);

}  // namespace scmoe::emu
