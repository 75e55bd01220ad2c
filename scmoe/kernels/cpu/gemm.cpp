#include <cblas.h>

#include "scmoe/kernels/cpu/cpu_ops.h"
#include "scmoe/kernels/error.h"

namespace scmoe::cpu {

void gemm(const GemmArgs& a) {
    SCMOE_CHECK(a.ab_dtype == DType::kF32 && a.c_dtype == DType::kF32, "CPU gemm computes in f32 only");
    if (a.m == 0 || a.n == 0) return;
    if (a.k == 0) {
        // BLAS leaves C * beta; keep the documented "beta = 0 overwrites" contract.
        auto* c = static_cast<float*>(a.c);
        for (std::int64_t i = 0; i < a.m * a.n; ++i) c[i] = a.beta == 0.0f ? 0.0f : c[i] * a.beta;
        return;
    }
    const std::int64_t lda = a.trans_a ? a.m : a.k;
    const std::int64_t ldb = a.trans_b ? a.k : a.n;
    cblas_sgemm(CblasRowMajor, a.trans_a ? CblasTrans : CblasNoTrans, a.trans_b ? CblasTrans : CblasNoTrans,
                static_cast<blasint>(a.m), static_cast<blasint>(a.n), static_cast<blasint>(a.k), a.alpha,
                static_cast<const float*>(a.a), static_cast<blasint>(lda), static_cast<const float*>(a.b),
                static_cast<blasint>(ldb), a.beta, static_cast<float*>(a.c), static_cast<blasint>(a.n));
}

}  // namespace scmoe::cpu
