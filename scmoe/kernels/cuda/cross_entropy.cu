// Softmax cross-entropy with its gradient: one block per row (grid-stride over rows).
// NOTES: no atomics. A row is read twice (max, then sum of exponentials), each a lane-strided pass
// reduced by warp butterflies and then the warp partials in warp order; the target logit is read
// before the first barrier. Only after the barriers of the sum does any thread write the row, and
// then each its own elements, so grad_logits may be logits itself. Fixed launch shapes make the sum order reproducible.
// Targets are not validated here (the caller does, on the host); a target outside [0, vocab) reads
// nothing out of bounds: its loss is NaN and its gradient row is the plain softmax.
#include <cmath>

#include "scmoe/kernels/cuda/check.cuh"
#include "scmoe/kernels/cuda/cuda_ops.h"

namespace scmoe::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

struct MaxOp {
    __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct SumOp {
    __device__ float operator()(float a, float b) const { return a + b; }
};

// The same value in every thread of the block; `partials` is free again when it returns.
template <class Op>
__device__ float block_reduce(float v, float* partials, Op op) {
    for (int offset = 16; offset > 0; offset /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
    if (threadIdx.x % 32 == 0) partials[threadIdx.x / 32] = v;
    __syncthreads();
    float r = partials[0];
    for (int w = 1; w < kWarps; ++w) r = op(r, partials[w]);
    __syncthreads();
    return r;
}

template <class T>
__global__ void cross_entropy_kernel(CrossEntropyArgs a) {
    __shared__ float partials[kWarps];
    const T* logits = static_cast<const T*>(a.logits);
    T* grad = static_cast<T*>(a.grad_logits);
    for (long long t = blockIdx.x; t < a.tokens; t += gridDim.x) {
        const T* x = logits + t * a.vocab;
        const std::int32_t target = a.targets[t];
        // Read by the thread that writes the loss, before the barriers below (the row may be overwritten).
        const float target_logit = threadIdx.x == 0 && target >= 0 && target < a.vocab ? load_f32(x + target) : NAN;
        float max = -INFINITY;
        bool nonfinite = false;
        for (long long v = threadIdx.x; v < a.vocab; v += kThreads) {
            const float xv = load_f32(x + v);
            max = fmaxf(max, xv);
            nonfinite = nonfinite || !isfinite(xv);
        }
        max = block_reduce(max, partials, MaxOp{});
        // fmaxf skips NaN and exp(-inf) is 0, so a NaN or -inf logit could leave the row finite: the
        // caller's overflow check relies on any non-finite logit making the loss non-finite.
        const bool finite = __syncthreads_or(nonfinite) == 0;
        float sum = 0.0f;
        for (long long v = threadIdx.x; v < a.vocab; v += kThreads) sum += expf(load_f32(x + v) - max);
        sum = block_reduce(sum, partials, SumOp{});
        if (!finite) sum = NAN;
        if (threadIdx.x == 0) a.loss[t] = max + logf(sum) - target_logit;
        if (grad) {
            T* g = grad + t * a.vocab;  // may be x: each thread reads its elements before writing them
            for (long long v = threadIdx.x; v < a.vocab; v += kThreads) {
                const float p = expf(load_f32(x + v) - max) / sum;
                store_f32(g + v, a.grad_scale * (v == target ? p - 1.0f : p));
            }
        }
    }
}

}  // namespace

void cross_entropy(const CrossEntropyArgs& a, void* stream) {
    cudaStream_t s = as_stream(stream);
    StreamDeviceGuard guard(s);
    dispatch_float_dtype(a.dtype, "cross_entropy", [&](auto tag) {
        using T = decltype(tag);
        cross_entropy_kernel<T><<<blocks_for(a.tokens, 1), kThreads, 0, s>>>(a);
        SCMOE_CUDA_CHECK_LAUNCH("cross_entropy_kernel");
    });
}

}  // namespace scmoe::cuda
