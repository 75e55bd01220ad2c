// Layout: where every (token, choice) assignment goes in the expert-major permuted buffer.
//
// Order inside an expert: all first choices in token order, then all second choices (GShard
// priority), so under capacity the first choices win. Deterministic on every backend.
//   capacity > 0 (capacity mode): expert e owns rows [e*C, (e+1)*C); assignments past C are
//     dropped (slot -1) and counted; rows = E*C.
//   capacity == 0 (dropless): group_offsets are the prefix sums of the counts; rows = T*k.
#pragma once

#include <cstdint>

#include "scmoe/kernels/device.h"
#include "scmoe/kernels/op_cost.h"

namespace scmoe {

// Capacity C = ceil(capacity_factor * tokens * top_k / experts), at least 1 and at most `tokens` (an
// expert receives one row per token at most) when tokens > 0.
std::int64_t expert_capacity(std::int64_t tokens, int num_experts, int top_k, float capacity_factor);
// Rows of the permuted buffer: E*C in capacity mode, T*k dropless.
std::int64_t permuted_rows(std::int64_t tokens, int num_experts, int top_k, std::int64_t capacity);

struct LayoutArgs {
    std::int64_t tokens = 0;
    int num_experts = 0;
    int top_k = 1;
    std::int64_t capacity = 0;               // 0 = dropless
    const std::int32_t* expert_index = nullptr;  // [tokens, top_k]
    std::int32_t* expert_counts = nullptr;   // [experts] out: assignments routed to e (before capacity)
    std::int32_t* group_offsets = nullptr;   // [experts + 1] out: row offsets in the permuted buffer
    std::int32_t* slot_of_choice = nullptr;  // [tokens, top_k] out: row, or -1 if dropped
    std::int32_t* choice_of_row = nullptr;   // [rows] out: t*top_k + j, or -1 for an empty row
    std::int32_t* dropped = nullptr;         // [1] out: assignments dropped for capacity
};

void compute_layout(const LayoutArgs& args, Stream& stream);

// A scan over the T*k choices per expert (one block per expert; scmoe/kernels/cuda/layout.cu).
inline OpCost op_cost(const LayoutArgs& a) {
    const std::int64_t tk = a.tokens * a.top_k;
    const std::int64_t rows = permuted_rows(a.tokens, a.num_experts, a.top_k, a.capacity);
    OpCost c = elementwise_cost(tk * a.num_experts, 2 * tk + rows + a.num_experts, DType::kI32);
    c.threads = 256.0 * a.num_experts;
    return c;
}

}  // namespace scmoe
