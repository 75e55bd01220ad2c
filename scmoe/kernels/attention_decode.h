// Decoding attention against a KV cache: the new tokens of each sequence append their K and V to
// the cache, then their queries attend, causally, every cached position up to their own. With the
// cache holding what a full pass would compute, the result equals attention_forward's rows for the
// same positions (same scale 1/sqrt(head_dim), same grouped-query rule: query head h reads K/V head
// h / (heads / kv_heads); attention.h).
//
// Cache layout, one per attention layer: k_cache and v_cache are [batch, kv_heads, max_length,
// head_dim] in the compute dtype, so one (sequence, K/V head) is a contiguous [max_length, head_dim]
// block. lengths[b] (device int32, [batch]) is the number of positions of sequence b cached after
// this step's append; its `new_tokens` new tokens occupy positions lengths[b] - new_tokens ..
// lengths[b] - 1, and query i of it attends keys 0 .. lengths[b] - new_tokens + i.
//
// The new tokens' qkv rows are [batch * new_tokens, (heads + 2 kv_heads) head_dim], sequence-major,
// laid out as attention.h's (q | K | V). Prefill is new_tokens = the prompt's length; a decode step
// is new_tokens = 1.
//
// CPU: f32 (BLAS per (sequence, head)); a length outside [new_tokens, max_length] is an error at
// the stream's next synchronize. Emulated: modeled time only. CUDA: f32 or bf16 storage, fp32
// accumulation, head_dim <= kAttentionCudaMaxHeadDim; the lengths are trusted (check them on the host).
#pragma once

#include <cstdint>

#include "scmoe/kernels/attention.h"
#include "scmoe/kernels/device.h"
#include "scmoe/kernels/dtype.h"
#include "scmoe/kernels/op_cost.h"

namespace scmoe {

struct KvCacheAppendArgs {
    std::int64_t batch = 0, new_tokens = 0, heads = 0, kv_heads = 0, head_dim = 0;  // kv_heads 0 = heads
    std::int64_t max_length = 0;       // positions per sequence the cache holds
    DType dtype = DType::kF32;
    const void* qkv = nullptr;         // [batch * new_tokens, qkv width]: the K and V parts are appended
    const std::int32_t* lengths = nullptr;  // [batch] device: cached positions after the append
    void* k_cache = nullptr;           // [batch, kv_heads, max_length, head_dim]
    void* v_cache = nullptr;           // same
};
void kv_cache_append(const KvCacheAppendArgs& args, Stream& stream);

inline OpCost op_cost(const KvCacheAppendArgs& a) {
    const std::int64_t n = 2 * a.batch * a.new_tokens * attention_kv_heads(a.heads, a.kv_heads) * a.head_dim;
    return elementwise_cost(n, n, a.dtype, 0.0);
}

struct AttentionDecodeArgs {
    std::int64_t batch = 0, new_tokens = 0, heads = 0, kv_heads = 0, head_dim = 0;  // kv_heads 0 = heads
    std::int64_t max_length = 0;       // the cache's positions per sequence (every lengths[b] <= it)
    DType dtype = DType::kF32;
    const void* qkv = nullptr;         // [batch * new_tokens, qkv width]: the queries are read
    const std::int32_t* lengths = nullptr;  // [batch] device: cached positions, the new ones included
    const void* k_cache = nullptr;     // [batch, kv_heads, max_length, head_dim]
    const void* v_cache = nullptr;
    void* out = nullptr;               // [batch * new_tokens, heads * head_dim]
    // Host hint for the cost model only: the longest lengths[b] of this call (the lengths live on
    // the device); 0 = max_length. The ops never read it.
    std::int64_t longest = 0;
};
void attention_decode(const AttentionDecodeArgs& args, Stream& stream);

// QK^T and PV for every new query over `longest` keys (max_length when not given); reads the
// queries and those K/V rows once, writes out.
inline OpCost op_cost(const AttentionDecodeArgs& a) {
    const std::int64_t kv = attention_kv_heads(a.heads, a.kv_heads);
    const std::int64_t keys = a.longest > 0 ? a.longest : a.max_length;
    const std::int64_t q = a.batch * a.new_tokens * a.heads * a.head_dim;
    OpCost c = elementwise_cost(q + 2 * a.batch * kv * keys * a.head_dim, q, a.dtype, 0.0);
    c.flops = 4.0 * static_cast<double>(a.batch * a.new_tokens * a.heads) * static_cast<double>(keys) *
              static_cast<double>(a.head_dim);
    return c;
}

// Throw scmoe::Error naming the first invalid argument (sizes, kv_heads, null pointers, dtype,
// new_tokens > max_length). The ops call them before enqueueing anything.
void check_kv_cache_append_args(const KvCacheAppendArgs& args, Backend backend);
void check_attention_decode_args(const AttentionDecodeArgs& args, Backend backend);

}  // namespace scmoe
