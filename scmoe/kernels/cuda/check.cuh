// Private helpers of the CUDA backend: error checks that throw scmoe::Error with the failing call's
// text and the library's own error string, a device guard, and dtype plumbing for kernels.
#pragma once

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "scmoe/kernels/dtype.h"
#include "scmoe/kernels/error.h"

namespace scmoe::cuda {

const char* cublas_status_string(cublasStatus_t status);

}  // namespace scmoe::cuda

// SCMOE_CUDA_CHECK(cudaMalloc(...)): throws scmoe::Error "file:line: cudaMalloc(...) failed: <cuda error>".
#define SCMOE_CUDA_CHECK(call)                                                           \
    do {                                                                                 \
        cudaError_t scmoe_cuda_err_ = (call);                                            \
        if (scmoe_cuda_err_ != cudaSuccess) {                                            \
            SCMOE_FAIL(#call << " failed: " << cudaGetErrorName(scmoe_cuda_err_) << ": " \
                             << cudaGetErrorString(scmoe_cuda_err_));                    \
        }                                                                                \
    } while (0)

#define SCMOE_CUBLAS_CHECK(call)                                                                       \
    do {                                                                                               \
        cublasStatus_t scmoe_cublas_st_ = (call);                                                      \
        if (scmoe_cublas_st_ != CUBLAS_STATUS_SUCCESS) {                                               \
            SCMOE_FAIL(#call << " failed: " << ::scmoe::cuda::cublas_status_string(scmoe_cublas_st_)); \
        }                                                                                              \
    } while (0)

// After every kernel launch: launch-configuration errors surface here, named by the kernel.
#define SCMOE_CUDA_CHECK_LAUNCH(kernel_name)                                                                   \
    do {                                                                                                       \
        cudaError_t scmoe_cuda_err_ = cudaGetLastError();                                                      \
        if (scmoe_cuda_err_ != cudaSuccess) {                                                                  \
            SCMOE_FAIL("launch of " << kernel_name << " failed: " << cudaGetErrorName(scmoe_cuda_err_) << ": " \
                                    << cudaGetErrorString(scmoe_cuda_err_));                                   \
        }                                                                                                      \
    } while (0)

namespace scmoe::cuda {

inline cudaStream_t as_stream(void* stream) { return static_cast<cudaStream_t>(stream); }

// Makes `device` current for the guard's lifetime and restores the previous one.
class DeviceGuard {
  public:
    explicit DeviceGuard(int device) {
        SCMOE_CUDA_CHECK(cudaGetDevice(&previous_));
        if (previous_ != device) SCMOE_CUDA_CHECK(cudaSetDevice(device));
        changed_ = previous_ != device;
    }
    ~DeviceGuard() {
        if (changed_) cudaSetDevice(previous_);  // NOTES: cannot throw from a destructor
    }
    DeviceGuard(const DeviceGuard&) = delete;
    DeviceGuard& operator=(const DeviceGuard&) = delete;

  private:
    int previous_ = 0;
    bool changed_ = false;
};

// The device `stream` belongs to. Safe while the stream is being captured into a CUDA graph,
// where cudaStreamGetDevice fails (cudaErrorStreamCaptureUnsupported, seen on H100 with CUDA 13):
// the device is read from the stream's registered resources (scmoe/kernels/cuda/cuda_device.cu),
// and asked of CUDA only for a stream never seen before.
int stream_device(cudaStream_t stream);

// Makes the device `stream` belongs to current (ops are called from any thread with any current device).
class StreamDeviceGuard {
  public:
    explicit StreamDeviceGuard(cudaStream_t stream) : guard_(stream_device(stream)) {}

  private:
    DeviceGuard guard_;
};

inline bool is_aligned(const void* p, std::size_t bytes) { return reinterpret_cast<std::uintptr_t>(p) % bytes == 0; }

inline unsigned int blocks_for(std::int64_t n, int threads, std::int64_t max_blocks = 65535LL * 16) {
    std::int64_t b = (n + threads - 1) / threads;
    if (b < 1) b = 1;
    if (b > max_blocks) b = max_blocks;
    return static_cast<unsigned int>(b);
}

// Element access for kernels templated on the storage type: load as f32, store rounded once.
template <class T>
__device__ __forceinline__ float load_f32(const T* p) {
    return static_cast<float>(*p);
}
template <>
__device__ __forceinline__ float load_f32<__nv_bfloat16>(const __nv_bfloat16* p) {
    return __bfloat162float(*p);
}
template <class T>
__device__ __forceinline__ void store_f32(T* p, float v) {
    *p = v;
}
template <>
__device__ __forceinline__ void store_f32<__nv_bfloat16>(__nv_bfloat16* p, float v) {
    *p = __float2bfloat16_rn(v);
}

// Calls fn.template operator()<T>() with T = float or __nv_bfloat16 for dtype; throws otherwise.
template <class Fn>
void dispatch_float_dtype(DType dtype, const char* op, Fn&& fn) {
    switch (dtype) {
        case DType::kF32:
            fn(float{});
            return;
        case DType::kBF16:
            fn(__nv_bfloat16{});
            return;
        case DType::kI32:
            break;
    }
    SCMOE_FAIL(op << ": dtype " << dtype_name(dtype) << " not supported on CUDA (f32 or bf16)");
}

}  // namespace scmoe::cuda
