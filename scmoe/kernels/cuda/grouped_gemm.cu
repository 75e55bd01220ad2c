// Grouped GEMM providers on CUDA: the per-group cuBLAS loop (host sync; the reference), one cuBLAS
// strided-batched call (capacity mode), scmoe's own device-grouped kernel, and CUTLASS's grouped
// GEMMs (cutlass-grouped, when built).
#include <map>
#include <mutex>
#include <vector>

#include "scmoe/kernels/cuda/check.cuh"
#include "scmoe/kernels/cuda/cublas_gemm.cuh"
#include "scmoe/kernels/cuda/cuda_ops.h"
#include "scmoe/kernels/cuda/grouped_gemm_kernel.cuh"
#include "scmoe/kernels/cuda/stream_resources.cuh"
#if SCMOE_WITH_CUTLASS
#include "scmoe/kernels/cuda/cutlass_grouped_gemm.cuh"
#endif

namespace scmoe::cuda {
namespace {

// The GEMM of group g with `rows` rows starting at row0 (row-major operands, see grouped_gemm.h).
RowMajorGemm group_gemm(const GroupedGemmArgs& a, std::int64_t g, std::int64_t row0, std::int64_t rows) {
    const std::size_t ab = dtype_size(a.ab_dtype), cs = dtype_size(a.c_dtype);
    const auto* A = static_cast<const char*>(a.a);
    const auto* B = static_cast<const char*>(a.b);
    auto* C = static_cast<char*>(a.c);
    RowMajorGemm r;
    r.ab_dtype = a.ab_dtype;
    r.c_dtype = a.c_dtype;
    switch (a.kind) {
        case GroupedGemmKind::kForward:  // [rows, k] x [k, n]
            r.m = rows, r.n = a.n, r.k = a.k;
            r.a = A + static_cast<std::size_t>(row0 * a.k) * ab;
            r.b = B + static_cast<std::size_t>(g * a.k * a.n) * ab;
            r.c = C + static_cast<std::size_t>(row0 * a.n) * cs;
            break;
        case GroupedGemmKind::kGradInput:  // [rows, n] x [k, n]^T
            r.trans_b = true;
            r.m = rows, r.n = a.k, r.k = a.n;
            r.a = A + static_cast<std::size_t>(row0 * a.n) * ab;
            r.b = B + static_cast<std::size_t>(g * a.k * a.n) * ab;
            r.c = C + static_cast<std::size_t>(row0 * a.k) * cs;
            break;
        case GroupedGemmKind::kGradWeight:  // [rows, k]^T x [rows, n]
            r.trans_a = true;
            r.m = a.k, r.n = a.n, r.k = rows;
            r.a = A + static_cast<std::size_t>(row0 * a.k) * ab;
            r.b = B + static_cast<std::size_t>(row0 * a.n) * ab;
            r.c = C + static_cast<std::size_t>(g * a.k * a.n) * cs;
            r.beta = a.accumulate ? 1.0f : 0.0f;
            break;
    }
    return r;
}

void loop_provider(const GroupedGemmArgs& a, cudaStream_t stream) {
    StreamResources& res = stream_resources(stream);
    const std::size_t bytes = static_cast<std::size_t>(a.num_groups + 1) * sizeof(std::int32_t);
    auto* host = static_cast<std::int32_t*>(host_staging(res, bytes));
    SCMOE_CUDA_CHECK(cudaMemcpyAsync(host, a.group_offsets, bytes, cudaMemcpyDefault, stream));
    SCMOE_CUDA_CHECK(cudaStreamSynchronize(stream));
    const std::vector<std::int32_t> offsets(host, host + a.num_groups + 1);
    for (int g = 0; g < a.num_groups; ++g) {
        const std::int64_t row0 = offsets[static_cast<std::size_t>(g)];
        const std::int64_t rows = offsets[static_cast<std::size_t>(g) + 1] - row0;
        SCMOE_CHECK(row0 >= 0 && rows >= 0 && row0 + rows <= a.max_rows,
                    "grouped gemm: group " << g << " rows [" << row0 << ", " << row0 + rows << ") outside max_rows "
                                           << a.max_rows);
        // Empty groups: kGradWeight writes zeros (k == 0 GEMM; with accumulate C = 1 * C), the others
        // write nothing (m == 0).
        run_row_major_gemm(group_gemm(a, g, row0, rows), cublas_handle(res), stream);
    }
}

void strided_batched_provider(const GroupedGemmArgs& a, cudaStream_t stream) {
    SCMOE_CHECK(a.rows_per_group > 0,
                "grouped gemm provider cublas-batched needs capacity mode (rows_per_group > 0); "
                "use device-grouped or loop for ragged groups");
    SCMOE_CHECK(
        a.num_groups * a.rows_per_group <= a.max_rows,
        "grouped gemm: " << a.num_groups << " groups x " << a.rows_per_group << " rows exceed max_rows " << a.max_rows);
    const std::int64_t R = a.rows_per_group;
    RowMajorGemm r = group_gemm(a, 0, 0, R);
    r.batch = a.num_groups;
    switch (a.kind) {
        case GroupedGemmKind::kForward:
            r.stride_a = R * a.k, r.stride_b = a.k * a.n, r.stride_c = R * a.n;
            break;
        case GroupedGemmKind::kGradInput:
            r.stride_a = R * a.n, r.stride_b = a.k * a.n, r.stride_c = R * a.k;
            break;
        case GroupedGemmKind::kGradWeight:
            r.stride_a = R * a.k, r.stride_b = R * a.n, r.stride_c = a.k * a.n;
            break;
    }
    run_row_major_gemm(r, cublas_handle(stream_resources(stream)), stream);
}

}  // namespace

// Compute capabilities are cached per device: the choice runs on every grouped GEMM call.
GroupedGemmTarget grouped_gemm_target(void* native_stream) {
    cudaStream_t stream = as_stream(native_stream);
    static std::mutex mutex;
    static std::map<int, std::pair<int, int>> capabilities;
    const int device = stream_device(stream);
    GroupedGemmTarget t;
    t.backend = Backend::kCuda;
    t.cutlass_built = grouped_gemm_provider_built(GroupedGemmProvider::kCutlassGrouped);
    std::scoped_lock lock(mutex);
    auto it = capabilities.find(device);
    if (it == capabilities.end()) {
        int major = 0, minor = 0;
        SCMOE_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
        SCMOE_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
        it = capabilities.emplace(device, std::make_pair(major, minor)).first;
    }
    t.cc_major = it->second.first;
    t.cc_minor = it->second.second;
    return t;
}

void grouped_gemm(const GroupedGemmArgs& a, GroupedGemmProvider provider, void* stream) {
    cudaStream_t s = as_stream(stream);
    StreamDeviceGuard guard(s);
    SCMOE_CHECK(a.num_groups >= 0 && a.k >= 0 && a.n >= 0 && a.max_rows >= 0 && a.rows_per_group >= 0,
                "grouped gemm: negative size (groups " << a.num_groups << ", k " << a.k << ", n " << a.n
                                                       << ", max_rows " << a.max_rows << ", rows_per_group "
                                                       << a.rows_per_group << ")");
    if (a.num_groups == 0) return;
    const GroupedGemmTarget target = grouped_gemm_target(s);
    provider = resolve_grouped_gemm_provider(a, provider, target);
    switch (provider) {
        case GroupedGemmProvider::kLoop:
            loop_provider(a, s);
            return;
        case GroupedGemmProvider::kCublasStridedBatched:
            strided_batched_provider(a, s);
            return;
        case GroupedGemmProvider::kDeviceGrouped:
            device_grouped_gemm(a, s);
            return;
        case GroupedGemmProvider::kCutlassGrouped:
#if SCMOE_WITH_CUTLASS
            cutlass_grouped_gemm(a, target, s);
            return;
#else
            SCMOE_FAIL(cutlass_grouped_gemm_unsupported(a, target));
#endif
        case GroupedGemmProvider::kAuto:
            break;
    }
    SCMOE_FAIL("grouped gemm: unknown provider " << static_cast<int>(provider));
}

}  // namespace scmoe::cuda
