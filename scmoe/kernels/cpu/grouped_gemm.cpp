// CPU grouped GEMM: one BLAS sgemm per non-empty group (the per-expert loop reference).
#include "scmoe/kernels/cpu/cpu_ops.h"
#include "scmoe/kernels/error.h"

namespace scmoe::cpu {

void grouped_gemm(const GroupedGemmArgs& a) {
    SCMOE_CHECK(a.ab_dtype == DType::kF32 && a.c_dtype == DType::kF32, "CPU grouped gemm computes in f32 only");
    const auto* a_ptr = static_cast<const float*>(a.a);
    const auto* b_ptr = static_cast<const float*>(a.b);
    auto* c_ptr = static_cast<float*>(a.c);
    for (int g = 0; g < a.num_groups; ++g) {
        const std::int64_t row0 = a.group_offsets[g];
        const std::int64_t rows = a.group_offsets[g + 1] - row0;
        SCMOE_CHECK(rows >= 0 && row0 + rows <= a.max_rows,
                    "grouped gemm: group " << g << " rows [" << row0 << ", " << row0 + rows << ") outside max_rows "
                                           << a.max_rows);
        GemmArgs ga;
        switch (a.kind) {
            case GroupedGemmKind::kForward:  // [rows, k] x [k, n]
                ga = {false, false, rows, a.n, a.k, 1.0f, 0.0f, a_ptr + row0 * a.k, b_ptr + g * a.k * a.n,
                      c_ptr + row0 * a.n};
                break;
            case GroupedGemmKind::kGradInput:  // [rows, n] x [k, n]^T
                ga = {false, true, rows, a.k, a.n, 1.0f, 0.0f, a_ptr + row0 * a.n, b_ptr + g * a.k * a.n,
                      c_ptr + row0 * a.k};
                break;
            case GroupedGemmKind::kGradWeight:  // [rows, k]^T x [rows, n]
                ga = {true, false, a.k, a.n, rows, 1.0f, a.accumulate ? 1.0f : 0.0f, a_ptr + row0 * a.k, b_ptr + row0 * a.n,
                      c_ptr + g * a.k * a.n};
                break;
        }
        gemm(ga);
    }
}

}  // namespace scmoe::cpu
