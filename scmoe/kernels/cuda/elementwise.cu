// Elementwise ops around the GEMMs: CG-1 gated add and its backward, the non-finite check, and
// dtype conversion.
#include <climits>

#include "scmoe/kernels/cuda/check.cuh"
#include "scmoe/kernels/cuda/cuda_ops.h"
#include "scmoe/kernels/math.h"

namespace scmoe::cuda {
namespace {

constexpr int kThreads = 256;

template <class T>
__global__ void gated_add_kernel(GatedAddArgs a) {
    const T* b = static_cast<const T*>(a.branch);
    T* y = static_cast<T*>(a.y);
    const long long n = a.tokens * a.hidden;
    for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<long long>(gridDim.x) * blockDim.x) {
        const float c = a.gate_logit ? math::sigmoid(a.gate_logit[i / a.hidden]) : 1.0f;
        store_f32(y + i, load_f32(y + i) + c * load_f32(b + i));
    }
}

// One warp per token: grad_branch elementwise, grad_gate_logit from a fixed-order warp reduction.
template <class T>
__global__ void gated_add_backward_kernel(GatedAddBackwardArgs a) {
    const T* b = static_cast<const T*>(a.branch);
    const T* gy = static_cast<const T*>(a.grad_y);
    T* gb = static_cast<T*>(a.grad_branch);
    const long long warps_per_block = blockDim.x / 32;
    const int lane = threadIdx.x % 32;
    for (long long t = blockIdx.x * warps_per_block + threadIdx.x / 32; t < a.tokens;
         t += gridDim.x * warps_per_block) {
        const float c = a.gate_logit ? math::sigmoid(a.gate_logit[t]) : 1.0f;
        float dot = 0.0f;
        for (long long h = lane; h < a.hidden; h += 32) {
            const long long i = t * a.hidden + h;
            const float g = load_f32(gy + i);
            store_f32(gb + i, c * g);
            dot += g * load_f32(b + i);
        }
        for (int offset = 16; offset > 0; offset /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, offset);
        if (lane == 0 && a.gate_logit) store_f32(static_cast<T*>(a.grad_gate_logit) + t, c * (1.0f - c) * dot);
    }
}

__global__ void nonfinite_init_kernel(long long* count, long long* first_index) {
    *count = 0;
    *first_index = LLONG_MAX;
}

// NOTES: integer atomics only (add, min), so the result does not depend on scheduling.
template <class T>
__global__ void nonfinite_count_kernel(const T* x, long long n, long long* count, long long* first_index) {
    long long bad = 0, first = LLONG_MAX;
    for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<long long>(gridDim.x) * blockDim.x) {
        if (!isfinite(load_f32(x + i))) {
            if (i < first) first = i;
            ++bad;
        }
    }
    for (int offset = 16; offset > 0; offset /= 2) {
        bad += __shfl_xor_sync(0xffffffffu, bad, offset);
        const long long other = __shfl_xor_sync(0xffffffffu, first, offset);
        first = other < first ? other : first;
    }
    if (threadIdx.x % 32 == 0 && bad > 0) {
        atomicAdd(reinterpret_cast<unsigned long long*>(count), static_cast<unsigned long long>(bad));
        atomicMin(first_index, first);
    }
}

__global__ void nonfinite_finish_kernel(long long* first_index) {
    if (*first_index == LLONG_MAX) *first_index = -1;
}

__global__ void f32_to_bf16_kernel(const float* src, std::uint16_t* dst, long long n) {
    for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<long long>(gridDim.x) * blockDim.x) {
        dst[i] = math::f32_to_bf16_bits(src[i]);
    }
}

__global__ void bf16_to_f32_kernel(const std::uint16_t* src, float* dst, long long n) {
    for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<long long>(gridDim.x) * blockDim.x) {
        dst[i] = math::bf16_bits_to_f32(src[i]);
    }
}

}  // namespace

void gated_add(const GatedAddArgs& a, void* stream) {
    cudaStream_t s = as_stream(stream);
    StreamDeviceGuard guard(s);
    dispatch_float_dtype(a.dtype, "gated_add", [&](auto tag) {
        using T = decltype(tag);
        const long long n = a.tokens * a.hidden;
        if (n == 0) return;
        gated_add_kernel<T><<<blocks_for(n, kThreads), kThreads, 0, s>>>(a);
        SCMOE_CUDA_CHECK_LAUNCH("gated_add_kernel");
    });
}

void gated_add_backward(const GatedAddBackwardArgs& a, void* stream) {
    cudaStream_t s = as_stream(stream);
    StreamDeviceGuard guard(s);
    dispatch_float_dtype(a.dtype, "gated_add_backward", [&](auto tag) {
        using T = decltype(tag);
        if (a.tokens == 0) return;
        gated_add_backward_kernel<T><<<blocks_for(a.tokens * 32, kThreads), kThreads, 0, s>>>(a);
        SCMOE_CUDA_CHECK_LAUNCH("gated_add_backward_kernel");
    });
}

void count_nonfinite(const void* x, std::int64_t n, DType dtype, std::int64_t* count, std::int64_t* first_index,
                     void* stream) {
    static_assert(sizeof(long long) == sizeof(std::int64_t));
    cudaStream_t s = as_stream(stream);
    StreamDeviceGuard guard(s);
    auto* c = reinterpret_cast<long long*>(count);
    auto* f = reinterpret_cast<long long*>(first_index);
    nonfinite_init_kernel<<<1, 1, 0, s>>>(c, f);
    SCMOE_CUDA_CHECK_LAUNCH("nonfinite_init_kernel");
    dispatch_float_dtype(dtype, "count_nonfinite", [&](auto tag) {
        using T = decltype(tag);
        if (n == 0) return;
        nonfinite_count_kernel<T><<<blocks_for(n, kThreads, 1024), kThreads, 0, s>>>(static_cast<const T*>(x), n, c, f);
        SCMOE_CUDA_CHECK_LAUNCH("nonfinite_count_kernel");
    });
    nonfinite_finish_kernel<<<1, 1, 0, s>>>(f);
    SCMOE_CUDA_CHECK_LAUNCH("nonfinite_finish_kernel");
}

void convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, std::int64_t n, void* stream) {
    cudaStream_t s = as_stream(stream);
    StreamDeviceGuard guard(s);
    if (n == 0) return;
    if (src_dtype == dst_dtype) {
        SCMOE_CUDA_CHECK(
            cudaMemcpyAsync(dst, src, static_cast<std::size_t>(n) * dtype_size(src_dtype), cudaMemcpyDefault, s));
    } else if (src_dtype == DType::kF32 && dst_dtype == DType::kBF16) {
        f32_to_bf16_kernel<<<blocks_for(n, kThreads), kThreads, 0, s>>>(static_cast<const float*>(src),
                                                                        static_cast<std::uint16_t*>(dst), n);
        SCMOE_CUDA_CHECK_LAUNCH("f32_to_bf16_kernel");
    } else if (src_dtype == DType::kBF16 && dst_dtype == DType::kF32) {
        bf16_to_f32_kernel<<<blocks_for(n, kThreads), kThreads, 0, s>>>(static_cast<const std::uint16_t*>(src),
                                                                        static_cast<float*>(dst), n);
        SCMOE_CUDA_CHECK_LAUNCH("bf16_to_f32_kernel");
    } else {
        SCMOE_FAIL("convert: no conversion " << dtype_name(src_dtype) << " -> " << dtype_name(dst_dtype));
    }
}

}  // namespace scmoe::cuda
