// Per-element math shared by the CPU and CUDA backends, so the CPU tests exercise the same
// arithmetic the GPU runs.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define SCMOE_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define SCMOE_HOST_DEVICE inline
#endif

namespace scmoe::math {

SCMOE_HOST_DEVICE float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// SiLU(g) * u and its derivatives.
SCMOE_HOST_DEVICE float swiglu(float g, float u) { return g * sigmoid(g) * u; }
SCMOE_HOST_DEVICE float swiglu_grad_gate(float g, float u) {
    float s = sigmoid(g);
    return u * s * (1.0f + g * (1.0f - s));
}
SCMOE_HOST_DEVICE float swiglu_grad_up(float g) { return g * sigmoid(g); }

// GELU, tanh approximation, and its derivative.
constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluA = 0.044715f;
SCMOE_HOST_DEVICE float gelu(float x) { return 0.5f * x * (1.0f + tanhf(kGeluC * (x + kGeluA * x * x * x))); }
SCMOE_HOST_DEVICE float gelu_grad(float x) {
    float inner = kGeluC * (x + kGeluA * x * x * x);
    float t = tanhf(inner);
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * kGeluC * (1.0f + 3.0f * kGeluA * x * x);
}

// RMSNorm: rstd = 1 / sqrt(mean(x^2) + eps) from a row's sum of squares; y = x * rstd * w.
SCMOE_HOST_DEVICE float rmsnorm_rstd(float sum_sq, std::int64_t hidden, float eps) {
    return 1.0f / sqrtf(sum_sq / static_cast<float>(hidden) + eps);
}
SCMOE_HOST_DEVICE float rmsnorm_apply(float x, float rstd, float w) { return x * rstd * w; }
// dL/dx_h = rstd * (g_h - x_h * rstd^2 * mean_k(g_k x_k)) with g = grad_y * w; `mean_gx` is that mean.
SCMOE_HOST_DEVICE float rmsnorm_grad_x(float grad_y, float w, float x, float rstd, float mean_gx) {
    return rstd * (grad_y * w - x * rstd * rstd * mean_gx);
}

// Scaled dot-product attention: scores are (q . k) * attention_scale(head_dim); a probability is
// recomputed in backward from the score and the row's log-sum-exp.
SCMOE_HOST_DEVICE float attention_scale(std::int64_t head_dim) { return 1.0f / sqrtf(static_cast<float>(head_dim)); }
SCMOE_HOST_DEVICE float attention_prob(float scaled_score, float lse) { return expf(scaled_score - lse); }

// bf16 <-> f32 with round-to-nearest-even (NaN kept quiet), bit-identical to __float2bfloat16_rn.
SCMOE_HOST_DEVICE std::uint16_t f32_to_bf16_bits(float f) {
    std::uint32_t u;
    memcpy(&u, &f, sizeof(u));
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return static_cast<std::uint16_t>(u >> 16);
}
SCMOE_HOST_DEVICE float bf16_bits_to_f32(std::uint16_t b) {
    std::uint32_t u = static_cast<std::uint32_t>(b) << 16;
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}
SCMOE_HOST_DEVICE float round_to_bf16(float f) { return bf16_bits_to_f32(f32_to_bf16_bits(f)); }

// IEEE single-precision operations that the compiler may not fuse or approximate (nvcc contracts
// a * b + c into an FMA by default; the host build does not): arithmetic written with these gives
// the same bits on the CPU and the GPU.
SCMOE_HOST_DEVICE float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}
SCMOE_HOST_DEVICE float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
    return __fadd_rn(a, b);
#else
    return a + b;
#endif
}
SCMOE_HOST_DEVICE float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
    return __fdiv_rn(a, b);
#else
    return a / b;
#endif
}
SCMOE_HOST_DEVICE float sqrt_rn(float a) {
#if defined(__CUDA_ARCH__)
    return __fsqrt_rn(a);
#else
    return sqrtf(a);
#endif
}

// One AdamW element (decoupled weight decay), in place on master, m and v:
//   g = grad * grad_scale;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   master -= lr * ((m / bc1) / (sqrt(v / bc2) + eps) + wd * master)
// bc1 = 1 - b1^step and bc2 = 1 - b2^step come precomputed (adamw_bias_correction). Every operation
// is rounded separately (no FMA), so both backends produce the same bits.
SCMOE_HOST_DEVICE void adamw_update(float grad, float grad_scale, float lr, float beta1, float beta2, float eps,
                                    float weight_decay, float bc1, float bc2, float& master, float& m, float& v) {
    const float g = mul_rn(grad, grad_scale);
    m = add_rn(mul_rn(beta1, m), mul_rn(1.0f - beta1, g));
    v = add_rn(mul_rn(beta2, v), mul_rn(1.0f - beta2, mul_rn(g, g)));
    const float m_hat = div_rn(m, bc1);
    const float v_hat = div_rn(v, bc2);
    const float update = add_rn(div_rn(m_hat, add_rn(sqrt_rn(v_hat), eps)), mul_rn(weight_decay, master));
    master = add_rn(master, -mul_rn(lr, update));
}

