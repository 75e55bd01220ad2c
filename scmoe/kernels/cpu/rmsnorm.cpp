// RMSNorm on the CPU: one pass per token, grad_weight summed over tokens in token order.
#include "scmoe/kernels/cpu/cpu_ops.h"
#include "scmoe/kernels/error.h"
#include "scmoe/kernels/math.h"

namespace scmoe::cpu {

void rmsnorm_forward(const RmsNormArgs& a) {
    SCMOE_CHECK(a.dtype == DType::kF32, "rmsnorm_forward: CPU computes in f32 only");
    const auto* x = static_cast<const float*>(a.x);
    const auto* w = static_cast<const float*>(a.weight);
    auto* y = static_cast<float*>(a.y);
    for (std::int64_t t = 0; t < a.tokens; ++t) {
        const float* xt = x + t * a.hidden;
        float sum_sq = 0.0f;
        for (std::int64_t h = 0; h < a.hidden; ++h) sum_sq += xt[h] * xt[h];
        const float rstd = math::rmsnorm_rstd(sum_sq, a.hidden, a.eps);
        if (a.rstd) a.rstd[t] = rstd;
        float* yt = y + t * a.hidden;  // may be xt: each element is read before it is written
        for (std::int64_t h = 0; h < a.hidden; ++h) yt[h] = math::rmsnorm_apply(xt[h], rstd, w[h]);
    }
}

void rmsnorm_backward(const RmsNormBackwardArgs& a) {
    SCMOE_CHECK(a.dtype == DType::kF32, "rmsnorm_backward: CPU computes in f32 only");
    const auto* x = static_cast<const float*>(a.x);
    const auto* w = static_cast<const float*>(a.weight);
    const auto* gy = static_cast<const float*>(a.grad_y);
    auto* gx = static_cast<float*>(a.grad_x);
    if (a.grad_weight) {
        for (std::int64_t h = 0; h < a.hidden; ++h) a.grad_weight[h] = 0.0f;
    }
    for (std::int64_t t = 0; t < a.tokens; ++t) {
        const float* xt = x + t * a.hidden;
        const float* gyt = gy + t * a.hidden;
        float* gxt = gx + t * a.hidden;
        const float rstd = a.rstd[t];
        float dot = 0.0f;
        for (std::int64_t h = 0; h < a.hidden; ++h) dot += gyt[h] * w[h] * xt[h];
        const float mean_gx = dot / static_cast<float>(a.hidden);
        for (std::int64_t h = 0; h < a.hidden; ++h) {
            const float g = math::rmsnorm_grad_x(gyt[h], w[h], xt[h], rstd, mean_gx);
            gxt[h] = a.accumulate ? gxt[h] + g : g;
        }
        if (a.grad_weight) {
            for (std::int64_t h = 0; h < a.hidden; ++h) a.grad_weight[h] += gyt[h] * xt[h] * rstd;
        }
    }
}

}  // namespace scmoe::cpu
