// Small elementwise ops the MoE layer needs around its GEMMs: the CG-1 coefficient gate, adds,
// and the non-finite input check.
#pragma once

#include <cstdint>

#include "scmoe/kernels/device.h"
#include "scmoe/kernels/dtype.h"
#include "scmoe/kernels/op_cost.h"

namespace scmoe {

// y[t] += c_t * branch[t] with c_t = sigmoid(gate_logit[t])  (CG-1), or c_t = 1 when gate_logit is null.
struct GatedAddArgs {
    std::int64_t tokens = 0, hidden = 0;
    DType dtype = DType::kF32;
    const float* gate_logit = nullptr;  // [tokens] or null (direct add)
    const void* branch = nullptr;       // [tokens, hidden]
    void* y = nullptr;                  // [tokens, hidden] in/out
};
void gated_add(const GatedAddArgs& args, Stream& stream);

inline OpCost op_cost(const GatedAddArgs& a) {
    const std::int64_t th = a.tokens * a.hidden;
    return elementwise_cost(2 * th, th, a.dtype, 2.0);
}

// grad_branch[t] = c_t * grad_y[t]; grad_gate_logit[t] = c_t (1 - c_t) <grad_y[t], branch[t]>.
struct GatedAddBackwardArgs {
    std::int64_t tokens = 0, hidden = 0;
    DType dtype = DType::kF32;
    const float* gate_logit = nullptr;  // [tokens] or null
    const void* branch = nullptr;       // [tokens, hidden]
    const void* grad_y = nullptr;       // [tokens, hidden]
    void* grad_branch = nullptr;        // [tokens, hidden] out
    void* grad_gate_logit = nullptr;    // [tokens] out in dtype (unused when gate_logit is null)
};
void gated_add_backward(const GatedAddBackwardArgs& args, Stream& stream);

inline OpCost op_cost(const GatedAddBackwardArgs& a) {
    const std::int64_t th = a.tokens * a.hidden;
    return elementwise_cost(2 * th, th + a.tokens, a.dtype, 4.0);
}

// Counts NaN/Inf among n elements into *count (stream memory, overwritten); records the first
// offending index into *first_index (-1 if none).
void count_nonfinite(const void* x, std::int64_t n, DType dtype, std::int64_t* count, std::int64_t* first_index,
                     Stream& stream);
inline OpCost count_nonfinite_cost(std::int64_t n, DType dtype) { return elementwise_cost(n, 0, dtype); }

// Converts n elements between dtypes (f32 <-> bf16, or a copy when equal), round-to-nearest-even.
void convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, std::int64_t n, Stream& stream);
inline OpCost convert_cost(DType src_dtype, DType dst_dtype, std::int64_t n) {
    return elementwise_cost(n, 0, src_dtype, 0.0) + elementwise_cost(0, n, dst_dtype, 0.0);
}

}  // namespace scmoe
