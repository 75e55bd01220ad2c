#include <cstdint>

#include "scmoe/kernels/cpu/cpu_ops.h"
#include "scmoe/kernels/math.h"

namespace scmoe::cpu {

void adamw_step(const AdamWArgs& a) {
    const float bc1 = adamw_bias_correction(a.beta1, a.step);
    const float bc2 = adamw_bias_correction(a.beta2, a.step);
    for (std::int64_t i = 0; i < a.n; ++i) {
        math::adamw_update(a.grad[i], a.grad_scale, a.lr, a.beta1, a.beta2, a.eps, a.weight_decay, bc1, bc2,
                           a.master[i], a.m[i], a.v[i]);
    }
    if (!a.param) return;
    if (a.param_dtype == DType::kBF16) {
        auto* p = static_cast<std::uint16_t*>(a.param);
        for (std::int64_t i = 0; i < a.n; ++i) p[i] = math::f32_to_bf16_bits(a.master[i]);
    } else {
        auto* p = static_cast<float*>(a.param);
        for (std::int64_t i = 0; i < a.n; ++i) p[i] = a.master[i];
    }
}

void sum_of_squares(const float* x, std::int64_t n, float* out) {
    double sum = 0.0;
    for (std::int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i]) * x[i];
    *out = static_cast<float>(sum);
}

}  // namespace scmoe::cpu
