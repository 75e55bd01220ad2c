// The same MoE layer written with libtorch ops, differentiated by torch's autograd: the reference the
// example holds scmoe's MoeFunction to. Written from scmoe's documented semantics (scmoe/kernels/router.h,
// scmoe/kernels/activation.h, scmoe/moe/moe_layer.h), not from its code:
//   logits = x gate_w                      [T, E], f32
//   p      = softmax(logits)
//   top-k experts by p (ties to the lower index); gate weights: k = 1 -> p_e, k = 2 -> the two renormalised
//   y_t    = sum_j w_tj * W2_e (act(x_t W1_e)),  e = the token's j-th expert, every assignment kept (dropless)
//   act    = SwiGLU: silu(h[:, :F]) * h[:, F:]  |  GELU (tanh approximation)
//   aux    = E * sum_e f_e * P_e, f_e = share of the T*k assignments routed to e (no gradient), P_e = mean_t p_te
//   z      = mean_t logsumexp(logits_t)^2
#pragma once

#include <ATen/ATen.h>

#include "scmoe/moe/config.h"

namespace scmoe_example {

struct ReferenceOutput {
    at::Tensor y;             // [T, H]
    at::Tensor aux, z;        // scalars: the router losses, before their coefficients
    at::Tensor expert_index;  // [T, k] int64: the experts chosen, highest probability first
};

// Throws std::invalid_argument for what the reference does not cover: capacity dispatch (drops), a
// noisy gate, a shared expert or the coefficient gate.
ReferenceOutput reference_forward(const scmoe::MoeConfig& config, const at::Tensor& x, const at::Tensor& gate_w,
                                  const at::Tensor& expert_w1, const at::Tensor& expert_w2);

}  // namespace scmoe_example
