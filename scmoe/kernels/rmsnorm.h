// RMSNorm over the hidden dimension (pre-norm transformer blocks), forward and backward:
//   rstd[t] = 1 / sqrt(mean_h(x[t, h]^2) + eps),   y[t, h] = x[t, h] * rstd[t] * weight[h].
// CPU: f32 only. CUDA: f32 or bf16 storage with fp32 accumulation; rstd and grad_weight are f32 on
// both. Every reduction runs in a fixed order (no atomics): results are bitwise reproducible.
#pragma once

#include <cstdint>

#include "scmoe/kernels/device.h"
#include "scmoe/kernels/dtype.h"
#include "scmoe/kernels/op_cost.h"

namespace scmoe {

struct RmsNormArgs {
    std::int64_t tokens = 0, hidden = 0;  // both > 0
    float eps = 1e-5f;                    // >= 0
    DType dtype = DType::kF32;            // of x, weight and y
    const void* x = nullptr;              // [tokens, hidden]
    const void* weight = nullptr;         // [hidden]
    void* y = nullptr;                    // [tokens, hidden] out; may be x itself (in place)
    float* rstd = nullptr;                // [tokens] f32 out, kept for backward; null: not stored (inference)
};
void rmsnorm_forward(const RmsNormArgs& args, Stream& stream);

inline OpCost op_cost(const RmsNormArgs& a) {
    const std::int64_t th = a.tokens * a.hidden;
    return elementwise_cost(th + a.hidden, th, a.dtype, 4.0) + elementwise_cost(0, a.rstd ? a.tokens : 0, DType::kF32);
}

struct RmsNormBackwardArgs {
    std::int64_t tokens = 0, hidden = 0;
    float eps = 1e-5f;  // as in forward (rstd already holds it; kept for symmetry and checks)
    DType dtype = DType::kF32;
    const void* x = nullptr;       // [tokens, hidden] forward input
    const void* weight = nullptr;  // [hidden]
    const float* rstd = nullptr;   // [tokens] f32, from rmsnorm_forward
    const void* grad_y = nullptr;  // [tokens, hidden]
    void* grad_x = nullptr;        // [tokens, hidden] out; must not overlap x or grad_y
    bool accumulate = false;       // true: grad_x += dL/dx (residual paths); false: grad_x = dL/dx
    float* grad_weight = nullptr;  // [hidden] f32 out, overwritten (never accumulated); null: not computed
};
void rmsnorm_backward(const RmsNormBackwardArgs& args, Stream& stream);

inline OpCost op_cost(const RmsNormBackwardArgs& a) {
    const std::int64_t th = a.tokens * a.hidden;
    return elementwise_cost(2 * th + a.hidden + (a.accumulate ? th : 0), th, a.dtype, 8.0) +
           elementwise_cost(a.tokens, a.grad_weight ? a.hidden : 0, DType::kF32);
}

// Throw scmoe::Error naming the first invalid argument (non-positive size, negative eps, null
// pointer, dtype the backend does not compute in). The ops call them before enqueueing anything.
void check_rmsnorm_args(const RmsNormArgs& args, Backend backend);
void check_rmsnorm_backward_args(const RmsNormBackwardArgs& args, Backend backend);

}  // namespace scmoe
