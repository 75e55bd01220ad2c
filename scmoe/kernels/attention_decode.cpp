#include "scmoe/kernels/attention_decode.h"

#include "scmoe/kernels/error.h"

namespace scmoe {
namespace {

void check_decode_common(const char* op, std::int64_t batch, std::int64_t new_tokens, std::int64_t heads,
                         std::int64_t kv_heads, std::int64_t head_dim, std::int64_t max_length, DType dtype,
                         Backend backend) {
    SCMOE_CHECK(batch > 0 && new_tokens > 0 && heads > 0 && head_dim > 0 && max_length > 0,
                op << ": batch, new_tokens, heads, head_dim and max_length must be positive, got batch=" << batch
                   << " new_tokens=" << new_tokens << " heads=" << heads << " head_dim=" << head_dim
                   << " max_length=" << max_length);
    SCMOE_CHECK(kv_heads >= 0 && (kv_heads == 0 || (kv_heads <= heads && heads % kv_heads == 0)),
                op << ": kv_heads " << kv_heads << " must divide heads " << heads << " (0: kv_heads = heads)");
    SCMOE_CHECK(new_tokens <= max_length,
                op << ": new_tokens " << new_tokens << " exceed the cache's max_length " << max_length);
    SCMOE_CHECK(dtype == DType::kF32 || (dtype == DType::kBF16 && backend != Backend::kCpu),
                op << ": dtype " << dtype_name(dtype) << " not supported on " << backend_name(backend)
                   << " (CPU: f32)");
    SCMOE_CHECK(backend != Backend::kCuda || head_dim <= kAttentionCudaMaxHeadDim,
                op << ": head_dim " << head_dim << " exceeds the CUDA kernels' limit " << kAttentionCudaMaxHeadDim);
}

}  // namespace

void check_kv_cache_append_args(const KvCacheAppendArgs& a, Backend backend) {
    check_decode_common("kv_cache_append", a.batch, a.new_tokens, a.heads, a.kv_heads, a.head_dim, a.max_length,
                        a.dtype, backend);
    SCMOE_CHECK(a.qkv && a.lengths && a.k_cache && a.v_cache,
                "kv_cache_append: qkv, lengths, k_cache and v_cache must not be null");
}

void check_attention_decode_args(const AttentionDecodeArgs& a, Backend backend) {
    check_decode_common("attention_decode", a.batch, a.new_tokens, a.heads, a.kv_heads, a.head_dim, a.max_length,
                        a.dtype, backend);
    SCMOE_CHECK(a.qkv && a.lengths && a.k_cache && a.v_cache && a.out,
                "attention_decode: qkv, lengths, k_cache, v_cache and out must not be null");
}

}  // namespace scmoe
