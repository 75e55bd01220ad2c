// Expert activations (SwiGLU, GELU-tanh) and their backward; math shared with the CPU via scmoe/kernels/math.h.
#include "scmoe/kernels/cuda/check.cuh"
#include "scmoe/kernels/cuda/cuda_ops.h"
#include "scmoe/kernels/math.h"

namespace scmoe::cuda {
namespace {

constexpr int kThreads = 256;

template <class T, Activation kAct>
__global__ void activation_forward_kernel(const T* h, T* out, long long rows, long long ffn,
                                          const std::int32_t* num_rows, const std::int32_t* first_row) {
    const long long width = kAct == Activation::kSwiGLU ? 2 * ffn : ffn;
    const long long n = (num_rows && *num_rows < rows ? *num_rows : rows) * ffn;
    const long long begin = (first_row && *first_row > 0 ? *first_row : 0) * ffn;
    for (long long i = begin + blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<long long>(gridDim.x) * blockDim.x) {
        const long long r = i / ffn, f = i % ffn;
        const T* hr = h + r * width;
        if constexpr (kAct == Activation::kSwiGLU) {
            store_f32(out + i, math::swiglu(load_f32(hr + f), load_f32(hr + ffn + f)));
        } else {
            store_f32(out + i, math::gelu(load_f32(hr + f)));
        }
    }
}

template <class T, Activation kAct>
__global__ void activation_backward_kernel(const T* h, const T* grad_out, T* grad_h, long long rows, long long ffn,
                                           const std::int32_t* num_rows, const std::int32_t* first_row) {
    const long long width = kAct == Activation::kSwiGLU ? 2 * ffn : ffn;
    const long long n = (num_rows && *num_rows < rows ? *num_rows : rows) * ffn;
    const long long begin = (first_row && *first_row > 0 ? *first_row : 0) * ffn;
    for (long long i = begin + blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<long long>(gridDim.x) * blockDim.x) {
        const long long r = i / ffn, f = i % ffn;
        const T* hr = h + r * width;
        T* d = grad_h + r * width;
        const float g = load_f32(grad_out + i);
        if constexpr (kAct == Activation::kSwiGLU) {
            const float gate = load_f32(hr + f), up = load_f32(hr + ffn + f);
            store_f32(d + f, g * math::swiglu_grad_gate(gate, up));
            store_f32(d + ffn + f, g * math::swiglu_grad_up(gate));
        } else {
            store_f32(d + f, g * math::gelu_grad(load_f32(hr + f)));
        }
    }
}

}  // namespace

void activation_forward(const ActivationArgs& a, void* stream) {
    cudaStream_t s = as_stream(stream);
    StreamDeviceGuard guard(s);
    dispatch_float_dtype(a.dtype, "activation", [&](auto tag) {
        using T = decltype(tag);
        const long long n = a.rows * a.ffn;
        if (n == 0) return;
        const auto* h = static_cast<const T*>(a.h);
        auto* out = static_cast<T*>(a.out);
        if (a.activation == Activation::kSwiGLU) {
            activation_forward_kernel<T, Activation::kSwiGLU>
                <<<blocks_for(n, kThreads), kThreads, 0, s>>>(h, out, a.rows, a.ffn, a.num_rows, a.first_row);
        } else {
            activation_forward_kernel<T, Activation::kGeLU>
                <<<blocks_for(n, kThreads), kThreads, 0, s>>>(h, out, a.rows, a.ffn, a.num_rows, a.first_row);
        }
        SCMOE_CUDA_CHECK_LAUNCH("activation_forward_kernel");
    });
}

void activation_backward(const ActivationBackwardArgs& a, void* stream) {
    cudaStream_t s = as_stream(stream);
    StreamDeviceGuard guard(s);
    dispatch_float_dtype(a.dtype, "activation backward", [&](auto tag) {
        using T = decltype(tag);
        const long long n = a.rows * a.ffn;
        if (n == 0) return;
        const auto* h = static_cast<const T*>(a.h);
        const auto* go = static_cast<const T*>(a.grad_out);
        auto* gh = static_cast<T*>(a.grad_h);
        if (a.activation == Activation::kSwiGLU) {
            activation_backward_kernel<T, Activation::kSwiGLU>
                <<<blocks_for(n, kThreads), kThreads, 0, s>>>(h, go, gh, a.rows, a.ffn, a.num_rows, a.first_row);
        } else {
            activation_backward_kernel<T, Activation::kGeLU>
                <<<blocks_for(n, kThreads), kThreads, 0, s>>>(h, go, gh, a.rows, a.ffn, a.num_rows, a.first_row);
        }
        SCMOE_CUDA_CHECK_LAUNCH("activation_backward_kernel");
    });
}

}  // namespace scmoe::cuda
