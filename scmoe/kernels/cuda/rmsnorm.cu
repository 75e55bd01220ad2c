// RMSNorm forward and backward; per-element math shared with the CPU via scmoe/kernels/math.h.
// NOTES: no atomics. Per-token sums are warp butterflies over lane-strided partials; grad_weight is
// one block per (32 columns, chunk of tokens) summing its tokens in a fixed (threadIdx.y, token)
// order, then its lanes in order, then (with several chunks, through the stream's scratch) the
// chunks in order. Launch shapes that depend only on the tensor shape make every sum order, and so
// every result, reproducible.
#include "scmoe/kernels/cuda/check.cuh"
#include "scmoe/kernels/cuda/cuda_ops.h"
#include "scmoe/kernels/cuda/stream_resources.cuh"
#include "scmoe/kernels/math.h"

namespace scmoe::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;  // token kernels: one warp per token
constexpr int kColumnTile = 32;    // grad_weight: columns per block (threadIdx.x)
constexpr int kTokenLanes = 32;    // grad_weight: token stride inside a block (threadIdx.y)

__device__ __forceinline__ float warp_sum(float v) {
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

template <class T>
__global__ void rmsnorm_forward_kernel(RmsNormArgs a) {
    const T* x = static_cast<const T*>(a.x);
    const T* w = static_cast<const T*>(a.weight);
    T* y = static_cast<T*>(a.y);
    const int lane = threadIdx.x % 32;
    for (long long t = blockIdx.x * static_cast<long long>(kWarpsPerBlock) + threadIdx.x / 32; t < a.tokens;
         t += static_cast<long long>(gridDim.x) * kWarpsPerBlock) {
        const T* xt = x + t * a.hidden;
        float sum_sq = 0.0f;
        for (long long h = lane; h < a.hidden; h += 32) {
            const float v = load_f32(xt + h);
            sum_sq += v * v;
        }
        const float rstd = math::rmsnorm_rstd(warp_sum(sum_sq), a.hidden, a.eps);
        if (lane == 0 && a.rstd) a.rstd[t] = rstd;
        T* yt = y + t * a.hidden;  // may be xt: each lane reads its elements before writing them
        for (long long h = lane; h < a.hidden; h += 32) {
            store_f32(yt + h, math::rmsnorm_apply(load_f32(xt + h), rstd, load_f32(w + h)));
        }
    }
}

template <class T>
__global__ void rmsnorm_grad_x_kernel(RmsNormBackwardArgs a) {
    const T* x = static_cast<const T*>(a.x);
    const T* w = static_cast<const T*>(a.weight);
    const T* gy = static_cast<const T*>(a.grad_y);
    T* gx = static_cast<T*>(a.grad_x);
    const int lane = threadIdx.x % 32;
    for (long long t = blockIdx.x * static_cast<long long>(kWarpsPerBlock) + threadIdx.x / 32; t < a.tokens;
         t += static_cast<long long>(gridDim.x) * kWarpsPerBlock) {
        const long long row = t * a.hidden;
        float dot = 0.0f;
        for (long long h = lane; h < a.hidden; h += 32) {
            dot += load_f32(gy + row + h) * load_f32(w + h) * load_f32(x + row + h);
        }
        const float mean_gx = warp_sum(dot) / static_cast<float>(a.hidden);
        const float rstd = a.rstd[t];
        for (long long h = lane; h < a.hidden; h += 32) {
            float g =
                math::rmsnorm_grad_x(load_f32(gy + row + h), load_f32(w + h), load_f32(x + row + h), rstd, mean_gx);
            if (a.accumulate) g = load_f32(gx + row + h) + g;
            store_f32(gx + row + h, g);
        }
    }
}

// grad_weight, pass 1: block (column tile, chunk) sums the tokens of its chunk for 32 columns, each
// thread every kTokenLanes-th token of the chunk, then the lanes in order. With one chunk it writes
// grad_weight itself; with more, row `chunk` of `partials` [chunks, hidden].
template <class T>
__global__ void rmsnorm_grad_weight_partials_kernel(RmsNormBackwardArgs a, long long tokens_per_chunk, float* out) {
    __shared__ float partial[kTokenLanes][kColumnTile + 1];
    const T* x = static_cast<const T*>(a.x);
    const T* gy = static_cast<const T*>(a.grad_y);
    const long long h = blockIdx.x * static_cast<long long>(kColumnTile) + threadIdx.x;
    const long long begin = blockIdx.y * tokens_per_chunk;
    const long long end = begin + tokens_per_chunk < a.tokens ? begin + tokens_per_chunk : a.tokens;
    float acc = 0.0f;
    if (h < a.hidden) {
        for (long long t = begin + threadIdx.y; t < end; t += kTokenLanes) {
            acc += load_f32(gy + t * a.hidden + h) * load_f32(x + t * a.hidden + h) * a.rstd[t];
        }
    }
    partial[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && h < a.hidden) {
        float sum = 0.0f;
        for (int r = 0; r < kTokenLanes; ++r) sum += partial[r][threadIdx.x];
        out[blockIdx.y * a.hidden + h] = sum;
    }
}

// grad_weight, pass 2: each column's chunk partials summed in chunk order.
__global__ void rmsnorm_grad_weight_sum_kernel(const float* partials, int chunks, long long hidden,
                                               float* grad_weight) {
    const long long h = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x;
    if (h >= hidden) return;
    float sum = 0.0f;
    for (int c = 0; c < chunks; ++c) sum += partials[c * hidden + h];
    grad_weight[h] = sum;
}

// Chunks of tokens for grad_weight: enough blocks to fill the GPU (one block per 32 columns alone
// left all but hidden / 32 SMs idle: 24 of an H100's 132 at hidden 768, and each of those SMs
// walked 256 tokens per thread one dependent load after another: 0.38 ms per backward at 8192 x
// 768, docs/results/gpu-h100-2026-11-27/trace), at most as many as the stream's scratch holds rows
// of partials, and at least kMinTokensPerChunk tokens per chunk. Depends on the shape only, so the
// sum order, and every bit of the result, is the same on every run.
constexpr long long kMaxChunks = 64, kMinTokensPerChunk = 128;
long long grad_weight_chunks(std::int64_t tokens, std::int64_t hidden) {
    const long long fit = static_cast<long long>(kScratchBytes / sizeof(float)) / (hidden > 0 ? hidden : 1);
    long long chunks = tokens / kMinTokensPerChunk;
    if (chunks > kMaxChunks) chunks = kMaxChunks;
    if (chunks > fit) chunks = fit;
    return chunks < 2 ? 1 : chunks;
}

unsigned int token_blocks(std::int64_t tokens) { return blocks_for(tokens, kWarpsPerBlock); }

}  // namespace

