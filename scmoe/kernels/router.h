// Router: softmax over gate logits, optional noisy gate, top-k (1 <= k <= min(E, kMaxTopK)),
// load-balancing aux loss and router z-loss, and their backward.
//
// Gate weights: k = 1 -> w = p[e1]; k >= 2 -> the k probabilities renormalised to sum to 1.
// The k choices are distinct experts in rank order (higher probability first); ties go to the lower
// expert index.
// Aux loss (Switch/GShard): aux = E * sum_e f_e * P_e, f_e = share of the T*k assignments routed to
//   e (not differentiable), P_e = mean_t p[t, e].
// z-loss (ST-MoE): z = mean_t logsumexp(logits_t)^2.
// With noise_std > 0 the logits get noise_std * N(0, 1) added before softmax; losses and gradients
// are taken on the noisy logits. The noise is counter-based: logit (t, e) gets
//   noise_std * math::normal_sample(math::noise_key(noise_seed, noise_stream, noise_step), t * E + e)
// (scmoe/kernels/math.h), the same bits on every backend; a new (stream, step) gives independent noise.
#pragma once

#include <cstdint>

#include "scmoe/kernels/device.h"
#include "scmoe/kernels/dtype.h"
#include "scmoe/kernels/op_cost.h"

namespace scmoe {

// Most experts one token is routed to: a per-token array bound of the router kernels (the CUDA
// kernels hold a token's choices in registers). MoeConfig::validate refuses more.
inline constexpr int kMaxTopK = 8;

// Throws naming the value unless 1 <= top_k <= min(num_experts, kMaxTopK); `what` names the caller.
void check_router_top_k(const char* what, int top_k, int num_experts);

struct RouterForwardArgs {
    std::int64_t tokens = 0;
    int num_experts = 0;
    int top_k = 1;
    float noise_std = 0.0f;
    std::uint64_t noise_seed = 0;
    std::uint64_t noise_stream = 0;  // e.g. the rank: ranks draw different noise
    std::uint64_t noise_step = 0;    // e.g. the training step: every step draws fresh noise
    const float* logits = nullptr;     // [tokens, experts] f32
    float* probs = nullptr;            // [tokens, experts] f32 out: softmax (saved for backward)
    float* logsumexp = nullptr;        // [tokens] f32 out (saved for backward)
    std::int32_t* expert_index = nullptr;  // [tokens, top_k] out
    float* gate_weight = nullptr;      // [tokens, top_k] f32 out
    float* expert_fraction = nullptr;  // [experts] f32 out: f_e
    float* losses = nullptr;           // [2] f32 out: {aux, z}
};

void router_forward(const RouterForwardArgs& args, Stream& stream);

// Reads the f32 logits; writes probs, logsumexp, the top-k choices and gates (f32 and int32).
inline OpCost op_cost(const RouterForwardArgs& a) {
    const std::int64_t te = a.tokens * a.num_experts, tk = a.tokens * a.top_k;
    OpCost c = elementwise_cost(te, te + a.tokens + 2 * tk, DType::kF32, 8.0);
    c.threads = static_cast<double>(a.tokens);
    return c;
}

struct RouterBackwardArgs {
    std::int64_t tokens = 0;
    int num_experts = 0;
    int top_k = 1;
    float aux_loss_coef = 0.0f;        // d total_loss / d aux
    float z_loss_coef = 0.0f;          // d total_loss / d z
    const float* probs = nullptr;
    const float* logsumexp = nullptr;
    const std::int32_t* expert_index = nullptr;
    const float* expert_fraction = nullptr;
    const float* grad_gate_weight = nullptr;  // [tokens, top_k] f32
    void* grad_logits = nullptr;       // [tokens, experts] out, in grad_dtype
    DType grad_dtype = DType::kF32;
};

void router_backward(const RouterBackwardArgs& args, Stream& stream);

inline OpCost op_cost(const RouterBackwardArgs& a) {
    const std::int64_t te = a.tokens * a.num_experts, tk = a.tokens * a.top_k;
    OpCost c = elementwise_cost(te + a.tokens + 2 * tk, 0, DType::kF32) + elementwise_cost(0, te, a.grad_dtype, 8.0);
    c.threads = static_cast<double>(a.tokens);
    return c;
}

}  // namespace scmoe
