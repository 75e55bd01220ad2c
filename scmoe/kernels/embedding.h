// Token + learned-position embedding for the language model, forward and backward:
//   out[t, h] = table[ids[t], h] + positions[t % seq_len, h]
// and the tied-table gradient grad_table[v, h] (+)= sum over t with ids[t] == v of grad_out[t, h],
// grad_positions[p, h] = sum over t with t % seq_len == p of grad_out[t, h].
// CPU: f32 only. CUDA: f32 or bf16 storage, f32 gradients with fp32 accumulation. Sums run over t in
// increasing order (no atomics): results are bitwise reproducible, run after run.
#pragma once

#include <cstdint>

#include "scmoe/kernels/device.h"
#include "scmoe/kernels/dtype.h"
#include "scmoe/kernels/op_cost.h"

namespace scmoe {

struct EmbeddingArgs {
    std::int64_t tokens = 0, hidden = 0, vocab = 0;  // all > 0
    std::int64_t seq_len = 0;       // > 0, tokens % seq_len == 0 (positions restart every sequence)
    DType dtype = DType::kF32;      // of table, positions and out
    const std::int32_t* ids = nullptr;  // [tokens] device memory, each in [0, vocab) (caller validates)
    const void* table = nullptr;        // [vocab, hidden]
    const void* positions = nullptr;    // [seq_len, hidden]; null: no position term
    void* out = nullptr;                // [tokens, hidden] out
};
void embedding_forward(const EmbeddingArgs& args, Stream& stream);

inline OpCost op_cost(const EmbeddingArgs& a) {
    const std::int64_t th = a.tokens * a.hidden;
    return elementwise_cost((a.positions ? 2 : 1) * th, th, a.dtype) + elementwise_cost(a.tokens, 0, DType::kI32);
}

struct EmbeddingBackwardArgs {
    std::int64_t tokens = 0, hidden = 0, vocab = 0, seq_len = 0;
    DType dtype = DType::kF32;          // of grad_out
    const std::int32_t* ids = nullptr;  // [tokens]
    const void* grad_out = nullptr;     // [tokens, hidden]
    float* grad_table = nullptr;        // [vocab, hidden] f32 out; null: not computed
    bool accumulate_table = false;      // true: grad_table += (the tied LM head wrote it first)
    float* grad_positions = nullptr;    // [seq_len, hidden] f32 out, overwritten; null: not computed
};
void embedding_backward(const EmbeddingBackwardArgs& args, Stream& stream);

inline OpCost op_cost(const EmbeddingBackwardArgs& a) {
    const std::int64_t th = a.tokens * a.hidden;
    return elementwise_cost(th, 0, a.dtype) +
           elementwise_cost(0, (a.grad_table ? th : 0) + (a.grad_positions ? a.seq_len * a.hidden : 0), DType::kF32);
}

void check_embedding_args(const EmbeddingArgs& args, Backend backend);
void check_embedding_backward_args(const EmbeddingBackwardArgs& args, Backend backend);

}  // namespace scmoe
