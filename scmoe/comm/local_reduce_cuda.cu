// The rank-order sum of LocalCommunicator's CUDA path (scmoe/comm/detail/local_reduce_cuda.h).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "scmoe/comm/detail/local_reduce_cuda.h"
#include "scmoe/kernels/cuda/check.cuh"

namespace scmoe::comm_detail {
namespace {

struct SumInputs {
    const void* ptr[kMaxDeviceSumInputs];
};

// NOTES: every element is summed by one thread in rank order, the same adds as the host loop in
// sum_in_rank_order (f32 starts from rank 0's value, bf16 and i32 from zero), so the results are
// bit-identical to the host path's. Only adds: nothing for the compiler to contract into FMAs.
__global__ void sum_f32_kernel(SumInputs in, int num_inputs, float* out, std::int64_t count) {
    const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
    for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
        float acc = static_cast<const float*>(in.ptr[0])[i];
        for (int r = 1; r < num_inputs; ++r) acc += static_cast<const float*>(in.ptr[r])[i];
        out[i] = acc;
    }
}

__global__ void sum_bf16_kernel(SumInputs in, int num_inputs, __nv_bfloat16* out, std::int64_t count) {
    const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
    for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
        float acc = 0.0f;
        for (int r = 0; r < num_inputs; ++r) acc += __bfloat162float(static_cast<const __nv_bfloat16*>(in.ptr[r])[i]);
        out[i] = __float2bfloat16_rn(acc);
    }
}

__global__ void sum_i32_kernel(SumInputs in, int num_inputs, std::int32_t* out, std::int64_t count) {
    const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
    for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
        std::uint32_t acc = 0u;  // unsigned: wraps instead of overflowing
        for (int r = 0; r < num_inputs; ++r)
            acc += static_cast<std::uint32_t>(static_cast<const std::int32_t*>(in.ptr[r])[i]);
        out[i] = static_cast<std::int32_t>(acc);
    }
}

}  // namespace

void sum_in_rank_order_cuda(const void* const* inputs, int num_inputs, void* out, std::int64_t count, DType dtype,
                            void* stream) {
    SCMOE_CHECK(num_inputs >= 1 && num_inputs <= kMaxDeviceSumInputs,
                "device rank-order sum of " << num_inputs << " inputs (1 to " << kMaxDeviceSumInputs << ")");
    SCMOE_CHECK(count >= 0, "device rank-order sum of " << count << " elements");
    if (count == 0) return;
    SumInputs in{};
    for (int r = 0; r < num_inputs; ++r) in.ptr[r] = inputs[r];
    constexpr int kThreads = 256;
    const unsigned int blocks = cuda::blocks_for(count, kThreads);
    cudaStream_t s = cuda::as_stream(stream);
    switch (dtype) {
        case DType::kF32:
            sum_f32_kernel<<<blocks, kThreads, 0, s>>>(in, num_inputs, static_cast<float*>(out), count);
            SCMOE_CUDA_CHECK_LAUNCH("sum_f32_kernel");
            return;
        case DType::kBF16:
            sum_bf16_kernel<<<blocks, kThreads, 0, s>>>(in, num_inputs, static_cast<__nv_bfloat16*>(out), count);
            SCMOE_CUDA_CHECK_LAUNCH("sum_bf16_kernel");
            return;
        case DType::kI32:
            sum_i32_kernel<<<blocks, kThreads, 0, s>>>(in, num_inputs, static_cast<std::int32_t*>(out), count);
            SCMOE_CUDA_CHECK_LAUNCH("sum_i32_kernel");
            return;
    }
    SCMOE_FAIL("device rank-order sum: unknown dtype");
}

}  // namespace scmoe::comm_detail
