#include "scmoe/kernels/adamw.h"

#include <cmath>

#include "scmoe/kernels/error.h"

namespace scmoe {

void check_adamw_args(const AdamWArgs& a) {
    SCMOE_CHECK(a.n >= 0, "adamw_step: n must be >= 0, got " << a.n);
    SCMOE_CHECK(a.step >= 1, "adamw_step: step is 1-based, got " << a.step);
    SCMOE_CHECK(std::isfinite(a.lr) && a.lr >= 0.0f, "adamw_step: lr must be finite and >= 0, got " << a.lr);
    SCMOE_CHECK(a.beta1 >= 0.0f && a.beta1 < 1.0f, "adamw_step: beta1 must be in [0, 1), got " << a.beta1);
    SCMOE_CHECK(a.beta2 >= 0.0f && a.beta2 < 1.0f, "adamw_step: beta2 must be in [0, 1), got " << a.beta2);
    SCMOE_CHECK(std::isfinite(a.eps) && a.eps > 0.0f, "adamw_step: eps must be finite and > 0, got " << a.eps);
    SCMOE_CHECK(std::isfinite(a.weight_decay) && a.weight_decay >= 0.0f,
                "adamw_step: weight_decay must be finite and >= 0, got " << a.weight_decay);
    SCMOE_CHECK(std::isfinite(a.grad_scale) && a.grad_scale >= 0.0f,
                "adamw_step: grad_scale must be finite and >= 0, got " << a.grad_scale);
    SCMOE_CHECK(a.param_dtype == DType::kF32 || a.param_dtype == DType::kBF16,
                "adamw_step: param_dtype must be f32 or bf16, got " << dtype_name(a.param_dtype));
    if (a.n > 0) {
        SCMOE_CHECK(a.grad && a.master && a.m && a.v, "adamw_step: grad, master, m and v must not be null");
    }
}

float adamw_bias_correction(float beta, std::int64_t step) {
    return static_cast<float>(1.0 - std::pow(static_cast<double>(beta), static_cast<double>(step)));
}

}  // namespace scmoe
