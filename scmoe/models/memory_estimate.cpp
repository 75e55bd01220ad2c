#include "scmoe/models/memory_estimate.h"

#include <algorithm>
#include <cstdio>

#include "scmoe/moe/block_stack.h"

namespace scmoe::models {

std::string format_bytes(double bytes) {
    static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    int unit = 0;
    while (bytes >= 1024.0 && unit < 6) bytes /= 1024.0, ++unit;
    char text[64];
    std::snprintf(text, sizeof text, unit == 0 ? "%.0f %s" : "%.1f %s", bytes, kUnits[unit]);
    return text;
}

std::string TrainMemoryEstimate::describe() const {
    char count[32];
    std::snprintf(count, sizeof count, "%.3g", params);
    return std::string(count) + " parameters on the rank with their gradients and AdamW moments " +
           format_bytes(param_bytes) + ", activations at least " + format_bytes(activation_bytes) + ", token batches " +
           format_bytes(batch_bytes);
}

TrainMemoryEstimate estimate_train_memory(const TrainConfig& config, int ep, bool training) {
    const LmConfig& m = config.model;
    const auto h = static_cast<double>(std::max<std::int64_t>(m.backbone.hidden, 0));
    const auto seq = static_cast<double>(std::max<std::int64_t>(m.backbone.seq_len, 0));
    const auto vocab = static_cast<double>(std::max<std::int64_t>(m.vocab, 0));
    const auto dense_ffn = static_cast<double>(std::max<std::int64_t>(m.backbone.ffn, 0));
    const auto expert_ffn = static_cast<double>(std::max<std::int64_t>(m.moe.ffn, 0));
    const double experts = std::max(m.moe.num_experts, 0), local_experts = experts / std::max(ep, 1);
    const auto layers = static_cast<double>(std::max<std::int64_t>(m.layers, 0));
    // The blocks that are MoE: the variant's layout when it is a valid one, else every other block.
    double moe_blocks = layers / 2;
    try {
        const BlockStackConfig stack = m.block_stack();
        moe_blocks = static_cast<double>(std::count_if(stack.blocks.begin(), stack.blocks.end(),
                                                       [](const BlockSpec& b) { return b.ffn == FfnKind::kMoe; }));
    } catch (const std::exception&) {
    }
    const double dense_blocks = layers - moe_blocks;
    // Attention (wqkv, wo) in every block; a dense MLP (two matrices at least) or the rank's experts
    // plus the router; the embedding. Norms and biases are left out (a lower bound).
    TrainMemoryEstimate e;
    // wqkv is [h, (heads + 2 kv_heads) * head_dim]: 3h wide without GQA.
    const double qkv_width =
        m.backbone.heads > 0 && m.backbone.hidden % m.backbone.heads == 0 && m.backbone.kv_heads >= 0
            ? static_cast<double>(backbone_qkv_width(m.backbone))
            : 3 * h;
    e.params = layers * (qkv_width + h) * h + dense_blocks * 2 * h * dense_ffn +
               moe_blocks * (local_experts * 2 * h * expert_ffn + h * experts) + vocab * h;
    const auto param_size = static_cast<double>(dtype_size(m.backbone.dtype));
    // Training: the weights, their gradients and AdamW's two f32 moments.
    e.param_bytes = e.params * (training ? 2 * param_size + 8 : param_size);
    const double tokens = static_cast<double>(std::max<std::int64_t>(config.batch, 0)) * seq;
    // The backward reads each block's input and its attention output ([tokens, hidden] each) and the
    // logits ([tokens, vocab]) with their gradient; forward only: one block's and the logits.
    e.activation_bytes = tokens * param_size * ((training ? layers : 1) * 2 * h + 2 * vocab);
    e.batch_bytes = tokens * 2 * 4;
    return e;
}

}  // namespace scmoe::models
