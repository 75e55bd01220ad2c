// Token + position embedding forward and backward.
// NOTES: no atomics. grad_table: one block per (vocab row, column tile); the block scans ids in
// chunks of kThreads tokens, compacts the chunk's matching tokens into shared memory in increasing
// t (ballot + per-warp prefix), and each thread adds their grad_out values to its column in that
// order. grad_positions: one thread per (position, column) summing the sequences in order. Every
// sum starts from the old value (accumulate) or zero and adds tokens in increasing t, as the CPU does.
// Ids are not validated here (the caller does, on the host); an id outside [0, vocab) reads nothing
// out of bounds: its output row is NaN (visible downstream) and its gradient matches no table row.
#include <cmath>

#include "scmoe/kernels/cuda/check.cuh"
#include "scmoe/kernels/cuda/cuda_ops.h"

namespace scmoe::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;  // forward: one warp per token
constexpr int kThreads = 128;      // grad_table: columns per tile and tokens per scanned chunk
constexpr int kScanWarps = kThreads / 32;
constexpr int kPositionThreads = 256;

template <class T>
__global__ void embedding_forward_kernel(EmbeddingArgs a) {
    const T* table = static_cast<const T*>(a.table);
    const T* positions = static_cast<const T*>(a.positions);
    T* out = static_cast<T*>(a.out);
    const int lane = threadIdx.x % 32;
    for (long long t = blockIdx.x * static_cast<long long>(kWarpsPerBlock) + threadIdx.x / 32; t < a.tokens;
         t += static_cast<long long>(gridDim.x) * kWarpsPerBlock) {
        const std::int32_t id = a.ids[t];
        T* ot = out + t * a.hidden;
        if (id < 0 || id >= a.vocab) {
            for (long long h = lane; h < a.hidden; h += 32) store_f32(ot + h, NAN);
            continue;
        }
        const T* row = table + id * a.hidden;
        const T* pos = positions ? positions + (t % a.seq_len) * a.hidden : nullptr;
        for (long long h = lane; h < a.hidden; h += 32) {
            const float e = load_f32(row + h);
            store_f32(ot + h, pos ? e + load_f32(pos + h) : e);
        }
    }
}

template <class T>
__global__ void embedding_grad_table_kernel(EmbeddingBackwardArgs a) {
    __shared__ int chunk_matches[kThreads];  // offsets in the chunk of the tokens with ids == v, increasing
    __shared__ int warp_counts[kScanWarps];
    const T* go = static_cast<const T*>(a.grad_out);
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const long long column_tiles = (a.hidden + kThreads - 1) / kThreads;
    for (long long v = blockIdx.x; v < a.vocab; v += gridDim.x) {
        for (long long tile = blockIdx.y; tile < column_tiles; tile += gridDim.y) {
            const long long h = tile * kThreads + threadIdx.x;
            const bool has_column = h < a.hidden;
            float acc = has_column && a.accumulate_table ? a.grad_table[v * a.hidden + h] : 0.0f;
            for (long long t0 = 0; t0 < a.tokens; t0 += kThreads) {
                const bool match = t0 + threadIdx.x < a.tokens && a.ids[t0 + threadIdx.x] == v;
                const unsigned int ballot = __ballot_sync(0xffffffffu, match);
                if (lane == 0) warp_counts[warp] = __popc(ballot);
                __syncthreads();
                int offset = 0, count = 0;
                for (int w = 0; w < kScanWarps; ++w) {
                    if (w < warp) offset += warp_counts[w];
                    count += warp_counts[w];
                }
                if (match) chunk_matches[offset + __popc(ballot & ((1u << lane) - 1u))] = threadIdx.x;
                __syncthreads();
                if (has_column) {
                    for (int i = 0; i < count; ++i) acc += load_f32(go + (t0 + chunk_matches[i]) * a.hidden + h);
                }
                __syncthreads();  // the next chunk overwrites chunk_matches and warp_counts
            }
            if (has_column) a.grad_table[v * a.hidden + h] = acc;
        }
    }
}

template <class T>
__global__ void embedding_grad_positions_kernel(EmbeddingBackwardArgs a) {
    const T* go = static_cast<const T*>(a.grad_out);
    const long long n = a.seq_len * a.hidden, row_stride = a.seq_len * a.hidden;
    for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<long long>(gridDim.x) * blockDim.x) {
        float acc = 0.0f;  // element i of position p = i / hidden; token b * seq_len + p of each sequence b
        for (long long j = i; j < a.tokens * a.hidden; j += row_stride) acc += load_f32(go + j);
        a.grad_positions[i] = acc;
    }
}

}  // namespace

void embedding_forward(const EmbeddingArgs& a, void* stream) {
    cudaStream_t s = as_stream(stream);
    StreamDeviceGuard guard(s);
    dispatch_float_dtype(a.dtype, "embedding_forward", [&](auto tag) {
        using T = decltype(tag);
        embedding_forward_kernel<T><<<blocks_for(a.tokens, kWarpsPerBlock), kWarpsPerBlock * 32, 0, s>>>(a);
        SCMOE_CUDA_CHECK_LAUNCH("embedding_forward_kernel");
    });
}

void embedding_backward(const EmbeddingBackwardArgs& a, void* stream) {
    cudaStream_t s = as_stream(stream);
    StreamDeviceGuard guard(s);
    dispatch_float_dtype(a.dtype, "embedding_backward", [&](auto tag) {
        using T = decltype(tag);
        if (a.grad_table) {
            const dim3 grid(blocks_for(a.vocab, 1, 1LL << 30), blocks_for(a.hidden, kThreads, 65535));
            embedding_grad_table_kernel<T><<<grid, kThreads, 0, s>>>(a);
            SCMOE_CUDA_CHECK_LAUNCH("embedding_grad_table_kernel");
        }
        if (a.grad_positions) {
            embedding_grad_positions_kernel<T>
                <<<blocks_for(a.seq_len * a.hidden, kPositionThreads), kPositionThreads, 0, s>>>(a);
            SCMOE_CUDA_CHECK_LAUNCH("embedding_grad_positions_kernel");
        }
    });
}

}  // namespace scmoe::cuda