// Counter-based standard normal sample for the noisy gate: the same (seed, index) gives the same
// value on every backend, so noisy routing is reproducible.
SCMOE_HOST_DEVICE std::uint64_t splitmix64(std::uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}
// The seed of one forward's gate noise from the config's seed, a stream (e.g. the rank) and a step:
// each component passes through the bijective splitmix64 before the next is mixed in, so no
// arithmetic relation between (stream, step) pairs (stream + 1 vs step + 1, swapped values, ...)
// makes two keys equal.
SCMOE_HOST_DEVICE std::uint64_t noise_key(std::uint64_t seed, std::uint64_t stream, std::uint64_t step) {
    return splitmix64(splitmix64(splitmix64(seed) ^ stream) ^ step);
}
SCMOE_HOST_DEVICE float normal_sample(std::uint64_t seed, std::uint64_t index) {
    std::uint64_t r = splitmix64(seed ^ splitmix64(index));
    // Two 24-bit uniforms in (0, 1], Box-Muller.
    float u1 = (static_cast<float>(r >> 40) + 1.0f) * (1.0f / 16777216.0f);
    float u2 = (static_cast<float>((r >> 16) & 0xffffffu) + 1.0f) * (1.0f / 16777216.0f);
    return sqrtf(-2.0f * logf(u1)) * cosf(6.283185307179586f * u2);
}

// Top-k order: higher probability first; ties go to the lower expert index (deterministic).
SCMOE_HOST_DEVICE bool ranks_before(float p_a, int e_a, float p_b, int e_b) {
    return p_a > p_b || (p_a == p_b && e_a < e_b);
}

// One token's routing, in place: p [E] holds the (noisy) gate logits on entry and their softmax on
// exit. Writes the top-K experts (1 <= K <= E; in rank order: higher probability first, ties to the
// lower index) to best[K] and their gate weights to weight[K] (K = 1: the probability; K >= 2: the K
// probabilities renormalised to sum to 1, the denominator summed in rank order). Returns the
// logsumexp of the logits (for the z-loss).
SCMOE_HOST_DEVICE float route_token(float* p, int E, int K, int* best, float* weight) {
    float mx = -INFINITY;
    for (int e = 0; e < E; ++e) mx = fmaxf(mx, p[e]);
    float sum = 0.0f;
    for (int e = 0; e < E; ++e) {
        p[e] = expf(p[e] - mx);
        sum += p[e];
    }
    for (int e = 0; e < E; ++e) p[e] /= sum;
    for (int j = 0; j < K; ++j) {
        best[j] = -1;
        for (int e = 0; e < E; ++e) {
            bool taken = false;
            for (int i = 0; i < j; ++i) taken = taken || best[i] == e;
            if (taken) continue;
            if (best[j] < 0 || ranks_before(p[e], e, p[best[j]], best[j])) best[j] = e;
        }
    }
    float denom = 0.0f;
    for (int j = 0; j < K; ++j) denom += p[best[j]];
    for (int j = 0; j < K; ++j) weight[j] = K == 1 ? p[best[j]] : p[best[j]] / denom;
    return mx + logf(sum);
}

// The backward of route_token's gate weights for one token: dp[j] = d loss / d p[idx[j]] through
// the weights alone, from gw[j] = d loss / d weight[j]. K = 1: weight = p, so gw. K >= 2:
// w_j = p_j / s with s = sum_i p_i (rank order): gw_j / s - (sum_i gw_i p_i) / s^2.
SCMOE_HOST_DEVICE void gate_weight_backward(const float* p, const std::int32_t* idx, const float* gw, int K,
                                            float* dp) {
    if (K == 1) {
        dp[0] = gw[0];
        return;
    }
    float s = 0.0f, dot = 0.0f;
    for (int j = 0; j < K; ++j) {
        s += p[idx[j]];
        dot += gw[j] * p[idx[j]];
    }
    for (int j = 0; j < K; ++j) dp[j] = gw[j] / s - dot / (s * s);
}

}  // namespace scmoe::math
