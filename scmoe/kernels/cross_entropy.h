// Softmax cross-entropy over the vocabulary, fused with its gradient (the LM loss):
//   loss[t] = logsumexp_v(logits[t, v]) - logits[t, targets[t]]
//   grad_logits[t, v] = grad_scale * (softmax(logits[t])[v] - [v == targets[t]])
// CPU: f32 only. CUDA: f32 or bf16 logits/grad_logits, fp32 math; loss is f32 on both. Per-row
// reductions run in a fixed order (no atomics): results are bitwise reproducible.
#pragma once

#include <cstdint>

#include "scmoe/kernels/device.h"
#include "scmoe/kernels/dtype.h"
#include "scmoe/kernels/op_cost.h"

namespace scmoe {

struct CrossEntropyArgs {
    std::int64_t tokens = 0, vocab = 0;     // both > 0
    DType dtype = DType::kF32;              // of logits and grad_logits
    const void* logits = nullptr;           // [tokens, vocab]
    const std::int32_t* targets = nullptr;  // [tokens], each in [0, vocab) (caller validates)
    float* loss = nullptr;                  // [tokens] f32 out
    void* grad_logits = nullptr;            // [tokens, vocab] out; null: loss only; may equal logits (in place)
    float grad_scale = 1.0f;                // e.g. 1 / (tokens over all ranks) for a mean loss
};
void cross_entropy(const CrossEntropyArgs& args, Stream& stream);

inline OpCost op_cost(const CrossEntropyArgs& a) {
    const std::int64_t tv = a.tokens * a.vocab;
    return elementwise_cost(tv, a.grad_logits ? tv : 0, a.dtype, 4.0) + elementwise_cost(a.tokens, a.tokens, DType::kF32);
}

void check_cross_entropy_args(const CrossEntropyArgs& args, Backend backend);

}  // namespace scmoe
