// Token + position embedding on the CPU. Every id is validated before anything is written, so a
// bad id leaves the outputs untouched; the gradient sums run over tokens in increasing order.
#include <algorithm>

#include "scmoe/kernels/cpu/cpu_ops.h"
#include "scmoe/kernels/error.h"

namespace scmoe::cpu {
namespace {

void check_ids(const char* op, const std::int32_t* ids, std::int64_t tokens, std::int64_t vocab) {
    for (std::int64_t t = 0; t < tokens; ++t) {
        SCMOE_CHECK(ids[t] >= 0 && ids[t] < vocab,
                    op << ": ids[" << t << "] = " << ids[t] << " is outside [0, vocab=" << vocab << ")");
    }
}

}  // namespace

void embedding_forward(const EmbeddingArgs& a) {
    SCMOE_CHECK(a.dtype == DType::kF32, "embedding_forward: CPU computes in f32 only");
    check_ids("embedding_forward", a.ids, a.tokens, a.vocab);
    const auto* table = static_cast<const float*>(a.table);
    const auto* positions = static_cast<const float*>(a.positions);
    auto* out = static_cast<float*>(a.out);
    for (std::int64_t t = 0; t < a.tokens; ++t) {
        const float* row = table + a.ids[t] * a.hidden;
        float* ot = out + t * a.hidden;
        if (positions) {
            const float* pos = positions + (t % a.seq_len) * a.hidden;
            for (std::int64_t h = 0; h < a.hidden; ++h) ot[h] = row[h] + pos[h];
        } else {
            std::copy(row, row + a.hidden, ot);
        }
    }
}

void embedding_backward(const EmbeddingBackwardArgs& a) {
    SCMOE_CHECK(a.dtype == DType::kF32, "embedding_backward: CPU computes in f32 only");
    check_ids("embedding_backward", a.ids, a.tokens, a.vocab);
    const auto* go = static_cast<const float*>(a.grad_out);
    // Each element's sum starts from its previous value (accumulate) or zero, then adds tokens in
    // increasing t: the order the CUDA kernels use, so f32 results agree bit for bit.
    if (a.grad_table) {
        if (!a.accumulate_table) std::fill(a.grad_table, a.grad_table + a.vocab * a.hidden, 0.0f);
        for (std::int64_t t = 0; t < a.tokens; ++t) {
            float* row = a.grad_table + a.ids[t] * a.hidden;
            const float* gt = go + t * a.hidden;
            for (std::int64_t h = 0; h < a.hidden; ++h) row[h] += gt[h];
        }
    }
    if (a.grad_positions) {
        std::fill(a.grad_positions, a.grad_positions + a.seq_len * a.hidden, 0.0f);
        for (std::int64_t t = 0; t < a.tokens; ++t) {
            float* row = a.grad_positions + (t % a.seq_len) * a.hidden;
            const float* gt = go + t * a.hidden;
            for (std::int64_t h = 0; h < a.hidden; ++h) row[h] += gt[h];
        }
    }
}

}  // namespace scmoe::cpu
