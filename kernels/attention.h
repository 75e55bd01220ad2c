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
#include "kernels/op_cost.h"

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

// Causal attention: QK^T and PV over the lower triangle, 2 * (2 * b*h*s*s*d) / 2 FLOPs (the count
// FlashAttention's papers use for causal masks); reads qkv once, writes out and lse (a fused kernel).
inline OpCost op_cost(const AttentionArgs& a) {
    const double bhs = static_cast<double>(a.batch * a.heads * a.seq);
    OpCost c = elementwise_cost(a.batch * a.seq * 3 * a.heads * a.head_dim, a.batch * a.seq * a.heads * a.head_dim,
                                a.dtype, 0.0) +
               elementwise_cost(0, a.lse ? a.batch * a.heads * a.seq : 0, DType::kF32, 0.0);
    c.unit = OpUnit::kTensor;
    c.flops = 2.0 * bhs * static_cast<double>(a.seq) * static_cast<double>(a.head_dim);
    c.gemm_m = a.seq, c.gemm_n = a.seq, c.gemm_k = a.head_dim, c.gemm_count = a.batch * a.heads;
    c.threads = static_cast<double>(a.batch * a.heads) * gemm_threads(a.seq, a.head_dim);
    return c;
}

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

// 2.5x the forward's FLOPs (recompute of P, then dV, dP, dQ, dK: the FlashAttention-2 count).
inline OpCost op_cost(const AttentionBackwardArgs& a) {
    const std::int64_t rows = a.batch * a.seq, width = a.heads * a.head_dim;
    OpCost c = elementwise_cost(rows * (3 * width + 2 * width), rows * 3 * width, a.dtype, 0.0) +
               elementwise_cost(a.batch * a.heads * a.seq, 0, DType::kF32, 0.0);
    c.unit = OpUnit::kTensor;
    c.flops = 2.5 * 2.0 * static_cast<double>(a.batch * a.heads * a.seq) * static_cast<double>(a.seq) *
              static_cast<double>(a.head_dim);
    c.gemm_m = a.seq, c.gemm_n = a.seq, c.gemm_k = a.head_dim, c.gemm_count = a.batch * a.heads;
    c.threads = static_cast<double>(a.batch * a.heads) * gemm_threads(a.seq, a.head_dim);
    return c;
}

// Throw scmoe::Error naming the first invalid argument (non-positive size, null pointer, dtype or
// head_dim the backend does not support). The ops call them before enqueueing anything.
void check_attention_args(const AttentionArgs& args, Backend backend);
void check_attention_backward_args(const AttentionBackwardArgs& args, Backend backend);

}  // namespace scmoe
