// Attention forward and backward, causal or not (AttentionArgs::causal): one warp per row, lanes
// over head_dim (kPer elements each, head_dim <= 32 * kPer), fp32 accumulation in registers.
//   forward:  warp per query row, online softmax over keys 0..i (non-causal: 0..seq-1); writes out
//             and lse.
//   backward: warp per query row i for dQ, warp per key row j of a K/V head for dK and dV (queries
//             j..seq-1, non-causal 0..seq-1, of each query head of its group, head by head); both
//             recompute P_ij = exp(s_ij - lse_i) and use D_i = dO_i . O_i.
// GQA (attention.h): query head h reads K/V head h / group, group = heads / kv_heads.
// NOTES: no atomics and no shared accumulators: every output element is summed by one lane in
// key (or query) order, and dot products are warp butterflies whose value every lane shares, so
// results are bitwise reproducible run to run.
//
// The entry points below pick the provider (scmoe/kernels/attention.h, cudnn_attention_plan.h): cuDNN's
// fused flash attention for bf16 when built with it, these kernels otherwise and as the reference.
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <type_traits>

#include "scmoe/kernels/cuda/attention_rows.cuh"
#include "scmoe/kernels/cuda/check.cuh"
#include "scmoe/kernels/cuda/cuda_ops.h"
#include "scmoe/kernels/cuda/cudnn_attention_plan.h"
#include "scmoe/kernels/math.h"
#if SCMOE_WITH_CUDNN
#include "scmoe/kernels/cuda/cudnn_attention.h"
#endif

namespace scmoe::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;

struct Shape {
    long long batch, seq, heads, head_dim;
    float scale;
    long long kv_heads;  // > 0; heads % kv_heads == 0
    bool causal;         // false: every query sees every key of its sequence
    // The last key query i sees, and the first query that sees key j.
    __device__ long long last_key(long long i) const { return causal ? i : seq - 1; }
    __device__ long long first_query(long long j) const { return causal ? j : 0; }
    // Offsets (elements) of row i of sequence b: of query head h in qkv and in out, of K/V head g in qkv.
    __device__ long long qkv_row(long long b, long long i, long long h) const {
        return (b * seq + i) * qkv_stride() + h * head_dim;
    }
    __device__ long long k_row(long long b, long long i, long long g) const {
        return (b * seq + i) * qkv_stride() + (heads + g) * head_dim;
    }
    __device__ long long v_row(long long b, long long i, long long g) const {
        return (b * seq + i) * qkv_stride() + (heads + kv_heads + g) * head_dim;
    }
    __device__ long long out_row(long long b, long long i, long long h) const {
        return (b * seq + i) * heads * head_dim + h * head_dim;
    }
    __device__ long long qkv_stride() const { return (heads + 2 * kv_heads) * head_dim; }
    __device__ long long group() const { return heads / kv_heads; }
};

// The warp's row: (b, h, i) with i fastest, h over `heads` (query heads, or K/V heads for the dK/dV
// kernel). False when the warp is past the last row.
__device__ __forceinline__ bool warp_row(const Shape& sh, long long heads, long long& b, long long& h, long long& i) {
    const long long w = blockIdx.x * static_cast<long long>(kWarpsPerBlock) + threadIdx.x / 32;
    if (w >= sh.batch * heads * sh.seq) return false;
    i = w % sh.seq;
    h = (w / sh.seq) % heads;
    b = w / (sh.seq * heads);
    return true;
}

template <class T, int kPer>
__device__ __forceinline__ void store_row(T* p, long long head_dim, int lane, const float (&r)[kPer], float mul) {
#pragma unroll
    for (int e = 0; e < kPer; ++e) {
        const long long d = lane + 32LL * e;
        if (d < head_dim) store_f32(p + d, r[e] * mul);
    }
}

template <int kPer>
__device__ __forceinline__ float lane_dot(const float (&a)[kPer], const float (&b)[kPer]) {
    float s = 0.0f;
#pragma unroll
    for (int e = 0; e < kPer; ++e) s += a[e] * b[e];
    return s;
}

template <class T, int kPer>
__global__ void attention_forward_kernel(Shape sh, const T* qkv, T* out, float* lse) {
    long long b, h, i;
    if (!warp_row(sh, sh.heads, b, h, i)) return;
    const int lane = threadIdx.x % 32;
    const long long ld = sh.qkv_stride();
    float q[kPer], acc[kPer], kv[kPer];
    load_row(qkv + sh.qkv_row(b, i, h), sh.head_dim, lane, q);
#pragma unroll
    for (int e = 0; e < kPer; ++e) acc[e] = 0.0f;
    const T* k0 = qkv + sh.k_row(b, 0, h / sh.group());
    const T* v0 = qkv + sh.v_row(b, 0, h / sh.group());
    float mx = -INFINITY, sum = 0.0f;
    const long long last = sh.last_key(i);
    for (long long j = 0; j <= last; ++j) {
        load_row(k0 + j * ld, sh.head_dim, lane, kv);
        const float s = warp_sum(lane_dot(q, kv)) * sh.scale;
        const float new_mx = fmaxf(mx, s);
        const float correction = expf(mx - new_mx);  // 0 on the first key (mx = -inf)
        const float p = expf(s - new_mx);
        sum = sum * correction + p;
        load_row(v0 + j * ld, sh.head_dim, lane, kv);
#pragma unroll
        for (int e = 0; e < kPer; ++e) acc[e] = acc[e] * correction + p * kv[e];
        mx = new_mx;
    }
    store_row(out + sh.out_row(b, i, h), sh.head_dim, lane, acc, 1.0f / sum);
    if (lane == 0 && lse) lse[(b * sh.heads + h) * sh.seq + i] = mx + logf(sum);
}

