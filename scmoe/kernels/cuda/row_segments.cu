// Row segments: one block row (blockIdx.x) per segment, grid-stride over the segment's words.
#include "scmoe/kernels/cuda/check.cuh"
#include "scmoe/kernels/cuda/cuda_ops.h"

namespace scmoe::cuda {
namespace {

constexpr int kMaxSegments = 65535;

template <class V>
__global__ void row_segments_kernel(const V* __restrict__ in, V* __restrict__ out, const std::int32_t* from_rows,
                                    const std::int32_t* to_rows, const std::int32_t* counts, long long words_per_row) {
    const int s = static_cast<int>(blockIdx.x);
    const long long rows = counts[s] > 0 ? counts[s] : 0;
    const long long n = rows * words_per_row;
    const V* src = in + static_cast<long long>(from_rows[s]) * words_per_row;
    V* dst = out + static_cast<long long>(to_rows[s]) * words_per_row;
    for (long long i = static_cast<long long>(blockIdx.y) * blockDim.x + threadIdx.x; i < n;
         i += static_cast<long long>(gridDim.y) * blockDim.x)
        dst[i] = src[i];
}

template <class V>
void launch(const RowSegmentsArgs& a, long long row_bytes, cudaStream_t s) {
    const dim3 grid(static_cast<unsigned int>(a.num_segments), 32);
    row_segments_kernel<V><<<grid, 256, 0, s>>>(static_cast<const V*>(a.in), static_cast<V*>(a.out), a.from_rows,
                                                a.to_rows, a.counts, row_bytes / static_cast<long long>(sizeof(V)));
    SCMOE_CUDA_CHECK_LAUNCH("row_segments_kernel");
}

}  // namespace

void copy_row_segments(const RowSegmentsArgs& a, void* stream) {
    cudaStream_t s = as_stream(stream);
    StreamDeviceGuard guard(s);
    SCMOE_CHECK(a.num_segments >= 0 && a.num_segments <= kMaxSegments,
                "copy_row_segments: " << a.num_segments << " segments; supported 0.." << kMaxSegments);
    const long long row_bytes = a.hidden * static_cast<long long>(dtype_size(a.dtype));
    if (row_bytes == 0 || a.num_segments == 0) return;
    if (row_bytes % 16 == 0 && is_aligned(a.in, 16) && is_aligned(a.out, 16)) {
        launch<uint4>(a, row_bytes, s);
    } else if (row_bytes % 4 == 0 && is_aligned(a.in, 4) && is_aligned(a.out, 4)) {
        launch<unsigned int>(a, row_bytes, s);
    } else {
        launch<unsigned short>(a, row_bytes, s);
    }
}

}  // namespace scmoe::cuda
