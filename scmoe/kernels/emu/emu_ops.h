// Emulated implementations of the ops in scmoe/kernels/*.h (see emu_device.h): each enqueues a kernel
// that holds `stream` for the time cost_model.h gives its op_cost(); only routing metadata is
// computed (router choices, layout, the non-finite count), payloads are never touched.
#pragma once

#include <cstdint>

#include "scmoe/kernels/activation.h"
#include "scmoe/kernels/adamw.h"
#include "scmoe/kernels/attention.h"
#include "scmoe/kernels/attention_decode.h"
#include "scmoe/kernels/cross_entropy.h"
#include "scmoe/kernels/device.h"
#include "scmoe/kernels/elementwise.h"
#include "scmoe/kernels/emu/emu_device.h"
#include "scmoe/kernels/embedding.h"
#include "scmoe/kernels/gemm.h"
#include "scmoe/kernels/grouped_gemm.h"
#include "scmoe/kernels/layout.h"
#include "scmoe/kernels/permute.h"
#include "scmoe/kernels/regroup.h"
#include "scmoe/kernels/rmsnorm.h"
#include "scmoe/kernels/router.h"
#include "scmoe/kernels/row_segments.h"

namespace scmoe::emu {

void gemm(const GemmArgs& args, Stream& stream);
void grouped_gemm(const GroupedGemmArgs& args, Stream& stream);
// How the emulated grouped GEMM takes the SMs on `spec`'s GPU: CUTLASS's persistent sm_90 kernel's
// grid and block on compute capability 9.0, an ordinary kernel below (see emu_ops.cpp).
KernelShape grouped_gemm_shape(const GroupedGemmArgs& args, const GpuSpec& spec);
void router_forward(const RouterForwardArgs& args, Stream& stream);
void router_backward(const RouterBackwardArgs& args, Stream& stream);
void compute_layout(const LayoutArgs& args, Stream& stream);
void permute(const PermuteArgs& args, Stream& stream);
void permute_backward(const PermuteBackwardArgs& args, Stream& stream);
void combine(const CombineArgs& args, Stream& stream);
void combine_backward(const CombineBackwardArgs& args, Stream& stream);
void activation_forward(const ActivationArgs& args, Stream& stream);
void activation_backward(const ActivationBackwardArgs& args, Stream& stream);
void gated_add(const GatedAddArgs& args, Stream& stream);
void gated_add_backward(const GatedAddBackwardArgs& args, Stream& stream);
void count_nonfinite(const void* x, std::int64_t n, DType dtype, std::int64_t* count, std::int64_t* first_index,
                     Stream& stream);
void convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, std::int64_t n, Stream& stream);
void regroup(const RegroupArgs& args, Stream& stream);
void copy_row_segments(const RowSegmentsArgs& args, Stream& stream);
void rmsnorm_forward(const RmsNormArgs& args, Stream& stream);
void rmsnorm_backward(const RmsNormBackwardArgs& args, Stream& stream);
void attention_forward(const AttentionArgs& args, Stream& stream);
void attention_backward(const AttentionBackwardArgs& args, Stream& stream);
void kv_cache_append(const KvCacheAppendArgs& args, Stream& stream);
void attention_decode(const AttentionDecodeArgs& args, Stream& stream);
void adamw_step(const AdamWArgs& args, Stream& stream);
void sum_of_squares(const float* x, std::int64_t n, float* out, void* scratch, Stream& stream);
void embedding_forward(const EmbeddingArgs& args, Stream& stream);
void embedding_backward(const EmbeddingBackwardArgs& args, Stream& stream);
void cross_entropy(const CrossEntropyArgs& args, Stream& stream);

}  // namespace scmoe::emu
