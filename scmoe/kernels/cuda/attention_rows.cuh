// What the CUDA training attention (attention.cu) and decoding attention (attention_decode.cu)
// kernels share: one warp per query row, each lane holding kPer elements of a head_dim-wide row.
#pragma once

#include "scmoe/kernels/cuda/check.cuh"

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

}  // namespace scmoe::cuda
