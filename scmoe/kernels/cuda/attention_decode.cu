// Decoding attention against a KV cache (scmoe/kernels/attention_decode.h) on CUDA, f32 or bf16
// storage with fp32 accumulation:
//   kv_cache_append:  one thread per (sequence, new token, K/V head, element) of K and of V.
//   attention_decode: one warp per (sequence, query head, new token), lanes over head_dim, online
//                     softmax over the cached keys 0 .. its position (the training kernel's loop,
//                     cuda/attention.cu, reading K/V from the cache).
// The lengths are read on the device and trusted (the CPU op checks them; the Decoder checks them
// on the host before uploading).
#include <cstdint>
#include <type_traits>

#include "scmoe/kernels/cuda/attention_rows.cuh"
#include "scmoe/kernels/cuda/check.cuh"
#include "scmoe/kernels/cuda/cuda_ops.h"
#include "scmoe/kernels/math.h"

namespace scmoe::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;

struct DecodeShape {
    long long batch, new_tokens, heads, kv_heads, head_dim, max_length;
    float scale;
    __device__ long long qkv_width() const { return (heads + 2 * kv_heads) * head_dim; }
    // Offset (elements) of position p of (sequence b, K/V head g) in a cache block.
    __device__ long long cache_row(long long b, long long g, long long p) const {
        return ((b * kv_heads + g) * max_length + p) * head_dim;
    }
};

DecodeShape decode_shape(std::int64_t batch, std::int64_t new_tokens, std::int64_t heads, std::int64_t kv_heads,
                         std::int64_t head_dim, std::int64_t max_length) {
    return {batch, new_tokens, heads, attention_kv_heads(heads, kv_heads), head_dim, max_length,
            math::attention_scale(head_dim)};
}

template <class T>
__global__ void kv_cache_append_kernel(DecodeShape sh, const T* qkv, const std::int32_t* lengths, T* k_cache,
                                       T* v_cache) {
    const long long total = sh.batch * sh.new_tokens * sh.kv_heads * sh.head_dim;
    for (long long x = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; x < total;
         x += static_cast<long long>(gridDim.x) * blockDim.x) {
        const long long d = x % sh.head_dim, g = (x / sh.head_dim) % sh.kv_heads;
        const long long i = (x / (sh.head_dim * sh.kv_heads)) % sh.new_tokens;
        const long long b = x / (sh.head_dim * sh.kv_heads * sh.new_tokens);
        const long long pos = lengths[b] - sh.new_tokens + i;
        const T* row = qkv + (b * sh.new_tokens + i) * sh.qkv_width();
        k_cache[sh.cache_row(b, g, pos) + d] = row[(sh.heads + g) * sh.head_dim + d];
        v_cache[sh.cache_row(b, g, pos) + d] = row[(sh.heads + sh.kv_heads + g) * sh.head_dim + d];
    }
}

template <class T, int kPer>
__global__ void attention_decode_kernel(DecodeShape sh, const T* qkv, const std::int32_t* lengths, const T* k_cache,
                                        const T* v_cache, T* out) {
    const long long w = blockIdx.x * static_cast<long long>(kWarpsPerBlock) + threadIdx.x / 32;
    if (w >= sh.batch * sh.heads * sh.new_tokens) return;
    const long long i = w % sh.new_tokens, h = (w / sh.new_tokens) % sh.heads, b = w / (sh.new_tokens * sh.heads);
    const long long g = h / (sh.heads / sh.kv_heads);
    const long long last = lengths[b] - sh.new_tokens + i;  // keys 0..last are visible
    const int lane = threadIdx.x % 32;
    float q[kPer], acc[kPer], kv[kPer];
    load_row(qkv + (b * sh.new_tokens + i) * sh.qkv_width() + h * sh.head_dim, sh.head_dim, lane, q);
#pragma unroll
    for (int e = 0; e < kPer; ++e) acc[e] = 0.0f;
    const T* k0 = k_cache + sh.cache_row(b, g, 0);
    const T* v0 = v_cache + sh.cache_row(b, g, 0);
    float mx = -INFINITY, sum = 0.0f;
    for (long long j = 0; j <= last; ++j) {
        load_row(k0 + j * sh.head_dim, sh.head_dim, lane, kv);
        float dot = 0.0f;
#pragma unroll
        for (int e = 0; e < kPer; ++e) dot += q[e] * kv[e];
        const float s = warp_sum(dot) * sh.scale;
        const float new_mx = fmaxf(mx, s);
        const float correction = expf(mx - new_mx);  // 0 on the first key (mx = -inf)
        const float p = expf(s - new_mx);
        sum = sum * correction + p;
        load_row(v0 + j * sh.head_dim, sh.head_dim, lane, kv);
#pragma unroll
        for (int e = 0; e < kPer; ++e) acc[e] = acc[e] * correction + p * kv[e];
        mx = new_mx;
    }
    T* o = out + (b * sh.new_tokens + i) * sh.heads * sh.head_dim + h * sh.head_dim;
#pragma unroll
    for (int e = 0; e < kPer; ++e) {
        const long long d = lane + 32LL * e;
        if (d < sh.head_dim) store_f32(o + d, acc[e] / sum);
    }
}

}  // namespace

void kv_cache_append(const KvCacheAppendArgs& a, void* stream) {
    cudaStream_t s = as_stream(stream);
    StreamDeviceGuard guard(s);
    const DecodeShape sh = decode_shape(a.batch, a.new_tokens, a.heads, a.kv_heads, a.head_dim, a.max_length);
    const long long total = sh.batch * sh.new_tokens * sh.kv_heads * sh.head_dim;
    const long long blocks = std::min<long long>((total + 255) / 256, 65535);
    dispatch_float_dtype(a.dtype, "kv_cache_append", [&](auto tag) {
        using T = decltype(tag);
        kv_cache_append_kernel<T><<<static_cast<unsigned int>(blocks), 256, 0, s>>>(
            sh, static_cast<const T*>(a.qkv), a.lengths, static_cast<T*>(a.k_cache), static_cast<T*>(a.v_cache));
        SCMOE_CUDA_CHECK_LAUNCH("kv_cache_append_kernel");
    });
}

void attention_decode(const AttentionDecodeArgs& a, void* stream) {
    cudaStream_t s = as_stream(stream);
    StreamDeviceGuard guard(s);
    const DecodeShape sh = decode_shape(a.batch, a.new_tokens, a.heads, a.kv_heads, a.head_dim, a.max_length);
    const long long rows = sh.batch * sh.heads * sh.new_tokens;
    const long long blocks = (rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
    SCMOE_CHECK(blocks <= 0x7fffffffLL, "attention_decode: batch*heads*new_tokens = " << rows << " rows exceed one CUDA grid");
    dispatch_float_dtype(a.dtype, "attention_decode", [&](auto tag) {
        using T = decltype(tag);
        dispatch_per_lane("attention_decode", a.head_dim, [&](auto per) {
            constexpr int kPer = decltype(per)::value;
            attention_decode_kernel<T, kPer><<<static_cast<unsigned int>(blocks), kWarpsPerBlock * 32, 0, s>>>(
                sh, static_cast<const T*>(a.qkv), a.lengths, static_cast<const T*>(a.k_cache),
                static_cast<const T*>(a.v_cache), static_cast<T*>(a.out));
            SCMOE_CUDA_CHECK_LAUNCH("attention_decode_kernel");
        });
    });
}

}  // namespace scmoe::cuda
