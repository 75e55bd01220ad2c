// CUDA implementations of the ops in scmoe/kernels/*.h, launched on `stream` (a cudaStream_t).
// Storage bf16 (f32 where the op's header says so), fp32 accumulation.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "scmoe/kernels/activation.h"
#include "scmoe/kernels/adamw.h"
#include "scmoe/kernels/attention.h"
#include "scmoe/kernels/attention_decode.h"
#include "scmoe/kernels/cross_entropy.h"
#include "scmoe/kernels/device.h"
#include "scmoe/kernels/elementwise.h"
#include "scmoe/kernels/embedding.h"
#include "scmoe/kernels/gemm.h"
#include "scmoe/kernels/grouped_gemm.h"
#include "scmoe/kernels/layout.h"
#include "scmoe/kernels/permute.h"
#include "scmoe/kernels/regroup.h"
#include "scmoe/kernels/rmsnorm.h"
#include "scmoe/kernels/router.h"
#include "scmoe/kernels/row_segments.h"

namespace scmoe::cuda {

int device_count();  // 0 when no driver or device answers
// Why device_count() is 0: "" when a device answers; "no CUDA device (cudaErrorNoDevice)" when none
// is present; otherwise the runtime's own error (a driver older than this CUDA runtime reports
// cudaErrorInsufficientDriver, which must not pass for "no device": review L3).
std::string unavailable_reason();
std::unique_ptr<Device> make_device(int index);

void gemm(const GemmArgs& args, void* stream);
void grouped_gemm(const GroupedGemmArgs& args, GroupedGemmProvider provider, void* stream);
// What the grouped GEMM provider choice sees of the stream's device (compute capability cached per device).
GroupedGemmTarget grouped_gemm_target(void* stream);
void router_forward(const RouterForwardArgs& args, void* stream);
void router_backward(const RouterBackwardArgs& args, void* stream);
void compute_layout(const LayoutArgs& args, void* stream);
void permute(const PermuteArgs& args, void* stream);
void permute_backward(const PermuteBackwardArgs& args, void* stream);
void combine(const CombineArgs& args, void* stream);
void combine_backward(const CombineBackwardArgs& args, void* stream);
void activation_forward(const ActivationArgs& args, void* stream);
void activation_backward(const ActivationBackwardArgs& args, void* stream);
void gated_add(const GatedAddArgs& args, void* stream);
void gated_add_backward(const GatedAddBackwardArgs& args, void* stream);
void count_nonfinite(const void* x, std::int64_t n, DType dtype, std::int64_t* count, std::int64_t* first_index,
                     void* stream);
void convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, std::int64_t n, void* stream);
void regroup(const RegroupArgs& args, void* stream);
void copy_row_segments(const RowSegmentsArgs& args, void* stream);
void rmsnorm_forward(const RmsNormArgs& args, void* stream);
void rmsnorm_backward(const RmsNormBackwardArgs& args, void* stream);
void attention_forward(const AttentionArgs& args, AttentionProvider provider, void* stream);
void attention_backward(const AttentionBackwardArgs& args, AttentionProvider provider, void* stream);
void kv_cache_append(const KvCacheAppendArgs& args, void* stream);
void attention_decode(const AttentionDecodeArgs& args, void* stream);
void adamw_step(const AdamWArgs& args, void* stream);
void sum_of_squares(const float* x, std::int64_t n, float* out, void* scratch, void* stream);
void embedding_forward(const EmbeddingArgs& args, void* stream);
void embedding_backward(const EmbeddingBackwardArgs& args, void* stream);
void cross_entropy(const CrossEntropyArgs& args, void* stream);

}  // namespace scmoe::cuda
