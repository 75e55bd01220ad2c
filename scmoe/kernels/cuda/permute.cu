// Permute (gather into the expert-major buffer), its backward, the weighted combine and its
// backward. Sums over a token's choices run j ascending in fp32 and round once, as on the CPU.
#include <climits>

#include "scmoe/kernels/cuda/check.cuh"
#include "scmoe/kernels/cuda/cuda_ops.h"

namespace scmoe::cuda {
namespace {

constexpr int kThreads = 256;

// One block per row (grid-stride over the rows), its threads over the row's `width` columns (as many
// as the row needs, a multiple of 32, at most 256): no element divides a flat index by the width. The
// row's base pointers are computed once; its slots and gate weights are re-read in each column's loop
// (the same address for the whole block: cached). The arithmetic of each element is unchanged.
struct RowLaunch {
    unsigned int blocks;
    int threads;
};
RowLaunch row_launch(long long rows, long long width) {
    const long long warps = (width + 31) / 32;
    return {static_cast<unsigned int>(rows < 65535LL * 16 ? rows : 65535LL * 16),
            static_cast<int>(warps >= 8 ? 256 : 32 * warps)};
}

// Row copies as V-sized words (16, 4 or 2 bytes); rows of `words` words. One block per row chunk.
template <class V>
__global__ void permute_kernel(const V* x, const std::int32_t* choice_of_row, V* xp, long long rows, long long words,
                               int top_k) {
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const std::int32_t choice = choice_of_row[r];
        V* dst = xp + r * words;
        if (choice < 0) {
            for (long long w = threadIdx.x; w < words; w += blockDim.x) dst[w] = V{};
        } else {
            const V* src = x + (choice / top_k) * words;
            for (long long w = threadIdx.x; w < words; w += blockDim.x) dst[w] = src[w];
        }
    }
}

template <class T>
__global__ void permute_backward_kernel(PermuteBackwardArgs a) {
    const T* gxp = static_cast<const T*>(a.grad_xp);
    for (long long t = blockIdx.x; t < a.tokens; t += gridDim.x) {
        T* gx = static_cast<T*>(a.grad_x) + t * a.hidden;
        const std::int32_t* slots = a.slot_of_choice + t * a.top_k;
        for (long long h = threadIdx.x; h < a.hidden; h += blockDim.x) {
            float acc = a.accumulate ? load_f32(gx + h) : 0.0f;
            for (int j = 0; j < a.top_k; ++j) {
                const std::int32_t slot = slots[j];
                if (slot >= 0) acc += load_f32(gxp + slot * a.hidden + h);
            }
            store_f32(gx + h, acc);
        }
    }
}

template <class T>
__global__ void combine_kernel(CombineArgs a) {
    const T* yp = static_cast<const T*>(a.yp);
    for (long long t = blockIdx.x; t < a.tokens; t += gridDim.x) {
        T* y = static_cast<T*>(a.y) + t * a.hidden;
        const std::int32_t* slots = a.slot_of_choice + t * a.top_k;
        const float* weights = a.gate_weight + t * a.top_k;
        for (long long h = threadIdx.x; h < a.hidden; h += blockDim.x) {
            float acc = 0.0f;
            for (int j = 0; j < a.top_k; ++j) {
                const std::int32_t slot = slots[j];
                if (slot >= 0) acc += weights[j] * load_f32(yp + slot * a.hidden + h);
            }
            store_f32(y + h, a.accumulate ? load_f32(y + h) + acc : acc);
        }
    }
}

// grad_yp[r] = w * grad_y[t] for the choice in row r; zeros for empty rows.
template <class T>
__global__ void combine_backward_rows_kernel(CombineBackwardArgs a) {
    for (long long r = blockIdx.x; r < a.rows; r += gridDim.x) {
        T* gyp = static_cast<T*>(a.grad_yp) + r * a.hidden;
        const std::int32_t choice = a.choice_of_row[r];
        if (choice < 0) {
            for (long long h = threadIdx.x; h < a.hidden; h += blockDim.x) store_f32(gyp + h, 0.0f);
            continue;
        }
        const float w = a.gate_weight[choice];
        const T* gy = static_cast<const T*>(a.grad_y) + (choice / a.top_k) * a.hidden;
        for (long long h = threadIdx.x; h < a.hidden; h += blockDim.x) store_f32(gyp + h, w * load_f32(gy + h));
    }
}

// grad_gate_weight[c] = <grad_y[t], yp[slot]>: one warp per choice, fixed-order shuffle reduction.
template <class T>
__global__ void combine_backward_gate_kernel(CombineBackwardArgs a) {
    const T* gy = static_cast<const T*>(a.grad_y);
    const T* yp = static_cast<const T*>(a.yp);
    const long long warps_per_block = blockDim.x / 32;
    const long long n = a.tokens * a.top_k;
    const int lane = threadIdx.x % 32;
    for (long long c = blockIdx.x * warps_per_block + threadIdx.x / 32; c < n; c += gridDim.x * warps_per_block) {
        const std::int32_t slot = a.slot_of_choice[c];
        float dot = 0.0f;
        if (slot >= 0) {
            const T* g = gy + (c / a.top_k) * a.hidden;
            const T* v = yp + static_cast<long long>(slot) * a.hidden;
            for (long long h = lane; h < a.hidden; h += 32) dot += load_f32(g + h) * load_f32(v + h);
        }
        for (int offset = 16; offset > 0; offset /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, offset);
        if (lane == 0) a.grad_gate_weight[c] = dot;
    }
}

template <class V>
void launch_permute(const PermuteArgs& a, long long row_bytes, cudaStream_t s) {
    const long long words = row_bytes / static_cast<long long>(sizeof(V));
    const RowLaunch l = row_launch(a.rows, words);
    permute_kernel<V><<<l.blocks, l.threads, 0, s>>>(static_cast<const V*>(a.x), a.choice_of_row,
                                                     static_cast<V*>(a.xp), a.rows, words, a.top_k);
    SCMOE_CUDA_CHECK_LAUNCH("permute_kernel");
}

}  // namespace

