// Private: scmoe's own grouped GEMM kernel (bf16 inputs on tensor cores, fp32 accumulation), which
// reads the group offsets on the device: no host sync, graph-capturable.
#pragma once

#include <cuda_runtime.h>

#include "scmoe/kernels/grouped_gemm.h"

namespace scmoe::cuda {

// Requires ab_dtype bf16; c_dtype bf16 or f32. Same contract as grouped_gemm() in scmoe/kernels/grouped_gemm.h.
void device_grouped_gemm(const GroupedGemmArgs& args, cudaStream_t stream);

}  // namespace scmoe::cuda
