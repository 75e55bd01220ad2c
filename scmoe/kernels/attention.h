// Multi-head self-attention core, forward and backward. The q/k/v and output projections are GEMMs
// done by the caller; this op is softmax(q k^T * scale, causal) v per (batch, head) with
// scale = 1 / sqrt(head_dim), causal by default.
//
// Tokens are sequence-major inside a batch: token t = b * seq + i. Causal (causal = true, the
// default, decoders): query i attends keys 0..i of its own sequence only. Bidirectional
// (causal = false, encoders, SwinV2's window attention): query i attends every key 0..seq-1 of its
// own sequence (no mask). The decoding op (attention_decode.h) is causal by construction. A qkv row
// is [q (heads*head_dim) | k (kv_heads*head_dim) | v (kv_heads*head_dim)], head h at columns
// h*head_dim.. inside each of the three parts.
//
// Grouped-query attention (GQA; Ainslie et al. 2023, arXiv 2305.13245): kv_heads divides heads and
// query head h reads K/V head h / (heads / kv_heads), so each K/V head serves a group of consecutive
// query heads. kv_heads = heads (or 0, the default) is multi-head attention; kv_heads = 1 is
// multi-query attention. Backward sums a K/V head's gradient over its group.
//
// CPU: f32 only (BLAS per (batch, head) on strided views). CUDA: f32 or bf16 storage with fp32
// accumulation, head_dim <= kAttentionCudaMaxHeadDim. lse is f32 on both. Results are bitwise
// reproducible run to run (the own kernels have no atomics; cuDNN's backward runs its deterministic
// algorithm from sm_90 on, unless SCMOE_ATTENTION_DETERMINISTIC=0; below sm_90 only when it is 1).
//
// Providers on CUDA (AttentionProvider below): scmoe's own kernel (the reference, every dtype and
// head_dim above) and cuDNN's fused flash attention (bf16 only; built when the cuDNN frontend is
// found, SCMOE_WITH_CUDNN). Both write the same lse, so either backward consumes either forward's lse.
#pragma once

#include <cstdint>

#include "scmoe/kernels/device.h"
#include "scmoe/kernels/dtype.h"
#include "scmoe/kernels/op_cost.h"