// dQ_i = scale * sum_{j <= i} P_ij (dP_ij - D_i) k_j, with dP_ij = dO_i . v_j (non-causal: all j).
template <class T, int kPer>
__global__ void attention_grad_q_kernel(Shape sh, const T* qkv, const T* out, const float* lse, const T* grad_out,
                                        T* grad_qkv) {
    long long b, h, i;
    if (!warp_row(sh, sh.heads, b, h, i)) return;
    const int lane = threadIdx.x % 32;
    const long long ld = sh.qkv_stride();
    float q[kPer], go[kPer], dq[kPer], kv[kPer];
    load_row(qkv + sh.qkv_row(b, i, h), sh.head_dim, lane, q);
    load_row(grad_out + sh.out_row(b, i, h), sh.head_dim, lane, go);
    load_row(out + sh.out_row(b, i, h), sh.head_dim, lane, kv);
    const float delta = warp_sum(lane_dot(go, kv));
    const float lse_i = lse[(b * sh.heads + h) * sh.seq + i];
#pragma unroll
    for (int e = 0; e < kPer; ++e) dq[e] = 0.0f;
    const T* k0 = qkv + sh.k_row(b, 0, h / sh.group());
    const T* v0 = qkv + sh.v_row(b, 0, h / sh.group());
    const long long last = sh.last_key(i);
    for (long long j = 0; j <= last; ++j) {
        load_row(v0 + j * ld, sh.head_dim, lane, kv);
        const float dp = warp_sum(lane_dot(go, kv));
        load_row(k0 + j * ld, sh.head_dim, lane, kv);
        const float p = math::attention_prob(warp_sum(lane_dot(q, kv)) * sh.scale, lse_i);
        const float ds = p * (dp - delta);
#pragma unroll
        for (int e = 0; e < kPer; ++e) dq[e] += ds * kv[e];
    }
    store_row(grad_qkv + sh.qkv_row(b, i, h), sh.head_dim, lane, dq, sh.scale);
}

// For key row j of K/V head g: dV_j = sum_h sum_{i >= j} P_ij dO_i,
// dK_j = scale * sum_h sum_{i >= j} P_ij (dP_ij - D_i) q_i, h over the query heads of g's group
// (non-causal: every i).
template <class T, int kPer>
__global__ void attention_grad_kv_kernel(Shape sh, const T* qkv, const T* out, const float* lse, const T* grad_out,
                                         T* grad_qkv) {
    long long b, g, j;
    if (!warp_row(sh, sh.kv_heads, b, g, j)) return;
    const int lane = threadIdx.x % 32;
    float k[kPer], v[kPer], dk[kPer], dv[kPer], q[kPer], go[kPer], o[kPer];
    const long long kj = sh.k_row(b, j, g), vj = sh.v_row(b, j, g);
    load_row(qkv + kj, sh.head_dim, lane, k);
    load_row(qkv + vj, sh.head_dim, lane, v);
#pragma unroll
    for (int e = 0; e < kPer; ++e) dk[e] = dv[e] = 0.0f;
    for (long long h = g * sh.group(); h < (g + 1) * sh.group(); ++h) {
        const float* lse_row = lse + (b * sh.heads + h) * sh.seq;
        for (long long i = sh.first_query(j); i < sh.seq; ++i) {
            load_row(qkv + sh.qkv_row(b, i, h), sh.head_dim, lane, q);
            load_row(grad_out + sh.out_row(b, i, h), sh.head_dim, lane, go);
            load_row(out + sh.out_row(b, i, h), sh.head_dim, lane, o);
            const float s = warp_sum(lane_dot(q, k)) * sh.scale;
            const float dp = warp_sum(lane_dot(go, v));
            const float delta = warp_sum(lane_dot(go, o));
            const float p = math::attention_prob(s, lse_row[i]);
            const float ds = p * (dp - delta);
#pragma unroll
            for (int e = 0; e < kPer; ++e) {
                dv[e] += p * go[e];
                dk[e] += ds * q[e];
            }
        }
    }
    store_row(grad_qkv + kj, sh.head_dim, lane, dk, sh.scale);
    store_row(grad_qkv + vj, sh.head_dim, lane, dv, 1.0f);
}