void rmsnorm_forward(const RmsNormArgs& a, void* stream) {
    cudaStream_t s = as_stream(stream);
    StreamDeviceGuard guard(s);
    dispatch_float_dtype(a.dtype, "rmsnorm_forward", [&](auto tag) {
        using T = decltype(tag);
        rmsnorm_forward_kernel<T><<<token_blocks(a.tokens), kWarpsPerBlock * 32, 0, s>>>(a);
        SCMOE_CUDA_CHECK_LAUNCH("rmsnorm_forward_kernel");
    });
}

void rmsnorm_backward(const RmsNormBackwardArgs& a, void* stream) {
    cudaStream_t s = as_stream(stream);
    StreamDeviceGuard guard(s);
    dispatch_float_dtype(a.dtype, "rmsnorm_backward", [&](auto tag) {
        using T = decltype(tag);
        if (a.grad_weight) {
            const unsigned int column_blocks = static_cast<unsigned int>((a.hidden + kColumnTile - 1) / kColumnTile);
            const long long chunks = grad_weight_chunks(a.tokens, a.hidden);
            const long long tokens_per_chunk = (a.tokens + chunks - 1) / chunks;
            // Several chunks: their partials in the stream's scratch (its resources looked up only then).
            float* partials = chunks == 1 ? a.grad_weight : static_cast<float*>(stream_resources(s).scratch);
            rmsnorm_grad_weight_partials_kernel<T>
                <<<dim3(column_blocks, static_cast<unsigned int>(chunks)), dim3(kColumnTile, kTokenLanes), 0, s>>>(
                    a, tokens_per_chunk, partials);
            SCMOE_CUDA_CHECK_LAUNCH("rmsnorm_grad_weight_partials_kernel");
            if (chunks > 1) {
                rmsnorm_grad_weight_sum_kernel<<<blocks_for(a.hidden, 256), 256, 0, s>>>(
                    partials, static_cast<int>(chunks), a.hidden, a.grad_weight);
                SCMOE_CUDA_CHECK_LAUNCH("rmsnorm_grad_weight_sum_kernel");
            }
        }
        rmsnorm_grad_x_kernel<T><<<token_blocks(a.tokens), kWarpsPerBlock * 32, 0, s>>>(a);
        SCMOE_CUDA_CHECK_LAUNCH("rmsnorm_grad_x_kernel");
    });
}

}  // namespace scmoe::cuda
