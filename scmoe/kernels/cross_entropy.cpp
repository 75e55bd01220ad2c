#include "scmoe/kernels/cross_entropy.h"

#include <cmath>

#include "scmoe/kernels/error.h"

namespace scmoe {

void check_cross_entropy_args(const CrossEntropyArgs& a, Backend backend) {
    SCMOE_CHECK(a.tokens > 0 && a.vocab > 0,
                "cross_entropy: tokens and vocab must be positive, got tokens=" << a.tokens << " vocab=" << a.vocab);
    SCMOE_CHECK(a.dtype == DType::kF32 || (a.dtype == DType::kBF16 && backend != Backend::kCpu),
                "cross_entropy: dtype " << dtype_name(a.dtype) << " not supported on " << backend_name(backend)
                                        << " (CPU: f32; CUDA: f32 or bf16)");
    SCMOE_CHECK(a.logits && a.targets && a.loss, "cross_entropy: logits, targets and loss must not be null");
    SCMOE_CHECK(std::isfinite(a.grad_scale), "cross_entropy: grad_scale must be finite, got " << a.grad_scale);
    SCMOE_CHECK(static_cast<const void*>(a.loss) != a.logits && static_cast<void*>(a.loss) != a.grad_logits,
                "cross_entropy: loss must not alias logits or grad_logits");
}

}  // namespace scmoe
