// CPU implementations of the ops in scmoe/kernels/*.h. They run synchronously on the calling thread;
// scmoe/kernels/dispatch.cpp enqueues them on a CPU stream's worker. fp32 only.
#pragma once

#include <cstdint>

#include "scmoe/kernels/activation.h"
#include "scmoe/kernels/adamw.h"
#include "scmoe/kernels/attention.h"
#include "scmoe/kernels/attention_decode.h"
#include "scmoe/kernels/cross_entropy.h"
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

namespace scmoe::cpu {

void gemm(const GemmArgs& args);
void grouped_gemm(const GroupedGemmArgs& args);
void router_forward(const RouterForwardArgs& args);
void router_backward(const RouterBackwardArgs& args);
void compute_layout(const LayoutArgs& args);
void permute(const PermuteArgs& args);
void permute_backward(const PermuteBackwardArgs& args);
void combine(const CombineArgs& args);
void combine_backward(const CombineBackwardArgs& args);
void activation_forward(const ActivationArgs& args);
void activation_backward(const ActivationBackwardArgs& args);
void gated_add(const GatedAddArgs& args);
void gated_add_backward(const GatedAddBackwardArgs& args);
void count_nonfinite(const void* x, std::int64_t n, DType dtype, std::int64_t* count, std::int64_t* first_index);
void convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, std::int64_t n);
void regroup(const RegroupArgs& args);
void copy_row_segments(const RowSegmentsArgs& args);
void rmsnorm_forward(const RmsNormArgs& args);
void rmsnorm_backward(const RmsNormBackwardArgs& args);
void attention_forward(const AttentionArgs& args);
void attention_backward(const AttentionBackwardArgs& args);
void kv_cache_append(const KvCacheAppendArgs& args);
void attention_decode(const AttentionDecodeArgs& args);
void adamw_step(const AdamWArgs& args);
void sum_of_squares(const float* x, std::int64_t n, float* out);
void embedding_forward(const EmbeddingArgs& args);
void embedding_backward(const EmbeddingBackwardArgs& args);
void cross_entropy(const CrossEntropyArgs& args);

}  // namespace scmoe::cpu
