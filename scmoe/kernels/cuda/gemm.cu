// Dense GEMM on cuBLAS: cublasGemmEx (or its strided-batched form) with fp32 accumulation,
// row-major through the column-major operand swap.
#include <climits>

#include "scmoe/kernels/cuda/check.cuh"
#include "scmoe/kernels/cuda/cublas_gemm.cuh"
#include "scmoe/kernels/cuda/cuda_ops.h"
#include "scmoe/kernels/cuda/stream_resources.cuh"

namespace scmoe::cuda {
namespace {

template <class T>
__global__ void scale_kernel(T* c, std::int64_t n, float beta) {
    for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
        store_f32(c + i, beta * load_f32(c + i));
    }
}

cudaDataType_t cuda_type(DType d) {
    switch (d) {
        case DType::kF32:
            return CUDA_R_32F;
        case DType::kBF16:
            return CUDA_R_16BF;
        case DType::kI32:
            break;
    }
    SCMOE_FAIL("gemm: dtype " << dtype_name(d) << " not supported (bf16 or f32)");
}

int to_int(std::int64_t v, const char* what) {
    SCMOE_CHECK(v >= 0 && v <= INT_MAX, "gemm: " << what << " = " << v << " does not fit cuBLAS's int");
    return static_cast<int>(v);
}

}  // namespace

void run_row_major_gemm(const RowMajorGemm& g, cublasHandle_t handle, cudaStream_t stream) {
    SCMOE_CHECK(g.m >= 0 && g.n >= 0 && g.k >= 0 && g.batch >= 0,
                "gemm: negative size m=" << g.m << " n=" << g.n << " k=" << g.k << " batch=" << g.batch);
    SCMOE_CHECK(!(g.ab_dtype == DType::kF32 && g.c_dtype != DType::kF32),
                "gemm: f32 inputs need an f32 output, got " << dtype_name(g.c_dtype));
    const cudaDataType_t ab_type = cuda_type(g.ab_dtype), c_type = cuda_type(g.c_dtype);
    if (g.m == 0 || g.n == 0 || g.batch == 0) return;
    if (g.k == 0) {
        // C = beta * C over every matrix of the batch (rows of length n, ldc = n).
        const std::size_t matrix_bytes = static_cast<std::size_t>(g.m * g.n) * dtype_size(g.c_dtype);
        for (std::int64_t i = 0; i < g.batch; ++i) {
            void* ci = static_cast<char*>(g.c) + static_cast<std::size_t>(i * g.stride_c) * dtype_size(g.c_dtype);
            if (g.beta == 0.0f) {
                SCMOE_CUDA_CHECK(cudaMemsetAsync(ci, 0, matrix_bytes, stream));
            } else if (g.beta != 1.0f) {
                const std::int64_t n = g.m * g.n;
                dispatch_float_dtype(g.c_dtype, "gemm", [&](auto tag) {
                    using T = decltype(tag);
                    scale_kernel<T><<<blocks_for(n, 256), 256, 0, stream>>>(static_cast<T*>(ci), n, g.beta);
                    SCMOE_CUDA_CHECK_LAUNCH("scale_kernel");
                });
            }
        }
        return;
    }
    const int m = to_int(g.m, "m"), n = to_int(g.n, "n"), k = to_int(g.k, "k");
    const int lda = to_int(g.trans_a ? g.m : g.k, "lda");
    const int ldb = to_int(g.trans_b ? g.k : g.n, "ldb");
    // Column-major view: C^T[n, m] = op(B)^T[n, k] * op(A)^T[k, m]. A row-major matrix is its own
    // transpose in column-major, so B "not transposed" is already op(B)^T.
    const cublasOperation_t op_b = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_a = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    if (g.batch == 1) {
        SCMOE_CUBLAS_CHECK(cublasGemmEx(handle, op_b, op_a, n, m, k, &g.alpha, g.b, ab_type, ldb, g.a, ab_type, lda,
                                        &g.beta, g.c, c_type, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    } else {
        const int batch = to_int(g.batch, "batch");
        SCMOE_CUBLAS_CHECK(cublasGemmStridedBatchedEx(handle, op_b, op_a, n, m, k, &g.alpha, g.b, ab_type, ldb,
                                                      g.stride_b, g.a, ab_type, lda, g.stride_a, &g.beta, g.c, c_type,
                                                      n, g.stride_c, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
}

void gemm(const GemmArgs& a, void* stream) {
    cudaStream_t s = as_stream(stream);
    StreamDeviceGuard guard(s);
    RowMajorGemm g;
    g.trans_a = a.trans_a;
    g.trans_b = a.trans_b;
    g.m = a.m;
    g.n = a.n;
    g.k = a.k;
    g.alpha = a.alpha;
    g.beta = a.beta;
    g.a = a.a;
    g.b = a.b;
    g.c = a.c;
    g.ab_dtype = a.ab_dtype;
    g.c_dtype = a.c_dtype;
    run_row_major_gemm(g, cublas_handle(stream_resources(s)), s);
}

}  // namespace scmoe::cuda
