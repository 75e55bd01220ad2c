// Routes every op to its backend: on a CPU stream the CPU implementation is enqueued on the
// stream's worker thread; on a CUDA stream the CUDA launcher is called with the cudaStream_t; on an
// emulated stream the emulated op (scmoe/kernels/emu/emu_ops.h) enqueues its modeled time.
#include "scmoe/kernels/cpu/cpu_ops.h"
#include "scmoe/kernels/emu/emu_ops.h"
#include "scmoe/kernels/error.h"
#if SCMOE_WITH_CUDA
#include "scmoe/kernels/cuda/cuda_ops.h"
#endif

namespace scmoe {
namespace {

template <class CpuFn, class CudaFn, class EmuFn>
void run_on(Stream& stream, CpuFn&& cpu_fn, [[maybe_unused]] CudaFn&& cuda_fn, EmuFn&& emu_fn) {
    if (stream.backend() == Backend::kCpu) {
        stream.host_task(std::forward<CpuFn>(cpu_fn));
        return;
    }
    if (stream.backend() == Backend::kEmu) {
        emu_fn();
        return;
    }
#if SCMOE_WITH_CUDA
    cuda_fn(stream.native_handle());
#else
    SCMOE_FAIL("a CUDA stream reached an op in a build without CUDA");
#endif
}

}  // namespace

#if SCMOE_WITH_CUDA
#define SCMOE_CUDA_CALL(call) [&](void* native) { cuda::call; }
#else
#define SCMOE_CUDA_CALL(call) [](void*) {}
#endif
#define SCMOE_EMU_CALL(call) [&] { emu::call; }

void gemm(const GemmArgs& a, Stream& s) { run_on(s, [a] { cpu::gemm(a); }, SCMOE_CUDA_CALL(gemm(a, native)), SCMOE_EMU_CALL(gemm(a, s))); }
void grouped_gemm(const GroupedGemmArgs& args, Stream& s, [[maybe_unused]] GroupedGemmProvider p) {
    GroupedGemmArgs a = args;
    a.sm_limit = grouped_gemm_sm_limit(args, s);
    SCMOE_CHECK(!a.accumulate || a.kind == GroupedGemmKind::kGradWeight,
                "grouped GEMM: accumulate adds into weight gradients; it applies to kGradWeight only");
    SCMOE_CHECK(s.backend() != Backend::kCpu || p == GroupedGemmProvider::kAuto || p == GroupedGemmProvider::kLoop,
                "grouped GEMM provider " << grouped_gemm_provider_name(p, s.backend())
                                         << " needs the CUDA backend; the CPU backend has auto and loop");
    run_on(s, [a] { cpu::grouped_gemm(a); }, SCMOE_CUDA_CALL(grouped_gemm(a, p, native)), SCMOE_EMU_CALL(grouped_gemm(a, s)));
}
void router_forward(const RouterForwardArgs& a, Stream& s) {
    run_on(s, [a] { cpu::router_forward(a); }, SCMOE_CUDA_CALL(router_forward(a, native)), SCMOE_EMU_CALL(router_forward(a, s)));
}
void router_backward(const RouterBackwardArgs& a, Stream& s) {
    run_on(s, [a] { cpu::router_backward(a); }, SCMOE_CUDA_CALL(router_backward(a, native)), SCMOE_EMU_CALL(router_backward(a, s)));
}
void compute_layout(const LayoutArgs& a, Stream& s) {
    run_on(s, [a] { cpu::compute_layout(a); }, SCMOE_CUDA_CALL(compute_layout(a, native)), SCMOE_EMU_CALL(compute_layout(a, s)));
}
void permute(const PermuteArgs& a, Stream& s) { run_on(s, [a] { cpu::permute(a); }, SCMOE_CUDA_CALL(permute(a, native)), SCMOE_EMU_CALL(permute(a, s))); }
void permute_backward(const PermuteBackwardArgs& a, Stream& s) {
    run_on(s, [a] { cpu::permute_backward(a); }, SCMOE_CUDA_CALL(permute_backward(a, native)), SCMOE_EMU_CALL(permute_backward(a, s)));
}
void combine(const CombineArgs& a, Stream& s) { run_on(s, [a] { cpu::combine(a); }, SCMOE_CUDA_CALL(combine(a, native)), SCMOE_EMU_CALL(combine(a, s))); }
void combine_backward(const CombineBackwardArgs& a, Stream& s) {
    run_on(s, [a] { cpu::combine_backward(a); }, SCMOE_CUDA_CALL(combine_backward(a, native)), SCMOE_EMU_CALL(combine_backward(a, s)));
}
void activation_forward(const ActivationArgs& a, Stream& s) {
    run_on(s, [a] { cpu::activation_forward(a); }, SCMOE_CUDA_CALL(activation_forward(a, native)), SCMOE_EMU_CALL(activation_forward(a, s)));
}
void activation_backward(const ActivationBackwardArgs& a, Stream& s) {
    run_on(s, [a] { cpu::activation_backward(a); }, SCMOE_CUDA_CALL(activation_backward(a, native)), SCMOE_EMU_CALL(activation_backward(a, s)));
}
void gated_add(const GatedAddArgs& a, Stream& s) {
    run_on(s, [a] { cpu::gated_add(a); }, SCMOE_CUDA_CALL(gated_add(a, native)), SCMOE_EMU_CALL(gated_add(a, s)));
}
void gated_add_backward(const GatedAddBackwardArgs& a, Stream& s) {
    run_on(s, [a] { cpu::gated_add_backward(a); }, SCMOE_CUDA_CALL(gated_add_backward(a, native)), SCMOE_EMU_CALL(gated_add_backward(a, s)));
}
void count_nonfinite(const void* x, std::int64_t n, DType dtype, std::int64_t* count, std::int64_t* first_index,
                     Stream& s) {
    run_on(s, [=] { cpu::count_nonfinite(x, n, dtype, count, first_index); },
           SCMOE_CUDA_CALL(count_nonfinite(x, n, dtype, count, first_index, native)), SCMOE_EMU_CALL(count_nonfinite(x, n, dtype, count, first_index, s)));
}
void regroup(const RegroupArgs& a, Stream& s) {
    run_on(s, [a] { cpu::regroup(a); }, SCMOE_CUDA_CALL(regroup(a, native)), SCMOE_EMU_CALL(regroup(a, s)));
}
void copy_row_segments(const RowSegmentsArgs& a, Stream& s) {
    run_on(s, [a] { cpu::copy_row_segments(a); }, SCMOE_CUDA_CALL(copy_row_segments(a, native)), SCMOE_EMU_CALL(copy_row_segments(a, s)));
}
void convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, std::int64_t n, Stream& s) {
    run_on(s, [=] { cpu::convert(src, src_dtype, dst, dst_dtype, n); },
           SCMOE_CUDA_CALL(convert(src, src_dtype, dst, dst_dtype, n, native)), SCMOE_EMU_CALL(convert(src, src_dtype, dst, dst_dtype, n, s)));
}
// Backbone ops: arguments are checked here, on the calling thread, so a bad call throws at once.
void rmsnorm_forward(const RmsNormArgs& a, Stream& s) {
    check_rmsnorm_args(a, s.backend());
    run_on(s, [a] { cpu::rmsnorm_forward(a); }, SCMOE_CUDA_CALL(rmsnorm_forward(a, native)), SCMOE_EMU_CALL(rmsnorm_forward(a, s)));
}
void rmsnorm_backward(const RmsNormBackwardArgs& a, Stream& s) {
    check_rmsnorm_backward_args(a, s.backend());
    run_on(s, [a] { cpu::rmsnorm_backward(a); }, SCMOE_CUDA_CALL(rmsnorm_backward(a, native)), SCMOE_EMU_CALL(rmsnorm_backward(a, s)));
}
void attention_forward(const AttentionArgs& a, Stream& s, [[maybe_unused]] AttentionProvider p) {
    check_attention_args(a, s.backend());
    check_attention_provider(p, s.backend());
    run_on(s, [a] { cpu::attention_forward(a); }, SCMOE_CUDA_CALL(attention_forward(a, p, native)), SCMOE_EMU_CALL(attention_forward(a, s)));
}
void attention_backward(const AttentionBackwardArgs& a, Stream& s, [[maybe_unused]] AttentionProvider p) {
    check_attention_backward_args(a, s.backend());
    check_attention_provider(p, s.backend());
    run_on(s, [a] { cpu::attention_backward(a); }, SCMOE_CUDA_CALL(attention_backward(a, p, native)), SCMOE_EMU_CALL(attention_backward(a, s)));
}
// Decoding attention (attention_decode.h).
void kv_cache_append(const KvCacheAppendArgs& a, Stream& s) {
    check_kv_cache_append_args(a, s.backend());
    run_on(s, [a] { cpu::kv_cache_append(a); }, SCMOE_CUDA_CALL(kv_cache_append(a, native)), SCMOE_EMU_CALL(kv_cache_append(a, s)));
}
void attention_decode(const AttentionDecodeArgs& a, Stream& s) {
    check_attention_decode_args(a, s.backend());
    run_on(s, [a] { cpu::attention_decode(a); }, SCMOE_CUDA_CALL(attention_decode(a, native)), SCMOE_EMU_CALL(attention_decode(a, s)));
}
void adamw_step(const AdamWArgs& a, Stream& s) {
    check_adamw_args(a);
    if (a.n == 0) return;
    run_on(s, [a] { cpu::adamw_step(a); }, SCMOE_CUDA_CALL(adamw_step(a, native)), SCMOE_EMU_CALL(adamw_step(a, s)));
}
void sum_of_squares(const float* x, std::int64_t n, float* out, void* scratch, Stream& s) {
    SCMOE_CHECK(n >= 0, "sum_of_squares: n must be >= 0, got " << n);
    SCMOE_CHECK(out && scratch, "sum_of_squares: out and scratch must not be null");
    SCMOE_CHECK(n == 0 || x, "sum_of_squares: x must not be null when n > 0");
    run_on(s, [=] { cpu::sum_of_squares(x, n, out); }, SCMOE_CUDA_CALL(sum_of_squares(x, n, out, scratch, native)), SCMOE_EMU_CALL(sum_of_squares(x, n, out, scratch, s)));
}
void embedding_forward(const EmbeddingArgs& a, Stream& s) {
    check_embedding_args(a, s.backend());
    run_on(s, [a] { cpu::embedding_forward(a); }, SCMOE_CUDA_CALL(embedding_forward(a, native)), SCMOE_EMU_CALL(embedding_forward(a, s)));
}
void embedding_backward(const EmbeddingBackwardArgs& a, Stream& s) {
    check_embedding_backward_args(a, s.backend());
    run_on(s, [a] { cpu::embedding_backward(a); }, SCMOE_CUDA_CALL(embedding_backward(a, native)), SCMOE_EMU_CALL(embedding_backward(a, s)));
}
void cross_entropy(const CrossEntropyArgs& a, Stream& s) {
    check_cross_entropy_args(a, s.backend());
    run_on(s, [a] { cpu::cross_entropy(a); }, SCMOE_CUDA_CALL(cross_entropy(a, native)), SCMOE_EMU_CALL(cross_entropy(a, s)));
}

}  // namespace scmoe
