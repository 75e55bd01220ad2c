#include "moe_reference.h"

#include <stdexcept>

namespace scmoe_example {

ReferenceOutput reference_forward(const scmoe::MoeConfig& config, const at::Tensor& x, const at::Tensor& gate_w,
                                  const at::Tensor& expert_w1, const at::Tensor& expert_w2) {
    if (config.dispatch != scmoe::DispatchMode::kDropless)
        throw std::invalid_argument("reference_forward: only dropless dispatch (capacity drops are not modeled)");
    if (config.noise_std != 0.0f || config.shared_expert || config.coefficient_gate)
        throw std::invalid_argument("reference_forward: no noisy gate, shared expert or coefficient gate");
    const std::int64_t T = x.size(0), E = config.num_experts, K = config.top_k, F = config.ffn;

    const at::Tensor logits = x.matmul(gate_w);
    const at::Tensor probs = at::softmax(logits, -1);
    // A stable descending sort keeps the lower expert first among equal probabilities, as scmoe's router.
    const auto [sorted, order] = at::sort(probs, /*stable=*/true, /*dim=*/-1, /*descending=*/true);
    const at::Tensor top_p = sorted.narrow(-1, 0, K);
    const at::Tensor expert_index = order.narrow(-1, 0, K);
    const at::Tensor weight = K == 1 ? top_p : top_p / top_p.sum(-1, /*keepdim=*/true);

    at::Tensor y = at::zeros_like(x);
    for (std::int64_t e = 0; e < E; ++e) {
        const at::Tensor hits = (expert_index == e).nonzero();  // [n, 2]: (token, choice)
        if (hits.size(0) == 0) continue;
        const at::Tensor token = hits.select(1, 0), choice = hits.select(1, 1);
        const at::Tensor h = x.index_select(0, token).matmul(expert_w1[e]);
        const at::Tensor a = config.activation == scmoe::Activation::kSwiGLU
                                 ? at::silu(h.narrow(1, 0, F)) * h.narrow(1, F, F)
                                 : at::gelu(h, "tanh");
        const at::Tensor w = weight.index({token, choice}).unsqueeze(1);
        y = y.index_add(0, token, a.matmul(expert_w2[e]) * w);
    }

    const at::Tensor routed_share =
        at::bincount(expert_index.flatten(), /*weights=*/{}, E).to(x.scalar_type()) / static_cast<double>(T * K);
    const at::Tensor aux = static_cast<double>(E) * (routed_share * probs.mean(0)).sum();
    const at::Tensor z = at::logsumexp(logits, -1).pow(2).mean();
    return {y, aux, z, expert_index};
}

}  // namespace scmoe_example