void permute(const PermuteArgs& a, void* stream) {
    cudaStream_t s = as_stream(stream);
    StreamDeviceGuard guard(s);
    dispatch_float_dtype(a.dtype, "permute", [](auto) {});
    if (a.rows == 0 || a.hidden == 0) return;
    const long long row_bytes = a.hidden * static_cast<long long>(dtype_size(a.dtype));
    if (row_bytes % 16 == 0 && is_aligned(a.x, 16) && is_aligned(a.xp, 16)) {
        launch_permute<uint4>(a, row_bytes, s);
    } else if (row_bytes % 4 == 0 && is_aligned(a.x, 4) && is_aligned(a.xp, 4)) {
        launch_permute<unsigned int>(a, row_bytes, s);
    } else {
        launch_permute<unsigned short>(a, row_bytes, s);
    }
}

void permute_backward(const PermuteBackwardArgs& a, void* stream) {
    cudaStream_t s = as_stream(stream);
    StreamDeviceGuard guard(s);
    dispatch_float_dtype(a.dtype, "permute_backward", [&](auto tag) {
        using T = decltype(tag);
        if (a.tokens * a.hidden == 0) return;
        const RowLaunch l = row_launch(a.tokens, a.hidden);
        permute_backward_kernel<T><<<l.blocks, l.threads, 0, s>>>(a);
        SCMOE_CUDA_CHECK_LAUNCH("permute_backward_kernel");
    });
}

void combine(const CombineArgs& a, void* stream) {
    cudaStream_t s = as_stream(stream);
    StreamDeviceGuard guard(s);
    dispatch_float_dtype(a.dtype, "combine", [&](auto tag) {
        using T = decltype(tag);
        if (a.tokens * a.hidden == 0) return;
        const RowLaunch l = row_launch(a.tokens, a.hidden);
        combine_kernel<T><<<l.blocks, l.threads, 0, s>>>(a);
        SCMOE_CUDA_CHECK_LAUNCH("combine_kernel");
    });
}

void combine_backward(const CombineBackwardArgs& a, void* stream) {
    cudaStream_t s = as_stream(stream);
    StreamDeviceGuard guard(s);
    dispatch_float_dtype(a.dtype, "combine_backward", [&](auto tag) {
        using T = decltype(tag);
        if (a.rows * a.hidden > 0) {
            const RowLaunch l = row_launch(a.rows, a.hidden);
            combine_backward_rows_kernel<T><<<l.blocks, l.threads, 0, s>>>(a);
            SCMOE_CUDA_CHECK_LAUNCH("combine_backward_rows_kernel");
        }
        if (a.tokens * a.top_k > 0) {
            const long long warps = a.tokens * a.top_k;
            combine_backward_gate_kernel<T><<<blocks_for(warps * 32, kThreads), kThreads, 0, s>>>(a);
            SCMOE_CUDA_CHECK_LAUNCH("combine_backward_gate_kernel");
        }
    });
}

}  // namespace scmoe::cuda
