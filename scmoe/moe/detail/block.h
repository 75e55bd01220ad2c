// Private: one block of a BlockStack — its sublayers and its MoE activation buffers.
#pragma once

#include <cstddef>
#include <memory>

#include "scmoe/moe/backbone.h"
#include "scmoe/moe/block_stack.h"
#include "scmoe/moe/moe_layer.h"

namespace scmoe {

struct BlockStack::Block {
    BlockSpec spec;
    std::size_t param_offset = 0;  // first of this block's tensors in the backbone ParamSet
    std::unique_ptr<AttentionSublayer> attn;
    std::unique_ptr<MlpSublayer> mlp;                // dense blocks
    std::unique_ptr<NormSublayer> norm_x, norm_s;    // MoE blocks (norm_s only with a shortcut)
    std::unique_ptr<MoeLayer> moe;
    int moe_index = -1;                              // into moe_params_ / moe_grads_
    // MoE blocks, [max_tokens, hidden] each: x = RMSNorm_x(H^MH), s = RMSNorm_s(S), y = the MoE's
    // output, and the gradients of x and s.
    void *x = nullptr, *s = nullptr, *y = nullptr, *grad_x = nullptr, *grad_s = nullptr;
};

}  // namespace scmoe
