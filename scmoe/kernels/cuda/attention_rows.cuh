// What the CUDA training attention (attention.cu) and decoding attention (attention_decode.cu)
// kernels share: one warp per query row, each lane holding kPer elements of a head_dim-wide row,
// kPer chosen from head_dim by dispatch_per_lane.
#pragma once

#include <cstdint>
#include <type_traits>

#include "scmoe/kernels/attention.h"
#include "scmoe/kernels/cuda/check.cuh"
#include "scmoe/kernels/error.h"

namespace scmoe::cuda {

// The sum of v over the warp's 32 lanes, in every lane.
__device__ __forceinline__ float warp_sum(float v) {
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

// Lane `lane`'s elements lane, lane + 32, ... of a row of head_dim elements (0 past its end), as f32.
template <class T, int kPer>
__device__ __forceinline__ void load_row(const T* p, long long head_dim, int lane, float (&r)[kPer]) {
#pragma unroll
    for (int e = 0; e < kPer; ++e) {
        const long long d = lane + 32LL * e;
        r[e] = d < head_dim ? load_f32(p + d) : 0.0f;
    }
}

// Calls fn(std::integral_constant<int, kPer>) with the smallest kPer in {1, 2, 4, 8} covering
// head_dim; beyond kAttentionCudaMaxHeadDim an error naming `op`.
template <class Fn>
void dispatch_per_lane(const char* op, std::int64_t head_dim, Fn&& fn) {
    if (head_dim <= 32) return fn(std::integral_constant<int, 1>{});
    if (head_dim <= 64) return fn(std::integral_constant<int, 2>{});
    if (head_dim <= 128) return fn(std::integral_constant<int, 4>{});
    if (head_dim <= 256) return fn(std::integral_constant<int, 8>{});
    SCMOE_FAIL(op << ": head_dim " << head_dim << " exceeds the CUDA kernels' limit " << kAttentionCudaMaxHeadDim);
}

}  // namespace scmoe::cuda
