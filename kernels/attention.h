// Causal multi-head self-attention core, forward and backward. The q/k/v and output projections
// are GEMMs done by the caller; this op is softmax(q k^T * scale, causal) v per (batch, head) with
// scale = 1 / sqrt(head_dim).
//
// Tokens are sequence-major inside a batch: token t = b * seq + i. Causal: query i attends keys
// 0..i of its own sequence only. A qkv row is [q (heads*head_dim) | k | v], head h at columns
// h*head_dim.. inside each of the three parts.
//
// CPU: f32 only (BLAS per (batch, head) on strided views). CUDA: f32 or bf16 storage with fp32
// accumulation, head_dim <= kAttentionCudaMaxHeadDim. lse is f32 on both. No atomics and no
// order-dependent reductions: results are bitwise reproducible run to run.
#pragma once

#include <cstdint>

#include "kernels/device.h"
#include "kernels/dtype.h"

namespace scmoe {

inline constexpr std::int64_t kAttentionCudaMaxHeadDim = 256;

struct AttentionArgs {
    // All sizes > 0; dtype is that of qkv and out.
    std::int64_t batch = 0, seq = 0, heads = 0, head_dim = 0;
    DType dtype = DType::kF32;
    const void* qkv = nullptr;  // [batch*seq, 3*heads*head_dim]
    void* out = nullptr;        // [batch*seq, heads*head_dim] out; head h at columns h*head_dim..
    // [batch, heads, seq] f32 out: log-sum-exp of each scaled score row, kept for backward; null:
    // not stored (inference).
    float* lse = nullptr;
};
void attention_forward(const AttentionArgs& args, Stream& stream);

struct AttentionBackwardArgs {
    std::int64_t batch = 0, seq = 0, heads = 0, head_dim = 0;
    DType dtype = DType::kF32;
    const void* qkv = nullptr;       // [batch*seq, 3*heads*head_dim] forward input
    const void* out = nullptr;       // [batch*seq, heads*head_dim] forward output
    const float* lse = nullptr;      // [batch, heads, seq] f32, from attention_forward
    const void* grad_out = nullptr;  // [batch*seq, heads*head_dim]
    void* grad_qkv = nullptr;        // [batch*seq, 3*heads*head_dim] out, overwritten; must not overlap the inputs
};
void attention_backward(const AttentionBackwardArgs& args, Stream& stream);

// Throw scmoe::Error naming the first invalid argument (non-positive size, null pointer, dtype or
// head_dim the backend does not support). The ops call them before enqueueing anything.
void check_attention_args(const AttentionArgs& args, Backend backend);
void check_attention_backward_args(const AttentionBackwardArgs& args, Backend backend);

}  // namespace scmoe