Shape shape_of(std::int64_t batch, std::int64_t seq, std::int64_t heads, std::int64_t head_dim, std::int64_t kv_heads,
               bool causal) {
    return {batch, seq, heads, head_dim, math::attention_scale(head_dim), attention_kv_heads(heads, kv_heads), causal};
}

// Blocks of kWarpsPerBlock warps for one warp per row of `heads` heads (query or K/V heads).
unsigned int row_blocks(const Shape& sh, long long heads) {
    const long long rows = sh.batch * heads * sh.seq;
    const long long blocks = (rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
    SCMOE_CHECK(blocks <= 0x7fffffffLL, "attention: batch*heads*seq = " << rows << " rows exceed one CUDA grid");
    return static_cast<unsigned int>(blocks);
}

bool all_aligned(std::initializer_list<const void*> pointers) {
    for (const void* p : pointers)
        if (!is_aligned(p, kCudnnAttentionAlignmentBytes)) return false;
    return true;
}

AttentionPathChoice choose_path(const char* op, AttentionProvider provider, DType dtype, std::int64_t head_dim,
                                bool aligned) {
    return choose_attention_path(op, effective_attention_provider(provider, std::getenv("SCMOE_ATTENTION_PROVIDER")),
                                 dtype, head_dim, aligned, attention_cudnn_built());
}

void own_attention_forward(const AttentionArgs& a, cudaStream_t s) {
    const Shape sh = shape_of(a.batch, a.seq, a.heads, a.head_dim, a.kv_heads, a.causal);
    dispatch_float_dtype(a.dtype, "attention_forward", [&](auto tag) {
        using T = decltype(tag);
        dispatch_per_lane("attention", a.head_dim, [&](auto per) {
            constexpr int kPer = decltype(per)::value;
            attention_forward_kernel<T, kPer><<<row_blocks(sh, sh.heads), kWarpsPerBlock * 32, 0, s>>>(
                sh, static_cast<const T*>(a.qkv), static_cast<T*>(a.out), a.lse);
            SCMOE_CUDA_CHECK_LAUNCH("attention_forward_kernel");
        });
    });
}

void own_attention_backward(const AttentionBackwardArgs& a, cudaStream_t s) {
    const Shape sh = shape_of(a.batch, a.seq, a.heads, a.head_dim, a.kv_heads, a.causal);
    dispatch_float_dtype(a.dtype, "attention_backward", [&](auto tag) {
        using T = decltype(tag);
        const auto* qkv = static_cast<const T*>(a.qkv);
        const auto* out = static_cast<const T*>(a.out);
        const auto* go = static_cast<const T*>(a.grad_out);
        auto* gq = static_cast<T*>(a.grad_qkv);
        dispatch_per_lane("attention", a.head_dim, [&](auto per) {
            constexpr int kPer = decltype(per)::value;
            attention_grad_q_kernel<T, kPer>
                <<<row_blocks(sh, sh.heads), kWarpsPerBlock * 32, 0, s>>>(sh, qkv, out, a.lse, go, gq);
            SCMOE_CUDA_CHECK_LAUNCH("attention_grad_q_kernel");
            attention_grad_kv_kernel<T, kPer>
                <<<row_blocks(sh, sh.kv_heads), kWarpsPerBlock * 32, 0, s>>>(sh, qkv, out, a.lse, go, gq);
            SCMOE_CUDA_CHECK_LAUNCH("attention_grad_kv_kernel");
        });
    });
}

}  // namespace

void attention_forward(const AttentionArgs& a, AttentionProvider provider, void* stream) {
    cudaStream_t s = as_stream(stream);
    StreamDeviceGuard guard(s);
    const AttentionPathChoice choice =
        choose_path("attention_forward", provider, a.dtype, a.head_dim, all_aligned({a.qkv, a.out, a.lse}));
#if SCMOE_WITH_CUDNN
    if (choice.path == AttentionPath::kCudnn && cudnn_attention_forward(a, s, choice.cudnn_required)) return;
#endif
    own_attention_forward(a, s);
    detail::note_attention_call(false, false, false, 0);
}

void attention_backward(const AttentionBackwardArgs& a, AttentionProvider provider, void* stream) {
    cudaStream_t s = as_stream(stream);
    StreamDeviceGuard guard(s);
    const AttentionPathChoice choice = choose_path("attention_backward", provider, a.dtype, a.head_dim,
                                                   all_aligned({a.qkv, a.out, a.lse, a.grad_out, a.grad_qkv}));
#if SCMOE_WITH_CUDNN
    if (choice.path == AttentionPath::kCudnn && cudnn_attention_backward(a, s, choice.cudnn_required)) return;
#endif
    own_attention_backward(a, s);
    detail::note_attention_call(false, true, false, 0);
}

}  // namespace scmoe::cuda
