#include <cstring>

#include "scmoe/kernels/cpu/cpu_ops.h"
#include "scmoe/kernels/error.h"

namespace scmoe::cpu {
namespace {
void check_f32(DType d, const char* op) { SCMOE_CHECK(d == DType::kF32, op << ": CPU computes in f32 only"); }
}  // namespace

void permute(const PermuteArgs& a) {
    check_f32(a.dtype, "permute");
    const auto* x = static_cast<const float*>(a.x);
    auto* xp = static_cast<float*>(a.xp);
    for (std::int64_t r = 0; r < a.rows; ++r) {
        const std::int32_t choice = a.choice_of_row[r];
        float* dst = xp + r * a.hidden;
        if (choice < 0) {
            std::memset(dst, 0, static_cast<std::size_t>(a.hidden) * sizeof(float));
        } else {
            std::memcpy(dst, x + (choice / a.top_k) * a.hidden, static_cast<std::size_t>(a.hidden) * sizeof(float));
        }
    }
}

void permute_backward(const PermuteBackwardArgs& a) {
    check_f32(a.dtype, "permute_backward");
    const auto* gxp = static_cast<const float*>(a.grad_xp);
    auto* gx = static_cast<float*>(a.grad_x);
    for (std::int64_t t = 0; t < a.tokens; ++t) {
        float* dst = gx + t * a.hidden;
        for (std::int64_t h = 0; h < a.hidden; ++h) {
            float acc = a.accumulate ? dst[h] : 0.0f;
            for (int j = 0; j < a.top_k; ++j) {
                const std::int32_t slot = a.slot_of_choice[t * a.top_k + j];
                if (slot >= 0) acc += gxp[slot * a.hidden + h];
            }
            dst[h] = acc;
        }
    }
}

void combine(const CombineArgs& a) {
    check_f32(a.dtype, "combine");
    const auto* yp = static_cast<const float*>(a.yp);
    auto* y = static_cast<float*>(a.y);
    for (std::int64_t t = 0; t < a.tokens; ++t) {
        float* dst = y + t * a.hidden;
        for (std::int64_t h = 0; h < a.hidden; ++h) {
            float acc = 0.0f;
            for (int j = 0; j < a.top_k; ++j) {
                const std::int32_t slot = a.slot_of_choice[t * a.top_k + j];
                if (slot >= 0) acc += a.gate_weight[t * a.top_k + j] * yp[slot * a.hidden + h];
            }
            dst[h] = a.accumulate ? dst[h] + acc : acc;
        }
    }
}

void combine_backward(const CombineBackwardArgs& a) {
    check_f32(a.dtype, "combine_backward");
    const auto* gy = static_cast<const float*>(a.grad_y);
    const auto* yp = static_cast<const float*>(a.yp);
    auto* gyp = static_cast<float*>(a.grad_yp);
    for (std::int64_t r = 0; r < a.rows; ++r) {
        const std::int32_t choice = a.choice_of_row[r];
        float* dst = gyp + r * a.hidden;
        if (choice < 0) {
            std::memset(dst, 0, static_cast<std::size_t>(a.hidden) * sizeof(float));
            continue;
        }
        const float w = a.gate_weight[choice];
        const float* src = gy + (choice / a.top_k) * a.hidden;
        for (std::int64_t h = 0; h < a.hidden; ++h) dst[h] = w * src[h];
    }
    for (std::int64_t c = 0; c < a.tokens * a.top_k; ++c) {
        const std::int32_t slot = a.slot_of_choice[c];
        float dot = 0.0f;
        if (slot >= 0) {
            const float* g = gy + (c / a.top_k) * a.hidden;
            const float* v = yp + slot * a.hidden;
            for (std::int64_t h = 0; h < a.hidden; ++h) dot += g[h] * v[h];
        }
        a.grad_gate_weight[c] = dot;
    }
}

}  // namespace scmoe::cpu
