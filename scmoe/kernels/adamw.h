// The optimizer's device ops: one AdamW step over a flat f32 array of master weights (decoupled
// weight decay, bias correction, a gradient scale for clipping, an optional copy of the updated
// weights in the compute dtype), and a deterministic sum of squares for the global gradient norm.
// Per-element arithmetic is math::adamw_update (scmoe/kernels/math.h) on both backends: a CUDA step
// reproduces the CPU step bit for bit.
#pragma once

#include <cstddef>
#include <cstdint>

#include "scmoe/kernels/device.h"
#include "scmoe/kernels/dtype.h"
#include "scmoe/kernels/op_cost.h"

namespace scmoe {

// For i in [0, n), with g = grad[i] * grad_scale and t = step:
//   m = beta1 m + (1 - beta1) g;   v = beta2 v + (1 - beta2) g^2
//   master -= lr * ((m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps) + weight_decay * master)
//   param = master rounded to param_dtype (bf16: round-to-nearest-even), when param is set.
// The bias corrections are computed once on the host in double. All arrays are stream memory of
// the stream's device.
struct AdamWArgs {
    std::int64_t n = 0;          // elements, >= 0 (0: nothing to do)
    float lr = 0.0f;             // learning rate, finite and >= 0
    float beta1 = 0.9f;          // in [0, 1)
    float beta2 = 0.95f;         // in [0, 1)
    float eps = 1e-8f;           // > 0
    float weight_decay = 0.0f;   // decoupled (AdamW), >= 0
    std::int64_t step = 1;       // 1-based step number, for bias correction; >= 1
    float grad_scale = 1.0f;     // multiplies the gradient first (clipping: min(1, max_norm / norm)); finite, >= 0
    const float* grad = nullptr;           // [n] f32
    float* master = nullptr;               // [n] f32 master weights, updated in place
    float* m = nullptr;                    // [n] f32 first moment, updated in place
    float* v = nullptr;                    // [n] f32 second moment, updated in place
    void* param = nullptr;                 // optional [n] copy of master in param_dtype, overwritten
    DType param_dtype = DType::kF32;       // f32 or bf16 (on both backends)
};
void adamw_step(const AdamWArgs& args, Stream& stream);

// Reads grad, master, m, v; writes master, m, v and the optional low-precision copy.
inline OpCost op_cost(const AdamWArgs& a) {
    return elementwise_cost(4 * a.n, 3 * a.n, DType::kF32, 12.0) +
           elementwise_cost(0, a.param ? a.n : 0, a.param_dtype, 0.0);
}

// Throws scmoe::Error naming the first invalid argument. adamw_step calls it before enqueueing.
void check_adamw_args(const AdamWArgs& args);

// 1 - beta^step in double, rounded once to f32: the bias correction both backends divide by.
float adamw_bias_correction(float beta, std::int64_t step);

// Bytes of scratch sum_of_squares needs: kSumOfSquaresPartials per-block partials in double,
// independent of n.
inline constexpr std::int64_t kSumOfSquaresPartials = 1024;
constexpr std::size_t sum_of_squares_scratch_bytes() { return kSumOfSquaresPartials * sizeof(double); }

// *out = sum_i x[i]^2 over n >= 0 f32 values (stream memory, overwritten; 0 for n = 0). Accumulated
// in double and rounded once to f32, in a fixed order that does not depend on scheduling (no
// atomics): the same input gives the same bits on every run. The order differs between CPU (one
// sequential pass) and CUDA (fixed grid of partials, then one block sums them in order), so the
// two backends agree to rounding, not bitwise. `scratch`: sum_of_squares_scratch_bytes() of
// stream memory (256-byte aligned, as Device::allocate returns), required on every backend.
void sum_of_squares(const float* x, std::int64_t n, float* out, void* scratch, Stream& stream);
inline OpCost sum_of_squares_cost(std::int64_t n) { return elementwise_cost(n, 1, DType::kF32, 2.0); }

}  // namespace scmoe