namespace scmoe {

inline constexpr std::int64_t kAttentionCudaMaxHeadDim = 256;

struct AttentionArgs {
    // All sizes > 0; dtype is that of qkv and out.
    std::int64_t batch = 0, seq = 0, heads = 0, head_dim = 0;
    DType dtype = DType::kF32;
    const void* qkv = nullptr;  // [batch*seq, (heads + 2*kv_heads)*head_dim]
    void* out = nullptr;        // [batch*seq, heads*head_dim] out; head h at columns h*head_dim..
    // [batch, heads, seq] f32 out: log-sum-exp of each scaled score row, kept for backward; null:
    // not stored (inference). lse_bhi = ln(sum_{j <= i} exp(scale * q_i . k_j)), natural log, the
    // scale applied; cuDNN's softmax "Stats" output has the same definition and layout.
    float* lse = nullptr;
    std::int64_t kv_heads = 0;  // K/V heads (GQA); 0 = heads. heads % kv_heads == 0
    // True: query i sees keys 0..i (lse sums over j <= i); false: every key of its sequence (lse
    // sums over all j). The default keeps the causal op every caller had, bit for bit.
    bool causal = true;
};

// The K/V head count a call runs with: kv_heads, or heads where it is 0.
inline std::int64_t attention_kv_heads(std::int64_t heads, std::int64_t kv_heads) {
    return kv_heads > 0 ? kv_heads : heads;
}
// Elements of one qkv row: heads + 2 * kv_heads slices of head_dim.
inline std::int64_t attention_qkv_width(std::int64_t heads, std::int64_t kv_heads, std::int64_t head_dim) {
    return (heads + 2 * attention_kv_heads(heads, kv_heads)) * head_dim;
}

// Which implementation runs attention on a CUDA stream (the CPU and emulated backends have one).
//   kAuto:  the SCMOE_ATTENTION_PROVIDER environment variable when set (auto, own or cudnn; default
//           unset = auto). Auto picks cuDNN for bf16 when scmoe is built with it, head_dim is a
//           multiple of 8 (<= 256) and the pointers are 16-byte aligned; otherwise the own kernel.
//           When cuDNN itself turns the shape down on the device (its support check), auto runs the
//           own kernel and says so once per shape on stderr.
//   kOwn:   scmoe's own kernel (every dtype and head_dim above; the reference).
//   kCudnn: cuDNN only; throws scmoe::Error with the reason (not built, not bf16, head_dim, alignment,
//           or cuDNN's own message) where it cannot run.
enum class AttentionProvider { kAuto, kOwn, kCudnn };
const char* attention_provider_name(AttentionProvider provider);  // "auto", "own", "cudnn"
// "auto", "own" or "cudnn"; throws scmoe::Error naming the accepted values otherwise.
AttentionProvider parse_attention_provider(const char* name);
// Whether this build has the cuDNN provider (CUDA backend built with the cuDNN frontend).
bool attention_cudnn_built();

// Which implementation ran the CUDA attention calls of this process (every device and stream), for
// tests and diagnostics: auto may fall back to the own kernel where cuDNN turns a shape down.
struct AttentionStats {
    long long cudnn_forward = 0, cudnn_backward = 0;  // calls cuDNN's fused kernels ran
    long long cudnn_deterministic_backward = 0;       // of cudnn_backward: its deterministic algorithm
    long long own_forward = 0, own_backward = 0;      // calls scmoe's own kernel ran
    std::int64_t cudnn_max_workspace_bytes = 0;       // the largest workspace a cuDNN graph asked for
};
AttentionStats attention_stats();

void attention_forward(const AttentionArgs& args, Stream& stream,
                       AttentionProvider provider = AttentionProvider::kAuto);

// Causal attention: QK^T and PV over the lower triangle, 2 * (2 * b*h*s*s*d) / 2 FLOPs (the count
// FlashAttention's papers use for causal masks); non-causal: the full square, 2 * (2 * b*h*s*s*d)
// (twice the causal count). Reads qkv once, writes out and lse (a fused kernel).
// GQA: the FLOPs are per query head (unchanged); the bytes read shrink with kv_heads (the qkv row).
inline OpCost op_cost(const AttentionArgs& a) {
    const double bhs = static_cast<double>(a.batch * a.heads * a.seq);
    OpCost c = elementwise_cost(a.batch * a.seq * attention_qkv_width(a.heads, a.kv_heads, a.head_dim),
                                a.batch * a.seq * a.heads * a.head_dim, a.dtype, 0.0) +
               elementwise_cost(0, a.lse ? a.batch * a.heads * a.seq : 0, DType::kF32, 0.0);
    c.unit = OpUnit::kTensor;
    c.flops = (a.causal ? 2.0 : 4.0) * bhs * static_cast<double>(a.seq) * static_cast<double>(a.head_dim);
    c.gemm_m = a.seq, c.gemm_n = a.seq, c.gemm_k = a.head_dim, c.gemm_count = a.batch * a.heads;
    c.threads = static_cast<double>(a.batch * a.heads) * gemm_threads(a.seq, a.head_dim);
    return c;
}

struct AttentionBackwardArgs {
    std::int64_t batch = 0, seq = 0, heads = 0, head_dim = 0;
    DType dtype = DType::kF32;
    const void* qkv = nullptr;       // [batch*seq, (heads + 2*kv_heads)*head_dim] forward input
    const void* out = nullptr;       // [batch*seq, heads*head_dim] forward output
    const float* lse = nullptr;      // [batch, heads, seq] f32, from attention_forward
    const void* grad_out = nullptr;  // [batch*seq, heads*head_dim]
    void* grad_qkv = nullptr;        // like qkv, out, overwritten; must not overlap the inputs
    std::int64_t kv_heads = 0;       // K/V heads (GQA); 0 = heads
    bool causal = true;              // as the forward was run (AttentionArgs::causal)
};
void attention_backward(const AttentionBackwardArgs& args, Stream& stream,
                        AttentionProvider provider = AttentionProvider::kAuto);

// 2.5x the forward's FLOPs (recompute of P, then dV, dP, dQ, dK: the FlashAttention-2 count);
// non-causal twice the causal count, as the forward.
// Reads qkv, out and grad_out, writes grad_qkv; GQA narrows the qkv and grad_qkv rows.
inline OpCost op_cost(const AttentionBackwardArgs& a) {
    const std::int64_t rows = a.batch * a.seq, width = a.heads * a.head_dim;
    const std::int64_t qkv_width = attention_qkv_width(a.heads, a.kv_heads, a.head_dim);
    OpCost c = elementwise_cost(rows * (qkv_width + 2 * width), rows * qkv_width, a.dtype, 0.0) +
               elementwise_cost(a.batch * a.heads * a.seq, 0, DType::kF32, 0.0);
    c.unit = OpUnit::kTensor;
    c.flops = 2.5 * (a.causal ? 2.0 : 4.0) * static_cast<double>(a.batch * a.heads * a.seq) *
              static_cast<double>(a.seq) * static_cast<double>(a.head_dim);
    c.gemm_m = a.seq, c.gemm_n = a.seq, c.gemm_k = a.head_dim, c.gemm_count = a.batch * a.heads;
    c.threads = static_cast<double>(a.batch * a.heads) * gemm_threads(a.seq, a.head_dim);
    return c;
}

// Throw scmoe::Error naming the first invalid argument (non-positive size, null pointer, dtype or
// head_dim the backend does not support). The ops call them before enqueueing anything.
void check_attention_args(const AttentionArgs& args, Backend backend);
void check_attention_backward_args(const AttentionBackwardArgs& args, Backend backend);
// Throws when `provider` is kCudnn on the CPU backend (which has one implementation, the own).
void check_attention_provider(AttentionProvider provider, Backend backend);

}  // namespace scmoe
