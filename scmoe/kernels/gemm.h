// Dense GEMM: C[m, n] = alpha * op(A) * op(B) + beta * C, row-major, fp32 accumulation.
// CPU: BLAS sgemm (A, B, C all f32). CUDA: cublasGemmEx on tensor cores (A, B bf16 or f32;
// C bf16 or f32).
#pragma once

#include <cstdint>

#include "scmoe/kernels/device.h"
#include "scmoe/kernels/dtype.h"
#include "scmoe/kernels/op_cost.h"

namespace scmoe {

struct GemmArgs {
    bool trans_a = false;   // op(A) = A^T: A is stored [k, m]
    bool trans_b = false;   // op(B) = B^T: B is stored [n, k]
    std::int64_t m = 0, n = 0, k = 0;
    float alpha = 1.0f;
    float beta = 0.0f;      // 0: C is overwritten (its old contents are never read)
    const void* a = nullptr;
    const void* b = nullptr;
    void* c = nullptr;
    DType ab_dtype = DType::kF32;
    DType c_dtype = DType::kF32;
};

void gemm(const GemmArgs& args, Stream& stream);

// 2mnk FLOPs; A and B read once, C written (and read when beta != 0).
inline OpCost op_cost(const GemmArgs& a) {
    OpCost c;
    const double m = static_cast<double>(a.m), n = static_cast<double>(a.n), k = static_cast<double>(a.k);
    const double ab = static_cast<double>(dtype_size(a.ab_dtype)), cs = static_cast<double>(dtype_size(a.c_dtype));
    c.unit = OpUnit::kTensor;
    c.flops = 2.0 * m * n * k;
    c.bytes = ab * (m * k + k * n) + cs * m * n * (a.beta != 0.0f ? 2.0 : 1.0);
    c.threads = gemm_threads(a.m, a.n);
    c.gemm_m = a.m, c.gemm_n = a.n, c.gemm_k = a.k, c.gemm_count = 1;
    return c;
}

}  // namespace scmoe
