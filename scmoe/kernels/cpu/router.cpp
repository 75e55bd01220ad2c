#include <cmath>
#include <vector>

#include "scmoe/kernels/cpu/cpu_ops.h"
#include "scmoe/kernels/error.h"
#include "scmoe/kernels/math.h"

namespace scmoe::cpu {

void router_forward(const RouterForwardArgs& a) {
    const int E = a.num_experts, K = a.top_k;
    check_router_top_k("router", K, E);
    std::vector<double> routed(static_cast<std::size_t>(E), 0.0), mean_prob(static_cast<std::size_t>(E), 0.0);
    double z_sum = 0.0;
    const std::uint64_t noise_key = math::noise_key(a.noise_seed, a.noise_stream, a.noise_step);
    for (std::int64_t t = 0; t < a.tokens; ++t) {
        const float* logit = a.logits + t * E;
        float* p = a.probs + t * E;
        for (int e = 0; e < E; ++e) {
            float v = logit[e];
            if (a.noise_std > 0.0f)
                v += a.noise_std * math::normal_sample(noise_key, static_cast<std::uint64_t>(t * E + e));
            p[e] = v;
        }
        int best[kMaxTopK];
        float weight[kMaxTopK];
        const float lse = math::route_token(p, E, K, best, weight);
        a.logsumexp[t] = lse;
        z_sum += static_cast<double>(lse) * lse;
        for (int j = 0; j < K; ++j) {
            a.expert_index[t * K + j] = best[j];
            a.gate_weight[t * K + j] = weight[j];
            routed[static_cast<std::size_t>(best[j])] += 1.0;
        }
        for (int e = 0; e < E; ++e) mean_prob[static_cast<std::size_t>(e)] += p[e];
    }
    double aux = 0.0;
    for (int e = 0; e < E; ++e) {
        const double f = a.tokens ? routed[static_cast<std::size_t>(e)] / (static_cast<double>(a.tokens) * K) : 0.0;
        const double P = a.tokens ? mean_prob[static_cast<std::size_t>(e)] / static_cast<double>(a.tokens) : 0.0;
        a.expert_fraction[e] = static_cast<float>(f);
        aux += f * P;
    }
    a.losses[0] = static_cast<float>(aux * E);
    a.losses[1] = a.tokens ? static_cast<float>(z_sum / static_cast<double>(a.tokens)) : 0.0f;
}

void router_backward(const RouterBackwardArgs& a) {
    SCMOE_CHECK(a.grad_dtype == DType::kF32, "CPU router backward writes f32 gradients only");
    const int E = a.num_experts, K = a.top_k;
    check_router_top_k("router backward", K, E);
    const float inv_t = a.tokens ? 1.0f / static_cast<float>(a.tokens) : 0.0f;
    std::vector<float> dp(static_cast<std::size_t>(E));
    for (std::int64_t t = 0; t < a.tokens; ++t) {
        const float* p = a.probs + t * E;
        for (int e = 0; e < E; ++e) dp[static_cast<std::size_t>(e)] = a.aux_loss_coef * static_cast<float>(E) * a.expert_fraction[e] * inv_t;
        const std::int32_t* idx = a.expert_index + t * K;
        const float* gw = a.grad_gate_weight + t * K;
        float dp_chosen[kMaxTopK];
        math::gate_weight_backward(p, idx, gw, K, dp_chosen);
        for (int j = 0; j < K; ++j) dp[static_cast<std::size_t>(idx[j])] += dp_chosen[j];
        float dot_pp = 0.0f;
        for (int e = 0; e < E; ++e) dot_pp += dp[static_cast<std::size_t>(e)] * p[e];
        const float dz = a.z_loss_coef * 2.0f * a.logsumexp[t] * inv_t;
        float* g = static_cast<float*>(a.grad_logits) + t * E;
        for (int e = 0; e < E; ++e) g[e] = p[e] * (dp[static_cast<std::size_t>(e)] - dot_pp) + dz * p[e];
    }
}

}  // namespace scmoe::cpu
