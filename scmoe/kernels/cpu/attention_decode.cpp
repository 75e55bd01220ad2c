// Decoding attention on the CPU (attention_decode.h): per (sequence, query head), BLAS over the
// cached keys, the same formulation as the training kernel (cpu/attention.cpp): scaled scores from
// one GEMM, a row softmax (max, expf, sum, multiply by the inverse), then P . V. Scratch is
// thread_local: a CPU stream is one worker thread.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "scmoe/kernels/cpu/attention_rows.h"
#include "scmoe/kernels/cpu/cpu_ops.h"
#include "scmoe/kernels/error.h"
#include "scmoe/kernels/math.h"

namespace scmoe::cpu {
namespace {

// The cached positions of sequence b, checked against the new tokens and the cache's size.
std::int64_t sequence_length(const std::int32_t* lengths, std::int64_t b, std::int64_t new_tokens,
                             std::int64_t max_length, const char* op) {
    const std::int64_t len = lengths[b];
    SCMOE_CHECK(len >= new_tokens && len <= max_length,
                op << ": sequence " << b << " has length " << len << ", outside [new_tokens " << new_tokens
                   << ", max_length " << max_length << "]");
    return len;
}

}  // namespace

void kv_cache_append(const KvCacheAppendArgs& a) {
    SCMOE_CHECK(a.dtype == DType::kF32, "kv_cache_append: CPU computes in f32 only");
    const std::int64_t D = a.head_dim, kv = attention_kv_heads(a.heads, a.kv_heads);
    const std::int64_t ld = attention_qkv_width(a.heads, a.kv_heads, D);
    const auto* qkv = static_cast<const float*>(a.qkv);
    auto* kc = static_cast<float*>(a.k_cache);
    auto* vc = static_cast<float*>(a.v_cache);
    for (std::int64_t b = 0; b < a.batch; ++b) {
        const std::int64_t len = sequence_length(a.lengths, b, a.new_tokens, a.max_length, "kv_cache_append");
        for (std::int64_t i = 0; i < a.new_tokens; ++i) {
            const float* row = qkv + (b * a.new_tokens + i) * ld;
            const std::int64_t pos = len - a.new_tokens + i;
            for (std::int64_t g = 0; g < kv; ++g) {
                const std::int64_t at = ((b * kv + g) * a.max_length + pos) * D;
                std::memcpy(kc + at, row + (a.heads + g) * D, static_cast<std::size_t>(D) * sizeof(float));
                std::memcpy(vc + at, row + (a.heads + kv + g) * D, static_cast<std::size_t>(D) * sizeof(float));
            }
        }
    }
}

void attention_decode(const AttentionDecodeArgs& a) {
    SCMOE_CHECK(a.dtype == DType::kF32, "attention_decode: CPU computes in f32 only");
    const std::int64_t D = a.head_dim, n = a.new_tokens, kv = attention_kv_heads(a.heads, a.kv_heads);
    const std::int64_t ld = attention_qkv_width(a.heads, a.kv_heads, D), ld_out = a.heads * D;
    const std::int64_t group = a.heads / kv;
    const float scale = math::attention_scale(D);
    thread_local std::vector<float> scores;
    for (std::int64_t b = 0; b < a.batch; ++b) {
        const std::int64_t len = sequence_length(a.lengths, b, n, a.max_length, "attention_decode");
        const std::int64_t start = len - n;  // position of the first new token
        if (scores.size() < static_cast<std::size_t>(n * len)) scores.resize(static_cast<std::size_t>(n * len));
        float* p = scores.data();
        for (std::int64_t h = 0; h < a.heads; ++h) {
            const std::int64_t g = h / group;
            const float* q = static_cast<const float*>(a.qkv) + b * n * ld + h * D;
            const float* k = static_cast<const float*>(a.k_cache) + (b * kv + g) * a.max_length * D;
            const float* v = static_cast<const float*>(a.v_cache) + (b * kv + g) * a.max_length * D;
            float* out = static_cast<float*>(a.out) + b * n * ld_out + h * D;
            attention_sgemm(false, true, n, len, D, scale, q, ld, k, D, 0.0f, p, len);
            for (std::int64_t r = 0; r < n; ++r) causal_softmax_row(p + r * len, start + r, len);  // keys 0..start+r
            attention_sgemm(false, false, n, D, len, 1.0f, p, len, v, D, 0.0f, out, ld_out);
        }
    }
}

}  // namespace scmoe::cpu
