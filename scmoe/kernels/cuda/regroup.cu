// Regroup rows between source-major and expert-major order (expert-parallel exchange).
// One block column per (source, local expert) chunk; the chunk's start rows in both orders come
// from a scan of the counts in shared memory (num_sources * num_local_experts is small).
#include "scmoe/kernels/cuda/check.cuh"
#include "scmoe/kernels/cuda/cuda_ops.h"

namespace scmoe::cuda {
namespace {

constexpr int kMaxChunks = 4096;

template <class V>
__global__ void regroup_kernel(const V* __restrict__ in, V* __restrict__ out, const std::int32_t* __restrict__ counts,
                               int num_sources, int num_local, long long words_per_row, bool to_expert_major) {
    __shared__ long long from_row, to_row, rows;
    const int chunk = static_cast<int>(blockIdx.x);  // chunk = s * num_local + e
    if (threadIdx.x == 0) {
        const int s = chunk / num_local, e = chunk % num_local;
        long long src_major = 0, expert_major = 0;
        // NOTES: source-major start = rows of all chunks (s', e') with s' < s, or s' == s and e' < e;
        // expert-major start = rows of all chunks with e' < e, or e' == e and s' < s.
        for (int c = 0; c < num_sources * num_local; ++c) {
            const int cs = c / num_local, ce = c % num_local;
            if (cs < s || (cs == s && ce < e)) src_major += counts[c];
            if (ce < e || (ce == e && cs < s)) expert_major += counts[c];
        }
        from_row = to_expert_major ? src_major : expert_major;
        to_row = to_expert_major ? expert_major : src_major;
        rows = counts[chunk];
    }
    __syncthreads();
    const long long n = rows * words_per_row;
    const V* src = in + from_row * words_per_row;
    V* dst = out + to_row * words_per_row;
    for (long long i = static_cast<long long>(blockIdx.y) * blockDim.x + threadIdx.x; i < n;
         i += static_cast<long long>(gridDim.y) * blockDim.x)
        dst[i] = src[i];
}

template <class V>
void launch(const RegroupArgs& a, long long row_bytes, cudaStream_t s) {
    const dim3 grid(static_cast<unsigned int>(a.num_sources * a.num_local_experts), 32);
    regroup_kernel<V><<<grid, 256, 0, s>>>(static_cast<const V*>(a.in), static_cast<V*>(a.out), a.counts,
                                           a.num_sources, a.num_local_experts,
                                           row_bytes / static_cast<long long>(sizeof(V)), a.to_expert_major);
    SCMOE_CUDA_CHECK_LAUNCH("regroup_kernel");
}

}  // namespace

void regroup(const RegroupArgs& a, void* stream) {
    cudaStream_t s = as_stream(stream);
    StreamDeviceGuard guard(s);
    const int chunks = a.num_sources * a.num_local_experts;
    SCMOE_CHECK(chunks > 0 && chunks <= kMaxChunks,
                "regroup: " << chunks << " (source, expert) chunks; supported 1.." << kMaxChunks);
    const long long row_bytes = a.hidden * static_cast<long long>(dtype_size(a.dtype));
    if (row_bytes == 0) return;
    if (row_bytes % 16 == 0 && is_aligned(a.in, 16) && is_aligned(a.out, 16)) {
        launch<uint4>(a, row_bytes, s);
    } else {
        launch<unsigned short>(a, row_bytes, s);
    }
}

}  // namespace scmoe::cuda
