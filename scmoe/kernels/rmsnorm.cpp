#include "scmoe/kernels/rmsnorm.h"

#include "scmoe/kernels/error.h"

namespace scmoe {
namespace {

void check_common(const char* op, std::int64_t tokens, std::int64_t hidden, float eps, DType dtype, Backend backend) {
    SCMOE_CHECK(tokens > 0 && hidden > 0,
                op << ": tokens and hidden must be positive, got tokens=" << tokens << " hidden=" << hidden);
    SCMOE_CHECK(eps >= 0.0f, op << ": eps must be >= 0, got " << eps);
    SCMOE_CHECK(dtype == DType::kF32 || (dtype == DType::kBF16 && backend != Backend::kCpu),
                op << ": dtype " << dtype_name(dtype) << " not supported on " << backend_name(backend)
                   << " (CPU: f32; CUDA: f32 or bf16)");
}

}  // namespace

void check_rmsnorm_args(const RmsNormArgs& a, Backend backend) {
    check_common("rmsnorm_forward", a.tokens, a.hidden, a.eps, a.dtype, backend);
    SCMOE_CHECK(a.x && a.weight && a.y, "rmsnorm_forward: x, weight and y must not be null");
}

void check_rmsnorm_backward_args(const RmsNormBackwardArgs& a, Backend backend) {
    check_common("rmsnorm_backward", a.tokens, a.hidden, a.eps, a.dtype, backend);
    SCMOE_CHECK(a.x && a.weight && a.rstd && a.grad_y && a.grad_x,
                "rmsnorm_backward: x, weight, rstd, grad_y and grad_x must not be null");
    SCMOE_CHECK(a.grad_x != a.grad_y && a.grad_x != a.x, "rmsnorm_backward: grad_x must not alias x or grad_y");
}

}  // namespace scmoe
