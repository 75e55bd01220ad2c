#include "scmoe/kernels/emu/emu_ops.h"

#include <algorithm>

#include "scmoe/kernels/cpu/cpu_ops.h"
#include "scmoe/kernels/emu/emu_device.h"
#include "scmoe/kernels/math.h"

namespace scmoe::emu {
namespace {

void timed(const char* name, const OpCost& cost, Stream& stream) { as_emu(stream).launch(name, cost); }

// Rows of a chunk [*first_row, *num_rows) or [0, rows) when the bounds are not on the device.
std::int64_t rows_in_use(std::int64_t rows, const std::int32_t* num_rows, const std::int32_t* first_row) {
    const std::int64_t end = num_rows ? *num_rows : rows;
    const std::int64_t begin = first_row ? *first_row : 0;
    return std::max<std::int64_t>(0, end - begin);
}

std::int64_t sum(const std::int32_t* counts, std::int64_t n) {
    std::int64_t total = 0;
    for (std::int64_t i = 0; i < n; ++i) total += counts[i];
    return total;
}

}  // namespace

void gemm(const GemmArgs& a, Stream& s) { timed("gemm", op_cost(a), s); }

// The emulated grouped GEMM stands for cutlass-grouped, the provider auto picks on sm_80..sm_90.
// On sm_90 that is CUTLASS's TMA + WGMMA kernel, persistent (one block per SM of its grid, min(SMs,
// GroupedGemmArgs::sm_limit)); its block, as ptxas reports it for scmoe's template arguments (review
// 2, "Measured here", quoted in docs/emu-sources.md: sm_90a, -O3 -DNDEBUG): 384 threads, 168
// registers per thread, 215,040 B of shared memory for kForward and kGradInput and 232,448 B for
// kGradWeight (the 227 KB per-block maximum). Below sm_90 it is modeled as an ordinary kernel: the
// CUTLASS 2.x kernel's registers were not measured, so whether a comm block fits beside it is not
// known.
KernelShape grouped_gemm_shape(const GroupedGemmArgs& a, const GpuSpec& spec) {
    KernelShape shape;
    shape.sm_limit = a.sm_limit;
    shape.persistent = spec.compute_capability == 90;
    shape.block = {384, 168, a.kind == GroupedGemmKind::kGradWeight ? 232448 : 215040};
    return shape;
}

// Its rate: the dense GEMM model's times GpuSpec::grouped_gemm_efficiency (measured on the GPUs that
// ran scmoe's gemm benchmark; 1 elsewhere). Under a paper stack it also stands for Tutel's experts
// (batched matmuls), which no GPU measured here; the factor is 1 on the GPUs the paper ran.
void grouped_gemm(const GroupedGemmArgs& a, Stream& s) {
    EmuStream& es = as_emu(s);
    const double efficiency = es.device().spec().grouped_gemm_efficiency;
    es.launch_shaped_at_start("grouped_gemm", [a, efficiency] {
        OpCost c;
        if (a.rows_per_group > 0 || !a.group_offsets) {
            c = op_cost(a, a.rows_per_group > 0 ? a.rows_per_group * a.num_groups : a.max_rows, a.num_groups);
        } else {
            int nonempty = 0;
            for (int g = 0; g < a.num_groups; ++g) nonempty += a.group_offsets[g + 1] > a.group_offsets[g];
            c = op_cost(a, a.group_offsets[a.num_groups] - a.group_offsets[0], nonempty);
        }
        c.efficiency *= efficiency;
        return c;
    }, grouped_gemm_shape(a, es.device().spec()));
}

// The choices come from the device's RoutingModel, keyed by the layer's noise stream (the rank)
// and a per-device call count, so ranks and steps draw different choices; the losses are zero.
void router_forward(const RouterForwardArgs& a, Stream& s) {
    check_router_top_k("emu router", a.top_k, a.num_experts);
    EmuStream& es = as_emu(s);
    const RoutingModel* model = &es.device().routing();
    const std::uint64_t key = math::noise_key(a.noise_stream, es.device().next_router_draw(), a.noise_seed);
    es.launch("router_forward", op_cost(a), [a, model, key] {
        draw_choices(*model, key, a.tokens, a.num_experts, a.top_k, a.expert_index, a.expert_fraction);
        if (a.losses) a.losses[0] = a.losses[1] = 0.0f;
    });
}

void router_backward(const RouterBackwardArgs& a, Stream& s) { timed("router_backward", op_cost(a), s); }

void compute_layout(const LayoutArgs& a, Stream& s) {
    as_emu(s).launch("compute_layout", op_cost(a), [a] { cpu::compute_layout(a); });
}

// With the stack's Tutel dispatch (stack.h), Tutel's encode/decode kernels in place of scmoe's; an
// accumulating permute_backward or combine adds into its output as PyTorch's autograd and residual
// add would, with one more add.
namespace {
void launch_all(EmuStream& es, const std::vector<StackKernel>& kernels) {
    for (const StackKernel& k : kernels) es.launch(k.name, k.cost);
}
}  // namespace
void permute(const PermuteArgs& a, Stream& s) {
    EmuStream& es = as_emu(s);
    if (!es.device().stack().tutel_dispatch) return timed("permute", op_cost(a), s);
    launch_all(es, tutel_encode_forward({a.tokens, a.rows, a.hidden, a.top_k, a.dtype}));
}
void permute_backward(const PermuteBackwardArgs& a, Stream& s) {
    EmuStream& es = as_emu(s);
    if (!es.device().stack().tutel_dispatch) return timed("permute_backward", op_cost(a), s);
    launch_all(es, tutel_encode_backward({a.tokens, a.rows, a.hidden, a.top_k, a.dtype}));
    if (a.accumulate) es.launch("tutel_accumulate", elementwise_cost(2 * a.tokens * a.hidden, a.tokens * a.hidden, a.dtype));
}
void combine(const CombineArgs& a, Stream& s) {
    EmuStream& es = as_emu(s);
    if (!es.device().stack().tutel_dispatch) return timed("combine", op_cost(a), s);
    launch_all(es, tutel_decode_forward({a.tokens, a.rows, a.hidden, a.top_k, a.dtype}));
    if (a.accumulate) es.launch("tutel_accumulate", elementwise_cost(2 * a.tokens * a.hidden, a.tokens * a.hidden, a.dtype));
}
void combine_backward(const CombineBackwardArgs& a, Stream& s) {
    EmuStream& es = as_emu(s);
    if (!es.device().stack().tutel_dispatch) return timed("combine_backward", op_cost(a), s);
    launch_all(es, tutel_decode_backward({a.tokens, a.rows, a.hidden, a.top_k, a.dtype}));
}

// Under a stack with the model code's activations (stack.h): the routed experts' GELU may launch
// nothing (expert_activation), and a dense FFN's GELU runs in fp32 between two casts (activation_f32).
namespace {
bool activation_launches(const Stack& stack, Activation activation, bool routed_expert) {
    return !routed_expert || stack.expert_activation || activation == Activation::kSwiGLU;
}
bool fp32_gelu(const Stack& stack, Activation activation, bool routed_expert) {
    return stack.activation_f32 && activation == Activation::kGeLU && !routed_expert;
}
// The kernels of `kernels(rows)`, each sized when it starts (the rows in use may be known only then).
template <class Kernels>
void launch_each_at_start(EmuStream& es, const std::int64_t rows, const std::int32_t* num_rows,
                          const std::int32_t* first_row, Kernels kernels) {
    const std::vector<StackKernel> named = kernels(0);  // the names; the costs come when each starts
    for (std::size_t i = 0; i < named.size(); ++i)
        es.launch_sized_at_start(named[i].name,
                                 [=] { return kernels(rows_in_use(rows, num_rows, first_row))[i].cost; });
}
// One direction of the activation (Args: ActivationArgs or ActivationBackwardArgs): where the stack
// runs the GELU in fp32, the kernels of `fp32_gelu_kernels` (fp32_gelu_forward or _backward); else
// the op's own kernel, `name`. Each is sized when it starts.
using Fp32GeluKernels = std::vector<StackKernel> (*)(std::int64_t rows, std::int64_t ffn, DType dtype);
template <class Args>
void launch_activation(const char* name, const Args& a, Fp32GeluKernels fp32_gelu_kernels, Stream& s) {
    EmuStream& es = as_emu(s);
    const Stack& stack = es.device().stack();
    if (!activation_launches(stack, a.activation, a.routed_expert)) return;
    if (fp32_gelu(stack, a.activation, a.routed_expert))
        return launch_each_at_start(es, a.rows, a.num_rows, a.first_row, [a, fp32_gelu_kernels](std::int64_t rows) {
            return fp32_gelu_kernels(rows, a.ffn, a.dtype);
        });
    es.launch_sized_at_start(name, [a] { return op_cost(a, rows_in_use(a.rows, a.num_rows, a.first_row)); });
}
}  // namespace
void activation_forward(const ActivationArgs& a, Stream& s) {
    launch_activation("activation_forward", a, fp32_gelu_forward, s);
}
void activation_backward(const ActivationBackwardArgs& a, Stream& s) {
    launch_activation("activation_backward", a, fp32_gelu_backward, s);
}

void gated_add(const GatedAddArgs& a, Stream& s) { timed("gated_add", op_cost(a), s); }
void gated_add_backward(const GatedAddBackwardArgs& a, Stream& s) { timed("gated_add_backward", op_cost(a), s); }

// Payloads are never written, so nothing is non-finite.
void count_nonfinite(const void*, std::int64_t n, DType dtype, std::int64_t* count, std::int64_t* first_index,
                     Stream& s) {
    as_emu(s).launch("count_nonfinite", count_nonfinite_cost(n, dtype), [count, first_index] {
        *count = 0;
        *first_index = -1;
    });
}

void convert(const void*, DType src_dtype, void*, DType dst_dtype, std::int64_t n, Stream& s) {
    timed("convert", convert_cost(src_dtype, dst_dtype, n), s);
}

void regroup(const RegroupArgs& a, Stream& s) {
    as_emu(s).launch_sized_at_start("regroup",
                                    [a] { return op_cost(a, sum(a.counts, std::int64_t{a.num_sources} * a.num_local_experts)); });
}

void copy_row_segments(const RowSegmentsArgs& a, Stream& s) {
    as_emu(s).launch_sized_at_start("copy_row_segments", [a] { return op_cost(a, sum(a.counts, a.num_segments)); });
}

// With the stack's fp32 RMSNorm (stack.h: LLaMA's reference code), its eager passes in place of
// scmoe's fused kernels. Not counted: the fp32 tensors autograd saves for them.
void rmsnorm_forward(const RmsNormArgs& a, Stream& s) {
    EmuStream& es = as_emu(s);
    if (!es.device().stack().norm_f32) return timed("rmsnorm_forward", op_cost(a), s);
    for (const StackKernel& k : fp32_rmsnorm_forward(a.tokens, a.hidden, a.dtype)) es.launch(k.name, k.cost);
}
void rmsnorm_backward(const RmsNormBackwardArgs& a, Stream& s) {
    EmuStream& es = as_emu(s);
    if (!es.device().stack().norm_f32) return timed("rmsnorm_backward", op_cost(a), s);
    for (const StackKernel& k :
         fp32_rmsnorm_backward(a.tokens, a.hidden, a.dtype, a.accumulate, a.grad_weight != nullptr))
        es.launch(k.name, k.cost);
}
// The stack's attention (stack.h): scmoe's fused kernel (at the GPU's measured fused-attention rate,
// GpuSpec::fused_attention), or the unfused kernels a framework runs.
// A forward that keeps its statistics for a backward (lse set) is a training forward: only it runs
// the dropout pass and keeps the score-sized tensors autograd saves, held under the output buffer
// (the backward names the same one) until the backward frees them. The score-sized tensors are
// allocated and freed in host order as PyTorch's autograd does (stack.h, unfused_attention_memory);
// the emulated device counts them against its capacity and in its peak.
void attention_forward(const AttentionArgs& a, Stream& s) {
    EmuStream& es = as_emu(s);
    EmuDevice& device = es.device();
    const Stack& stack = device.stack();
    if (stack.attention == AttentionImpl::kFused) {
        OpCost c = op_cost(a);
        c.efficiency = fused_attention_efficiency(device.spec(), static_cast<double>(a.head_dim), false) /
                       device.spec().gemm_efficiency;
        return timed("attention_forward", c, s);
    }
    const bool training = a.lse != nullptr;
    const ScorePasses passes = score_passes(stack, training);
    const UnfusedAttentionMemory m = unfused_attention_memory(a.batch, a.heads, a.seq, a.dtype, passes.softmax_f32);
    void* scores = device.allocate(m.scores);  // QK^T, then each pass's new scores: the softmax's input
    auto next_scores = [&](std::size_t bytes) {
        void* next = device.allocate(bytes);
        device.deallocate(scores);
        scores = next;
    };
    if (passes.scale_scores) next_scores(m.scores);
    if (passes.mask_add && a.causal) next_scores(m.scores);
    if (passes.bias) next_scores(m.scores);
    if (passes.softmax_cast_in && a.dtype != DType::kF32) next_scores(m.probs);  // fp32 scores (fp32: no cast)
    void* probs = nullptr;
    if (training)
        device.hold(a.out, kSavedProbs, m.probs);  // softmax's output: softmax's backward reads it
    else
        probs = device.allocate(m.probs);
    device.deallocate(scores);
    // PV's input when it is not the softmax's output: dropout's output, or (fp32 softmax) its fp16 cast,
    // saved by bmm in training; with both, the fp32 dropped probabilities live until the cast.
    void* dropped = nullptr;
    if (passes.dropout) device.hold(a.out, kSavedMask, m.mask);  // dropout's mask
    if (passes.dropout && passes.softmax_f32) dropped = device.allocate(m.probs);
    void* pv_input = nullptr;
    if (passes.dropout || passes.softmax_f32) {
        if (training)
            device.hold(a.out, kSavedDropped, m.scores);
        else
            pv_input = device.allocate(m.scores);
    }
    device.deallocate(dropped);
    for (const StackKernel& k : unfused_attention_forward(a, passes)) es.launch(k.name, k.cost);
    device.deallocate(pv_input);
    device.deallocate(probs);
}
void attention_backward(const AttentionBackwardArgs& a, Stream& s) {
    EmuStream& es = as_emu(s);
    EmuDevice& device = es.device();
    const Stack& stack = device.stack();
    if (stack.attention == AttentionImpl::kFused) {
        OpCost c = op_cost(a);
        c.efficiency = fused_attention_efficiency(device.spec(), static_cast<double>(a.head_dim), true) /
                       device.spec().gemm_efficiency;
        return timed("attention_backward", c, s);
    }
    const ScorePasses passes = score_passes(stack, true);
    const UnfusedAttentionMemory m = unfused_attention_memory(a.batch, a.heads, a.seq, a.dtype, passes.softmax_f32);
    void* grad_p = device.allocate(m.scores);  // dP = dO v^T (of PV's input)
    // Each pass between the softmax and PV gives the gradient of its input, freeing the one before.
    auto next_grad = [&](std::size_t bytes) {
        void* g = device.allocate(bytes);
        device.deallocate(grad_p);
        grad_p = g;
    };
    if (passes.softmax_f32) next_grad(m.probs);  // the cast's backward: dP in fp32
    if (passes.dropout) {
        next_grad(m.probs);  // dropout's backward: dP of the probabilities
        device.release(a.out, kSavedMask);
    }
    if (passes.dropout || passes.softmax_f32) device.release(a.out, kSavedDropped);
    next_grad(passes.softmax_cast_in ? m.probs : m.scores);  // softmax's backward: dS
    device.release(a.out, kSavedProbs);
    if (passes.softmax_cast_in && a.dtype != DType::kF32) next_grad(m.scores);  // the cast's backward
    if (passes.scale_scores) next_grad(m.scores);     // the division's backward
    device.deallocate(grad_p);  // after dQ and dK (host order: the caching allocator reuses it later)
    for (const StackKernel& k : unfused_attention_backward(a, passes)) es.launch(k.name, k.cost);
}
void kv_cache_append(const KvCacheAppendArgs& a, Stream& s) { timed("kv_cache_append", op_cost(a), s); }
void attention_decode(const AttentionDecodeArgs& a, Stream& s) { timed("attention_decode", op_cost(a), s); }
// With the stack's fairseq optimizer (stack.h), fairseq's FP16Optimizer and Adam passes in place of
// scmoe's fused kernel (the arguments are checked by the caller, AdamW::step, as on every backend).
void adamw_step(const AdamWArgs& a, Stream& s) {
    EmuStream& es = as_emu(s);
    if (!es.device().stack().fairseq_optimizer) return timed("adamw_step", op_cost(a), s);
    for (const StackKernel& k : fairseq_adam_step(a.n, a.param_dtype)) es.launch(k.name, k.cost);
}
void sum_of_squares(const float*, std::int64_t n, float*, void*, Stream& s) {
    timed("sum_of_squares", sum_of_squares_cost(n), s);
}
void embedding_forward(const EmbeddingArgs& a, Stream& s) { timed("embedding_forward", op_cost(a), s); }
void embedding_backward(const EmbeddingBackwardArgs& a, Stream& s) { timed("embedding_backward", op_cost(a), s); }
void cross_entropy(const CrossEntropyArgs& a, Stream& s) {
    EmuStream& es = as_emu(s);
    if (!es.device().stack().loss_f32) return timed("cross_entropy", op_cost(a), s);
    for (const StackKernel& k : fp32_loss(a.tokens, a.vocab, a.dtype, a.grad_logits != nullptr))
        es.launch(k.name, k.cost);
}

}  // namespace scmoe::emu
