// Dense GEMM: C[m, n] = alpha * op(A) * op(B) + beta * C, row-major, fp32 accumulation.
// CPU: BLAS sgemm (A, B, C all f32). CUDA: cublasGemmEx on tensor cores (A, B bf16 or f32;
// C bf16 or f32).
#pragma once

#include <cstdint>

#include "kernels/device.h"
#include "kernels/dtype.h"

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

}  // namespace scmoe
