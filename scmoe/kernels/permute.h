// Permute (gather tokens into the expert-major buffer) and unpermute + weighted combine.
#pragma once

#include <cstdint>

#include "scmoe/kernels/device.h"
#include "scmoe/kernels/dtype.h"
#include "scmoe/kernels/op_cost.h"

namespace scmoe {

// xp[r] = x[choice_of_row[r] / top_k], or zeros where choice_of_row[r] == -1.
struct PermuteArgs {
    std::int64_t rows = 0, hidden = 0;
    int top_k = 1;
    DType dtype = DType::kF32;
    const void* x = nullptr;                  // [tokens, hidden]
    const std::int32_t* choice_of_row = nullptr;  // [rows]
    void* xp = nullptr;                       // [rows, hidden] out
    // x's rows, for the emulator's Tutel dispatch cost (emu/stack.h); last, so positional
    // initializers may leave it out.
    std::int64_t tokens = 0;
};
void permute(const PermuteArgs& args, Stream& stream);

inline OpCost op_cost(const PermuteArgs& a) { return elementwise_cost(a.rows * a.hidden, a.rows * a.hidden, a.dtype, 0.0); }

// grad_x[t] (+)= sum_j grad_xp[slot_of_choice[t, j]] over kept choices, j ascending.
struct PermuteBackwardArgs {
    std::int64_t tokens = 0, hidden = 0;
    int top_k = 1;
    bool accumulate = false;
    DType dtype = DType::kF32;
    const void* grad_xp = nullptr;                 // [rows, hidden]
    const std::int32_t* slot_of_choice = nullptr;  // [tokens, top_k]
    void* grad_x = nullptr;                        // [tokens, hidden] out
    // grad_xp's rows, for the emulator's Tutel dispatch cost (emu/stack.h); last, so positional
    // initializers may leave it out.
    std::int64_t rows = 0;
};
void permute_backward(const PermuteBackwardArgs& args, Stream& stream);

inline OpCost op_cost(const PermuteBackwardArgs& a) {
    const std::int64_t th = a.tokens * a.hidden;
    return elementwise_cost(th * a.top_k + (a.accumulate ? th : 0), th, a.dtype);
}

// y[t] (+)= sum_j gate_weight[t, j] * yp[slot_of_choice[t, j]] over kept choices, j ascending,
// accumulated in fp32.
struct CombineArgs {
    std::int64_t tokens = 0, hidden = 0;
    int top_k = 1;
    bool accumulate = false;
    DType dtype = DType::kF32;
    const void* yp = nullptr;                      // [rows, hidden]
    const std::int32_t* slot_of_choice = nullptr;  // [tokens, top_k]
    const float* gate_weight = nullptr;            // [tokens, top_k]
    void* y = nullptr;                             // [tokens, hidden] out
    // yp's rows, for the emulator's Tutel dispatch cost (emu/stack.h); last, so positional
    // initializers may leave it out.
    std::int64_t rows = 0;
};
void combine(const CombineArgs& args, Stream& stream);

inline OpCost op_cost(const CombineArgs& a) {
    const std::int64_t th = a.tokens * a.hidden;
    return elementwise_cost(th * a.top_k + (a.accumulate ? th : 0), th, a.dtype, 2.0 * a.top_k);
}

// grad_yp[r] = w * grad_y[t] for r = slot of (t, j), zeros for empty rows;
// grad_gate_weight[t, j] = <grad_y[t], yp[slot]>, 0 for dropped choices.
struct CombineBackwardArgs {
    std::int64_t tokens = 0, rows = 0, hidden = 0;
    int top_k = 1;
    DType dtype = DType::kF32;
    const void* grad_y = nullptr;                  // [tokens, hidden]
    const void* yp = nullptr;                      // [rows, hidden]
    const std::int32_t* slot_of_choice = nullptr;  // [tokens, top_k]
    const std::int32_t* choice_of_row = nullptr;   // [rows]
    const float* gate_weight = nullptr;            // [tokens, top_k]
    void* grad_yp = nullptr;                       // [rows, hidden] out
    float* grad_gate_weight = nullptr;             // [tokens, top_k] out
};
void combine_backward(const CombineBackwardArgs& args, Stream& stream);

inline OpCost op_cost(const CombineBackwardArgs& a) {
    const std::int64_t th = a.tokens * a.hidden, rh = a.rows * a.hidden;
    return elementwise_cost(th + rh, rh, a.dtype, 4.0);
}

}  // namespace scmoe
