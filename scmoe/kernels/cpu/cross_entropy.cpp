// Softmax cross-entropy on the CPU, one row at a time: max, then sum of exponentials, both read
// before anything is written, so grad_logits may be logits itself. Every target is validated
// before anything is written.
#include <cmath>
#include <limits>

#include "scmoe/kernels/cpu/cpu_ops.h"
#include "scmoe/kernels/error.h"

namespace scmoe::cpu {

void cross_entropy(const CrossEntropyArgs& a) {
    SCMOE_CHECK(a.dtype == DType::kF32, "cross_entropy: CPU computes in f32 only");
    for (std::int64_t t = 0; t < a.tokens; ++t) {
        const std::int32_t target = a.targets[t];
        SCMOE_CHECK(target >= 0 && target < a.vocab,
                    "cross_entropy: targets[" << t << "] = " << target << " is outside [0, vocab=" << a.vocab << ")");
    }
    const auto* logits = static_cast<const float*>(a.logits);
    auto* grad = static_cast<float*>(a.grad_logits);
    for (std::int64_t t = 0; t < a.tokens; ++t) {
        const float* x = logits + t * a.vocab;
        float max = -std::numeric_limits<float>::infinity();
        bool finite = true;
        for (std::int64_t v = 0; v < a.vocab; ++v) {
            max = std::fmax(max, x[v]);
            finite = finite && std::isfinite(x[v]);
        }
        float sum = 0.0f;
        for (std::int64_t v = 0; v < a.vocab; ++v) sum += std::exp(x[v] - max);
        // fmax skips NaN and exp(-inf) is 0, so a NaN or -inf logit could leave the row finite: the
        // caller's overflow check relies on any non-finite logit making the loss non-finite.
        if (!finite) sum = std::numeric_limits<float>::quiet_NaN();
        const std::int32_t target = a.targets[t];
        a.loss[t] = max + std::log(sum) - x[target];
        if (!grad) continue;
        float* g = grad + t * a.vocab;  // may be x: each element is read before it is written
        for (std::int64_t v = 0; v < a.vocab; ++v) {
            const float p = std::exp(x[v] - max) / sum;
            g[v] = a.grad_scale * (v == target ? p - 1.0f : p);
        }
    }
}

}  // namespace scmoe::cpu
