#include <algorithm>

#include "scmoe/kernels/cpu/cpu_ops.h"
#include "scmoe/kernels/error.h"
#include "scmoe/kernels/math.h"

namespace scmoe::cpu {

void activation_forward(const ActivationArgs& a) {
    SCMOE_CHECK(a.dtype == DType::kF32, "activation: CPU computes in f32 only");
    const std::int64_t width = activation_input_width(a.activation, a.ffn);
    const auto* h = static_cast<const float*>(a.h);
    auto* out = static_cast<float*>(a.out);
    const std::int64_t rows = a.num_rows ? std::min<std::int64_t>(*a.num_rows, a.rows) : a.rows;
    for (std::int64_t r = a.first_row ? std::max<std::int64_t>(*a.first_row, 0) : 0; r < rows; ++r) {
        const float* hr = h + r * width;
        float* o = out + r * a.ffn;
        if (a.activation == Activation::kSwiGLU) {
            for (std::int64_t f = 0; f < a.ffn; ++f) o[f] = math::swiglu(hr[f], hr[a.ffn + f]);
        } else {
            for (std::int64_t f = 0; f < a.ffn; ++f) o[f] = math::gelu(hr[f]);
        }
    }
}

void activation_backward(const ActivationBackwardArgs& a) {
    SCMOE_CHECK(a.dtype == DType::kF32, "activation backward: CPU computes in f32 only");
    const std::int64_t width = activation_input_width(a.activation, a.ffn);
    const auto* h = static_cast<const float*>(a.h);
    const auto* go = static_cast<const float*>(a.grad_out);
    auto* gh = static_cast<float*>(a.grad_h);
    const std::int64_t rows = a.num_rows ? std::min<std::int64_t>(*a.num_rows, a.rows) : a.rows;
    for (std::int64_t r = a.first_row ? std::max<std::int64_t>(*a.first_row, 0) : 0; r < rows; ++r) {
        const float* hr = h + r * width;
        const float* g = go + r * a.ffn;
        float* d = gh + r * width;
        if (a.activation == Activation::kSwiGLU) {
            for (std::int64_t f = 0; f < a.ffn; ++f) {
                d[f] = g[f] * math::swiglu_grad_gate(hr[f], hr[a.ffn + f]);
                d[a.ffn + f] = g[f] * math::swiglu_grad_up(hr[f]);
            }
        } else {
            for (std::int64_t f = 0; f < a.ffn; ++f) d[f] = g[f] * math::gelu_grad(hr[f]);
        }
    }
}

}  // namespace scmoe::cpu
