// Router on CUDA: softmax (+ optional noise), top-k (k <= kMaxTopK) with renormalised weights, aux and z
// losses with deterministic reductions, and the backward. One thread per token mirrors the CPU
// loop order (scmoe/kernels/cpu/router.cpp) so both backends do the same arithmetic.
#include <climits>

#include "scmoe/kernels/cuda/check.cuh"
#include "scmoe/kernels/cuda/cuda_ops.h"
#include "scmoe/kernels/cuda/stream_resources.cuh"
#include "scmoe/kernels/math.h"

namespace scmoe::cuda {
namespace {

constexpr int kTokenThreads = 128;
constexpr int kReduceThreads = 256;

__global__ void router_token_kernel(RouterForwardArgs a) {
    const long long t = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x;
    if (t >= a.tokens) return;
    const int E = a.num_experts, K = a.top_k;
    const float* logit = a.logits + t * E;
    float* p = a.probs + t * E;
    const std::uint64_t noise_key = math::noise_key(a.noise_seed, a.noise_stream, a.noise_step);
    for (int e = 0; e < E; ++e) {
        float v = logit[e];
        if (a.noise_std > 0.0f)
            v += a.noise_std * math::normal_sample(noise_key, static_cast<std::uint64_t>(t * E + e));
        p[e] = v;
    }
    int best[kMaxTopK];
    float weight[kMaxTopK];
    a.logsumexp[t] = math::route_token(p, E, K, best, weight);
    for (int j = 0; j < K; ++j) {
        a.expert_index[t * K + j] = best[j];
        a.gate_weight[t * K + j] = weight[j];
    }
}

// Fixed-shape tree reduction over the block: deterministic for a given blockDim.
template <class T>
__device__ T block_sum(T v, T* shared) {
    shared[threadIdx.x] = v;
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
        if (threadIdx.x < stride) shared[threadIdx.x] += shared[threadIdx.x + stride];
        __syncthreads();
    }
    const T total = shared[0];
    __syncthreads();
    return total;
}

// Block e < E: routed count and probability sum of expert e; block E: sum of logsumexp^2.
// Results go to scratch: routed[E] (double), prob_sum[E] (double), z_sum (double).
__global__ void router_stats_kernel(RouterForwardArgs a, double* routed, double* prob_sum, double* z_sum) {
    __shared__ double shared[kReduceThreads];
    const int E = a.num_experts, K = a.top_k;
    const int e = blockIdx.x;
    if (e < E) {
        double count = 0.0, prob = 0.0;
        for (long long t = threadIdx.x; t < a.tokens; t += blockDim.x) {
            prob += a.probs[t * E + e];
            for (int j = 0; j < K; ++j) count += a.expert_index[t * K + j] == e ? 1.0 : 0.0;
        }
        count = block_sum(count, shared);
        prob = block_sum(prob, shared);
        if (threadIdx.x == 0) {
            routed[e] = count;
            prob_sum[e] = prob;
        }
    } else {
        double z = 0.0;
        for (long long t = threadIdx.x; t < a.tokens; t += blockDim.x) {
            const double l = a.logsumexp[t];
            z += l * l;
        }
        z = block_sum(z, shared);
        if (threadIdx.x == 0) *z_sum = z;
    }
}

__global__ void router_losses_kernel(RouterForwardArgs a, const double* routed, const double* prob_sum,
                                     const double* z_sum) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    const int E = a.num_experts, K = a.top_k;
    const double T = static_cast<double>(a.tokens);
    double aux = 0.0;
    for (int e = 0; e < E; ++e) {
        const double f = a.tokens ? routed[e] / (T * K) : 0.0;
        const double P = a.tokens ? prob_sum[e] / T : 0.0;
        a.expert_fraction[e] = static_cast<float>(f);
        aux += f * P;
    }
    a.losses[0] = static_cast<float>(aux * E);
    a.losses[1] = a.tokens ? static_cast<float>(*z_sum / T) : 0.0f;
}

template <class G>
__global__ void router_backward_kernel(RouterBackwardArgs a) {
    const long long t = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x;
    if (t >= a.tokens) return;
    const int E = a.num_experts, K = a.top_k;
    const float inv_t = 1.0f / static_cast<float>(a.tokens);
    const float* p = a.probs + t * E;
    const std::int32_t* idx = a.expert_index + t * K;
    const float* gw = a.grad_gate_weight + t * K;
    // dL/dp_e = aux term + gate-weight term for the chosen experts (as in the CPU loop).
    float extra[kMaxTopK];
    math::gate_weight_backward(p, idx, gw, K, extra);
    auto dp = [&](int e) {
        float v = a.aux_loss_coef * static_cast<float>(E) * a.expert_fraction[e] * inv_t;
        for (int j = 0; j < K; ++j)
            if (e == idx[j]) v += extra[j];
        return v;
    };
    float dot_pp = 0.0f;
    for (int e = 0; e < E; ++e) dot_pp += dp(e) * p[e];
    const float dz = a.z_loss_coef * 2.0f * a.logsumexp[t] * inv_t;
    G* g = static_cast<G*>(a.grad_logits) + t * E;
    for (int e = 0; e < E; ++e) store_f32(g + e, p[e] * (dp(e) - dot_pp) + dz * p[e]);
}

void check_router(std::int64_t tokens, int E, int K) {
    check_router_top_k("router", K, E);
    SCMOE_CHECK(tokens >= 0, "router: tokens = " << tokens);
}

}  // namespace

void router_forward(const RouterForwardArgs& a, void* stream) {
    cudaStream_t s = as_stream(stream);
    StreamDeviceGuard guard(s);
    check_router(a.tokens, a.num_experts, a.top_k);
    StreamResources& res = stream_resources(s);
    const std::size_t need = (2 * static_cast<std::size_t>(a.num_experts) + 1) * sizeof(double);
    SCMOE_CHECK(need <= kScratchBytes, "router: " << a.num_experts << " experts exceed the per-stream scratch");
    auto* routed = static_cast<double*>(res.scratch);
    double* prob_sum = routed + a.num_experts;
    double* z_sum = prob_sum + a.num_experts;
    if (a.tokens > 0) {
        router_token_kernel<<<blocks_for(a.tokens, kTokenThreads, INT_MAX), kTokenThreads, 0, s>>>(a);
        SCMOE_CUDA_CHECK_LAUNCH("router_token_kernel");
    }
    router_stats_kernel<<<a.num_experts + 1, kReduceThreads, 0, s>>>(a, routed, prob_sum, z_sum);
    SCMOE_CUDA_CHECK_LAUNCH("router_stats_kernel");
    router_losses_kernel<<<1, 32, 0, s>>>(a, routed, prob_sum, z_sum);
    SCMOE_CUDA_CHECK_LAUNCH("router_losses_kernel");
}

void router_backward(const RouterBackwardArgs& a, void* stream) {
    cudaStream_t s = as_stream(stream);
    StreamDeviceGuard guard(s);
    check_router(a.tokens, a.num_experts, a.top_k);
    if (a.tokens == 0) return;
    dispatch_float_dtype(a.grad_dtype, "router backward", [&](auto tag) {
        using G = decltype(tag);
        router_backward_kernel<G><<<blocks_for(a.tokens, kTokenThreads, INT_MAX), kTokenThreads, 0, s>>>(a);
        SCMOE_CUDA_CHECK_LAUNCH("router_backward_kernel");
    });
}

}  // namespace scmoe::cuda
