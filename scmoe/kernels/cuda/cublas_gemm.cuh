// Private: row-major GEMMs through cuBLAS (column-major) by the operand swap C^T = B^T A^T.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "scmoe/kernels/dtype.h"

namespace scmoe::cuda {

// One row-major GEMM, or `batch` of them with element strides between consecutive matrices:
//   C_i[m, n] = alpha * op(A_i) * op(B_i) + beta * C_i
// op(A) = A^T means A_i is stored [k, m]; op(B) = B^T means B_i is stored [n, k]. ab/c dtypes: bf16
// or f32 (f32 inputs need an f32 C). m, n or batch == 0: nothing. k == 0: C = beta * C (beta 0
// writes zeros, never reading C).
struct RowMajorGemm {
    bool trans_a = false, trans_b = false;
    std::int64_t m = 0, n = 0, k = 0;
    float alpha = 1.0f, beta = 0.0f;
    const void* a = nullptr;
    const void* b = nullptr;
    void* c = nullptr;
    DType ab_dtype = DType::kBF16, c_dtype = DType::kBF16;
    std::int64_t batch = 1;
    std::int64_t stride_a = 0, stride_b = 0, stride_c = 0;  // elements
};

void run_row_major_gemm(const RowMajorGemm& g, cublasHandle_t handle, cudaStream_t stream);

}  // namespace scmoe::cuda
