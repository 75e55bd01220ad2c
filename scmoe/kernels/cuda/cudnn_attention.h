// Private: attention (causal or not) through cuDNN's fused flash attention (the cuDNN frontend's
// SDPA graph), bf16, forward and backward, on scmoe's own buffers as strided views (cudnn_attention_plan.h).
// Built only with SCMOE_WITH_CUDNN (scmoe/kernels/cuda/cudnn_attention.cpp); scmoe/kernels/cuda/attention.cu
// decides when to call it.
//
// NOTES:
//   - One graph per CudnnAttentionKey (shape, dtype, causal, direction, with-lse, deterministic, device),
//     built on first use and kept for the process; a shape cuDNN turns down is remembered too.
//   - The cuDNN handle and the workspace are per stream (StreamResources::cudnn): the handle is bound
//     to the stream, the workspace grows stream-ordered (cudaMallocAsync) and is never freed per call.
//   - cuDNN's Stats output is lse exactly as scmoe/kernels/attention.h defines it (natural-log log-sum-exp
//     of the scaled, masked scores), so its forward and the own backward mix freely, and vice versa.
#pragma once

#include <cuda_runtime.h>

#include "scmoe/kernels/attention.h"

namespace scmoe::cuda {

// Run `a` through cuDNN on `stream` (its device current). Returns false, having run nothing, when
// cuDNN's support check turns the shape down on this device and `required` is false (the first
// time per shape it says so on stderr); throws scmoe::Error naming the op, the shape and cuDNN's
// message on any other failure, and on an unsupported shape when `required`.
bool cudnn_attention_forward(const AttentionArgs& a, cudaStream_t stream, bool required);
bool cudnn_attention_backward(const AttentionBackwardArgs& a, cudaStream_t stream, bool required);

}  // namespace scmoe::cuda
