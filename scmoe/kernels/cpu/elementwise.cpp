#include <cmath>
#include <cstring>

#include "scmoe/kernels/cpu/cpu_ops.h"
#include "scmoe/kernels/error.h"
#include "scmoe/kernels/math.h"

namespace scmoe::cpu {

void gated_add(const GatedAddArgs& a) {
    SCMOE_CHECK(a.dtype == DType::kF32, "gated_add: CPU computes in f32 only");
    const auto* b = static_cast<const float*>(a.branch);
    auto* y = static_cast<float*>(a.y);
    for (std::int64_t t = 0; t < a.tokens; ++t) {
        const float c = a.gate_logit ? math::sigmoid(a.gate_logit[t]) : 1.0f;
        for (std::int64_t h = 0; h < a.hidden; ++h) y[t * a.hidden + h] += c * b[t * a.hidden + h];
    }
}

void gated_add_backward(const GatedAddBackwardArgs& a) {
    SCMOE_CHECK(a.dtype == DType::kF32, "gated_add_backward: CPU computes in f32 only");
    const auto* b = static_cast<const float*>(a.branch);
    const auto* gy = static_cast<const float*>(a.grad_y);
    auto* gb = static_cast<float*>(a.grad_branch);
    for (std::int64_t t = 0; t < a.tokens; ++t) {
        const float c = a.gate_logit ? math::sigmoid(a.gate_logit[t]) : 1.0f;
        float dot = 0.0f;
        for (std::int64_t h = 0; h < a.hidden; ++h) {
            const std::int64_t i = t * a.hidden + h;
            gb[i] = c * gy[i];
            dot += gy[i] * b[i];
        }
        if (a.gate_logit) static_cast<float*>(a.grad_gate_logit)[t] = c * (1.0f - c) * dot;
    }
}

void count_nonfinite(const void* x, std::int64_t n, DType dtype, std::int64_t* count, std::int64_t* first_index) {
    SCMOE_CHECK(dtype == DType::kF32, "count_nonfinite: CPU holds f32 only");
    const auto* v = static_cast<const float*>(x);
    std::int64_t bad = 0, first = -1;
    for (std::int64_t i = 0; i < n; ++i) {
        if (!std::isfinite(v[i])) {
            if (first < 0) first = i;
            ++bad;
        }
    }
    *count = bad;
    *first_index = first;
}

void convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, std::int64_t n) {
    if (src_dtype == dst_dtype) {
        std::memmove(dst, src, static_cast<std::size_t>(n) * dtype_size(src_dtype));
    } else if (src_dtype == DType::kF32 && dst_dtype == DType::kBF16) {
        const auto* s = static_cast<const float*>(src);
        auto* d = static_cast<std::uint16_t*>(dst);
        for (std::int64_t i = 0; i < n; ++i) d[i] = math::f32_to_bf16_bits(s[i]);
    } else if (src_dtype == DType::kBF16 && dst_dtype == DType::kF32) {
        const auto* s = static_cast<const std::uint16_t*>(src);
        auto* d = static_cast<float*>(dst);
        for (std::int64_t i = 0; i < n; ++i) d[i] = math::bf16_bits_to_f32(s[i]);
    } else {
        SCMOE_FAIL("convert: no conversion " << dtype_name(src_dtype) << " -> " << dtype_name(dst_dtype));
    }
}

}  // namespace scmoe::cpu
