// MoeLayer backward stages: combine-backward, expert backward (with weight grads), permute-backward,
// router backward, shared-expert backward.
#include "scmoe/kernels/activation.h"
#include "scmoe/kernels/elementwise.h"
#include "scmoe/kernels/error.h"
#include "scmoe/kernels/gemm.h"
#include "scmoe/kernels/permute.h"
#include "scmoe/kernels/router.h"
#include "scmoe/moe/detail/moe_layer_buffers.h"

namespace scmoe {

void MoeLayer::require_forward(const char* what) const {
    SCMOE_CHECK(forward_started_, what << ": called with no forward in flight; run forward (or the forward stages, "
                                          "from route) first");
}

void MoeLayer::backward(const Tensor& grad_y, const MoeParams& params, const MoeGrads& grads, Tensor grad_x,
                        Tensor grad_shortcut, Stream& stream) {
    require_forward("MoeLayer.backward");
    // The routed path's gradient goes to grad_shortcut after a forward with a shortcut, else to grad_x.
    if (separate_shortcut_) {
        SCMOE_CHECK(grad_shortcut.defined(), "MoeLayer.backward: the forward routed on a separate shortcut, so "
                                             "grad_shortcut must be given (the routed path's gradient goes there)");
    } else {
        SCMOE_CHECK(!grad_shortcut.defined(), "MoeLayer.backward: the forward had no shortcut (it routed on x), so "
                                              "grad_shortcut must be undefined; the whole gradient goes to grad_x");
    }
    // x feeds the output through the routed path when it is the routed input, or the shared expert.
    SCMOE_CHECK(grad_x.defined() || (separate_shortcut_ && !config_.shared_expert),
                "MoeLayer.backward: grad_x is undefined, but x feeds the layer's output");
    if (grad_x.defined()) check_tensor(grad_x, {tokens_, config_.hidden}, config_.dtype, "MoeLayer.backward: grad_x");
    if (grad_shortcut.defined())
        check_tensor(grad_shortcut, {tokens_, config_.hidden}, config_.dtype, "MoeLayer.backward: grad_shortcut");
    check_moe_params(config_, grads, DType::kF32, "MoeGrads", ep_size_);
    Tensor grad_s = separate_shortcut_ ? grad_shortcut : grad_x;
    combine_backward(grad_y, stream);
    collect_backward(stream);
    experts_backward(params, grads, stream);
    dispatch_backward(stream);
    bool accumulate = false;
    if (config_.shared_expert) {
        shared_expert_backward(grad_y, params, grads, grad_x, false, stream);
        accumulate = grad_s.data == grad_x.data;
    } else if (grad_x.defined() && grad_x.data != grad_s.data) {
        stream.fill_zero(grad_x.data, grad_x.bytes());  // x feeds nothing without a shared expert
    }
    permute_backward(grad_s, accumulate, stream);
    route_backward(params, grads, grad_s, stream);
}

void MoeLayer::combine_backward(const Tensor& grad_y, Stream& stream) {
    require_forward("MoeLayer.combine_backward");
    check_tensor(grad_y, {tokens_, config_.hidden}, config_.dtype, "MoeLayer.backward: grad_y");
    check_finite(grad_y, 2, "grad_y of backward", stream);
    CombineBackwardArgs a;
    a.tokens = tokens_;
    a.rows = rows();
    a.hidden = config_.hidden;
    a.top_k = config_.top_k;
    a.dtype = config_.dtype;
    a.grad_y = grad_y.data;
    a.yp = buf_->yp;
    a.slot_of_choice = buf_->slot_of_choice;
    a.choice_of_row = buf_->choice_of_row;
    a.gate_weight = buf_->gate_weight;
    a.grad_yp = buf_->grad_yp;
    a.grad_gate_weight = buf_->grad_gate_weight;
    scmoe::combine_backward(a, stream);
}

void MoeLayer::experts_backward(const MoeParams& params, const MoeGrads& grads, Stream& stream) {
    experts_backward_rows(params, grads, expert_range_rows(0, num_local_experts()), false, stream);
}

// Local experts [first, end) only (expert groups): each expert's weight gradient comes from its own
// rows, so a piece writes exactly the slices the whole layer would, with the same bits. A row slice
// adds its part of the weight gradient to the earlier slices' (accumulate_weights).
void MoeLayer::experts_backward_rows(const MoeParams& params, const MoeGrads& grads, const ExpertRows& rows,
                                     bool accumulate_weights, Stream& stream) {
    Buffers& b = *buf_;
    const int El = num_local_experts(), first = rows.first_expert;
    const std::int64_t Re = expert_rows(), H = config_.hidden, F = config_.ffn, I = config_.expert_inner_width();
    const bool accumulate = accumulate_grads_ || accumulate_weights;
    // cutlass-grouped overwrites its output: accumulated weight gradients take the provider auto
    // picks without it.
    const GroupedGemmProvider wgrad_provider =
        accumulate && provider_ == GroupedGemmProvider::kCutlassGrouped ? GroupedGemmProvider::kAuto : provider_;
    GroupedGemmArgs g = expert_gemm_args(b);
    g.num_groups = rows.groups;
    g.group_offsets = rows.offsets;
    g.ab_dtype = config_.dtype;

    // Second GEMM: ye = act . W2  ->  grad_act = grad_ye . W2^T,  dW2 = act^T . grad_ye
    g.k = F;
    g.n = H;
    g.kind = GroupedGemmKind::kGradInput;
    g.a = b.grad_ye;
    g.b = expert_slice(params.expert_w2, first, El);
    g.c = b.grad_act;
    g.c_dtype = config_.dtype;
    grouped_gemm(g, stream, provider_);
    // dW = a^T grad (f32) over the rows: a row slice's rows are known on the host, so it is one dense
    // GEMM that adds into the earlier slices' with beta = 1 (cuBLAS on CUDA; an adding grouped GEMM
    // would leave cutlass-grouped for a slower provider); otherwise the grouped GEMM over the groups.
    const std::size_t es = dtype_size(config_.dtype);
    auto weight_grad = [&](const void* a, std::int64_t a_width, const void* grad, std::int64_t grad_width, void* c) {
        if (rows.host_begin >= 0) {
            GemmArgs w;
            w.trans_a = true;
            w.m = a_width, w.n = grad_width, w.k = rows.host_end - rows.host_begin;
            w.beta = accumulate ? 1.0f : 0.0f;
            w.a = static_cast<const char*>(a) + static_cast<std::size_t>(rows.host_begin * a_width) * es;
            w.b = static_cast<const char*>(grad) + static_cast<std::size_t>(rows.host_begin * grad_width) * es;
            w.c = c;
            w.ab_dtype = config_.dtype;
            w.c_dtype = DType::kF32;
            gemm(w, stream);
            return;
        }
        GroupedGemmArgs wg = g;
        wg.kind = GroupedGemmKind::kGradWeight;
        wg.k = a_width, wg.n = grad_width;
        wg.a = a, wg.b = grad, wg.c = c;
        wg.c_dtype = DType::kF32;
        wg.accumulate = accumulate;
        grouped_gemm(wg, stream, wgrad_provider);
    };
    weight_grad(b.act, F, b.grad_ye, H, expert_slice(grads.expert_w2, first, El));

    ActivationBackwardArgs act{config_.activation, Re, F, config_.dtype, b.h, b.grad_act, b.grad_h,
                               expert_rows_in_use(b)};
    act.routed_expert = true;
    if (!rows.whole) {
        act.first_row = rows.offsets;
        act.num_rows = rows.offsets + rows.groups;
    }
    activation_backward(act, stream);

    // First GEMM: h = xe . W1  ->  dW1 = xe^T . grad_h,  grad_xe = grad_h . W1^T
    g.k = H;
    g.n = I;
    weight_grad(b.xe, H, b.grad_h, I, expert_slice(grads.expert_w1, first, El));
    g.kind = GroupedGemmKind::kGradInput;
    g.a = b.grad_h;
    g.b = expert_slice(params.expert_w1, first, El);
    g.c = b.grad_xe;
    g.c_dtype = config_.dtype;
    grouped_gemm(g, stream, provider_);
}

void MoeLayer::permute_backward(Tensor grad_s, bool accumulate, Stream& stream) {
    require_forward("MoeLayer.permute_backward");
    check_tensor(grad_s, {tokens_, config_.hidden}, config_.dtype, "MoeLayer.backward: grad of the shortcut");
    PermuteBackwardArgs a;
    a.tokens = tokens_;
    a.rows = rows();
    a.hidden = config_.hidden;
    a.top_k = config_.top_k;
    a.accumulate = accumulate;
    a.dtype = config_.dtype;
    a.grad_xp = buf_->grad_xp;
    a.slot_of_choice = buf_->slot_of_choice;
    a.grad_x = grad_s.data;
    scmoe::permute_backward(a, stream);
}

void MoeLayer::route_backward(const MoeParams& params, const MoeGrads& grads, Tensor grad_s, Stream& stream) {
    require_forward("MoeLayer.route_backward");
    SCMOE_CHECK(forced_index_.empty(), "MoeLayer.route_backward: forced routing is on (force_routing); the router "
                                       "has no gradient for a forced choice");
    Buffers& b = *buf_;
    const std::int64_t T = tokens_, E = config_.num_experts, H = config_.hidden;
    RouterBackwardArgs r;
    r.tokens = T;
    r.num_experts = config_.num_experts;
    r.top_k = config_.top_k;
    r.aux_loss_coef = config_.aux_loss_coef;
    r.z_loss_coef = config_.z_loss_coef;
    r.probs = b.probs;
    r.logsumexp = b.logsumexp;
    r.expert_index = b.expert_index;
    r.expert_fraction = b.expert_fraction;
    r.grad_gate_weight = b.grad_gate_weight;
    r.grad_logits = b.grad_logits;
    r.grad_dtype = config_.dtype;
    router_backward(r, stream);
    const DType dt = config_.dtype;
    // logits = s . Wg  ->  dWg = s^T . grad_logits,  grad_s += grad_logits . Wg^T
    const float grad_beta = accumulate_grads_ ? 1.0f : 0.0f;  // weight gradients: written or accumulated
    gemm({true, false, H, E, T, 1.0f, grad_beta, shortcut_.data, b.grad_logits, grads.gate_w.data, dt, DType::kF32},
         stream);
    gemm({false, true, T, H, E, 1.0f, 1.0f, b.grad_logits, params.gate_w.data, grad_s.data, dt, dt}, stream);
}

void MoeLayer::shared_expert_backward(const Tensor& grad_y, const MoeParams& params, const MoeGrads& grads,
                                      Tensor grad_x, bool accumulate, Stream& stream) {
    require_forward("MoeLayer.shared_expert_backward");
    check_tensor(grad_x, {tokens_, config_.hidden}, config_.dtype, "MoeLayer.backward: grad_x");
    Buffers& b = *buf_;
    const std::int64_t T = tokens_, H = config_.hidden, Fs = config_.shared_ffn_width();
    const std::int64_t Is = activation_input_width(config_.activation, Fs);
    const DType dt = config_.dtype;
    const float beta = accumulate ? 1.0f : 0.0f;              // grad_x: written or added to
    const float grad_beta = accumulate_grads_ ? 1.0f : 0.0f;  // weight gradients: written or accumulated
    gated_add_backward({T, H, dt, config_.coefficient_gate ? b.cg_logit : nullptr, b.shared_out, grad_y.data,
                        b.grad_shared_out, b.grad_cg_logit},
                       stream);
    // out = act . W2s
    gemm({false, true, T, Fs, H, 1.0f, 0.0f, b.grad_shared_out, params.shared_w2.data, b.grad_shared_act, dt, dt},
         stream);
    gemm({true, false, Fs, H, T, 1.0f, grad_beta, b.shared_act, b.grad_shared_out, grads.shared_w2.data, dt,
          DType::kF32},
         stream);
    activation_backward({config_.activation, T, Fs, dt, b.shared_h, b.grad_shared_act, b.grad_shared_h}, stream);
    // h = x . W1s
    gemm({true, false, H, Is, T, 1.0f, grad_beta, x_.data, b.grad_shared_h, grads.shared_w1.data, dt, DType::kF32},
         stream);
    gemm({false, true, T, H, Is, 1.0f, beta, b.grad_shared_h, params.shared_w1.data, grad_x.data, dt, dt}, stream);
    if (config_.coefficient_gate) {
        // cg_logit = x . w_cg
        gemm({true, false, H, 1, T, 1.0f, grad_beta, x_.data, b.grad_cg_logit, grads.cg_w.data, dt, DType::kF32},
             stream);
        gemm({false, true, T, H, 1, 1.0f, 1.0f, b.grad_cg_logit, params.cg_w.data, grad_x.data, dt, dt}, stream);
    }
}

}  // namespace scmoe
