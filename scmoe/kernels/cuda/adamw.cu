// The optimizer's ops: the AdamW step (math::adamw_update per element, as on the CPU) and the
// deterministic two-pass sum of squares.
#include <type_traits>

#include "scmoe/kernels/cuda/check.cuh"
#include "scmoe/kernels/cuda/cuda_ops.h"
#include "scmoe/kernels/math.h"

namespace scmoe::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kFinalThreads = 1024;
static_assert(kSumOfSquaresPartials <= kFinalThreads, "the final pass gives each partial one thread");

// T: the param copy's storage type; void when no copy is written.
template <class T>
__global__ void adamw_kernel(AdamWArgs a, float bc1, float bc2) {
    for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < a.n;
         i += static_cast<long long>(gridDim.x) * blockDim.x) {
        float master = a.master[i], m = a.m[i], v = a.v[i];
        math::adamw_update(a.grad[i], a.grad_scale, a.lr, a.beta1, a.beta2, a.eps, a.weight_decay, bc1, bc2, master, m,
                           v);
        a.master[i] = master;
        a.m[i] = m;
        a.v[i] = v;
        if constexpr (!std::is_void_v<T>) store_f32(static_cast<T*>(a.param) + i, master);
    }
}

// Tree sum of blockDim.x doubles in shared memory, in a fixed order; the result lands in shared[0].
// NOTES: blockDim.x must be a power of two.
__device__ void block_tree_sum(double* shared) {
    for (unsigned int stride = blockDim.x / 2; stride > 0; stride /= 2) {
        __syncthreads();
        if (threadIdx.x < stride) shared[threadIdx.x] += shared[threadIdx.x + stride];
    }
    __syncthreads();
}

// Pass 1: block b writes partials[b], the sum over its grid-stride slice. The grid size is a
// function of n only, so every element always lands in the same thread and order.
__global__ void sum_of_squares_partials_kernel(const float* x, long long n, double* partials) {
    __shared__ double shared[kThreads];
    double sum = 0.0;
    for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<long long>(gridDim.x) * blockDim.x) {
        const double value = x[i];
        sum += value * value;
    }
    shared[threadIdx.x] = sum;
    block_tree_sum(shared);
    if (threadIdx.x == 0) partials[blockIdx.x] = shared[0];
}

// Pass 2: one block sums the partials in a fixed order and rounds once to f32.
__global__ void sum_of_squares_final_kernel(const double* partials, int num_partials, float* out) {
    __shared__ double shared[kFinalThreads];
    shared[threadIdx.x] = static_cast<int>(threadIdx.x) < num_partials ? partials[threadIdx.x] : 0.0;
    block_tree_sum(shared);
    if (threadIdx.x == 0) *out = static_cast<float>(shared[0]);
}

}  // namespace

void adamw_step(const AdamWArgs& a, void* stream) {
    cudaStream_t s = as_stream(stream);
    StreamDeviceGuard guard(s);
    if (a.n == 0) return;
    const float bc1 = adamw_bias_correction(a.beta1, a.step);
    const float bc2 = adamw_bias_correction(a.beta2, a.step);
    const unsigned int blocks = blocks_for(a.n, kThreads);
    if (!a.param) {
        adamw_kernel<void><<<blocks, kThreads, 0, s>>>(a, bc1, bc2);
    } else if (a.param_dtype == DType::kBF16) {
        adamw_kernel<__nv_bfloat16><<<blocks, kThreads, 0, s>>>(a, bc1, bc2);
    } else {
        adamw_kernel<float><<<blocks, kThreads, 0, s>>>(a, bc1, bc2);
    }
    SCMOE_CUDA_CHECK_LAUNCH("adamw_kernel");
}

void sum_of_squares(const float* x, std::int64_t n, float* out, void* scratch, void* stream) {
    cudaStream_t s = as_stream(stream);
    StreamDeviceGuard guard(s);
    auto* partials = static_cast<double*>(scratch);
    const unsigned int blocks = n == 0 ? 1 : blocks_for(n, kThreads, kSumOfSquaresPartials);
    sum_of_squares_partials_kernel<<<blocks, kThreads, 0, s>>>(x, n, partials);
    SCMOE_CUDA_CHECK_LAUNCH("sum_of_squares_partials_kernel");
    sum_of_squares_final_kernel<<<1, kFinalThreads, 0, s>>>(partials, static_cast<int>(blocks), out);
    SCMOE_CUDA_CHECK_LAUNCH("sum_of_squares_final_kernel");
}

}  // namespace scmoe::cuda
