// What the CPU's training attention (cpu/attention.cpp) and decoding attention
// (cpu/attention_decode.cpp) compute the same way, so that a decoded position's output equals the
// full forward's to fp32 rounding: the row-major BLAS call on strided views, and the (causal or
// full) softmax of one row of scaled scores.
#pragma once

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace scmoe::cpu {

// C[m, n] = alpha * op(A) op(B) + beta * C with explicit leading dimensions (row-major).
inline void attention_sgemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                            const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
                            std::int64_t ldc) {
    const auto bl = [](std::int64_t v) { return static_cast<blasint>(v); };
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, bl(m), bl(n), bl(k),
                alpha, a, bl(lda), b, bl(ldb), beta, c, bl(ldc));
}

struct SoftmaxRowStats {
    float max = 0;  // the largest visible score
    float sum = 0;  // sum of exp(score - max) over the visible keys
};

// row[0..width): scaled scores of one query whose keys 0..last are visible (causal: last = the
// query's position; non-causal: last = width - 1). Replaces them with the softmax over 0..last (max,
// expf, sum, multiply by the inverse) and zeros after last.
inline SoftmaxRowStats causal_softmax_row(float* row, std::int64_t last, std::int64_t width) {
    float mx = -INFINITY;
    for (std::int64_t j = 0; j <= last; ++j) mx = std::max(mx, row[j]);
    float sum = 0.0f;
    for (std::int64_t j = 0; j <= last; ++j) {
        row[j] = expf(row[j] - mx);
        sum += row[j];
    }
    const float inv = 1.0f / sum;
    for (std::int64_t j = 0; j <= last; ++j) row[j] *= inv;
    for (std::int64_t j = last + 1; j < width; ++j) row[j] = 0.0f;
    return {mx, sum};
}

}  // namespace scmoe::cpu
