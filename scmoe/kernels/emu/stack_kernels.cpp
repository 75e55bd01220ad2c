#include "scmoe/kernels/emu/stack_kernels.h"

#include <cmath>

#include "scmoe/kernels/activation.h"
#include "scmoe/kernels/elementwise.h"
#include "scmoe/kernels/error.h"

namespace scmoe::emu {
namespace {

double d(std::int64_t v) { return static_cast<double>(v); }

// A batched GEMM of `count` [m, k] x [k, n] products; reads `read` and writes `written` bytes.
OpCost batched_gemm(std::int64_t count, std::int64_t m, std::int64_t n, std::int64_t k, double read,
                    double written) {
    OpCost c;
    c.unit = OpUnit::kTensor;
    c.flops = 2.0 * d(count) * d(m) * d(n) * d(k);
    c.bytes = read + written;
    c.threads = d(count) * gemm_threads(m, n);
    c.gemm_m = m, c.gemm_n = n, c.gemm_k = k, c.gemm_count = count;
    return c;
}

}  // namespace

UnfusedAttentionMemory unfused_attention_memory(std::int64_t batch, std::int64_t heads, std::int64_t seq,
                                                DType dtype, bool softmax_f32) {
    const std::size_t scores = static_cast<std::size_t>(batch * heads * seq * seq);
    return {scores * dtype_size(dtype), scores * (softmax_f32 ? 4 : dtype_size(dtype)), scores};
}

// Unfused attention, PyTorch 1.x's F.multi_head_attention_forward core (stack.cpp's paper
// stack quotes it), with B = batch*heads GEMMs, S = B*s*s score elements, Q = batch*s*heads*d
// elements of q (or k, v, out), e = the op's dtype size (fairseq --fp16: 2; the scores, softmax and
// dropout run in it), p = the probabilities' size (e, or 4 with softmax_f32), full (not causal) score
// matrices: the batched GEMMs compute every score and, causal, the mask sets the upper triangle to
// -inf. Without causal (AttentionArgs::causal false) there is no attn_mask: PyTorch runs bmm(q, k^T)
// instead of baddbmm and reads no mask. Each kernel reads and writes its operands once (op_cost.h):
//   attn_q_scale    q / sqrt(d): reads and writes Q                        (without scale_scores)
//   attn_repeat_kv  GQA (kv_heads < heads): k and v repeated to every query head, as an eager GQA must
//                   before bmm (LLaMA's reference: repeat_kv, "expand(...).reshape(...)", a copy);
//                   reads 2 KV, writes 2Q (KV: the elements of k at kv_heads)
//   attn_qk_bmm     baddbmm(mask, q, k^T): 2*S*d FLOPs; reads q, k (2Q) and the mask as C (S), writes S
//                   (non-causal, or with mask_add: bmm(q, k^T), reads 2Q only)
//   attn_scores_scale  scores / sqrt(d): reads S, writes S                 (with scale_scores)
//   attn_mask_add   scores + mask: reads S and the mask (s*s, broadcast), writes S  (causal, with mask_add)
//   (with bias)     the bias table's kernels (bias_table_forward), then
//   attn_bias_add   reads S and the bias (h*s*s), writes S
//   attn_scores_cast  scores.float(): reads S (e), writes S (4)            (with softmax_cast_in)
//   attn_softmax    reads S (e, or 4 after the cast), writes S (p)
//   attn_dropout    reads S, writes S (p) and its mask (S bytes)            (with dropout)
//   attn_probs_cast reads S (4), writes S (e): autocast's cast for PV       (with softmax_f32)
//   attn_pv_bmm     bmm(p, v): 2*S*d FLOPs; reads S and Q, writes Q
//   attn_out_copy   transpose(0, 1).contiguous(): reads and writes Q
namespace {

// Swin's continuous relative position bias for a window of s = w*w tokens: cpb_mlp (nn.Linear(2, 512),
// ReLU, nn.Linear(512, h)) over the (2w - 1)^2 relative coordinates, gathered by the [s, s] relative
// position index and permuted to [h, s, s] (models/swin_transformer_moe.py, WindowAttention): tiny
// kernels, each costed as it runs (mostly its launch and the framework's time). Not counted: autocast's
// casts of the network's fp32 weights and coordinates.
constexpr std::int64_t kCpbHidden = 512;
std::int64_t bias_table_rows(std::int64_t seq) {
    const auto w = static_cast<std::int64_t>(std::llround(std::sqrt(static_cast<double>(seq))));
    return (2 * w - 1) * (2 * w - 1);
}

std::vector<StackKernel> bias_table_forward(std::int64_t heads, std::int64_t seq, DType dtype) {
    const std::int64_t t = bias_table_rows(seq), n = heads * seq * seq;
    const double e = static_cast<double>(dtype_size(dtype));
    return {{"attn_cpb_fc1", batched_gemm(1, t, kCpbHidden, 2, e * d(2 * t + 3 * kCpbHidden), e * d(t * kCpbHidden))},
            {"attn_cpb_relu", elementwise_cost(t * kCpbHidden, t * kCpbHidden, dtype)},
            {"attn_cpb_fc2", batched_gemm(1, t, heads, kCpbHidden, e * d(t * kCpbHidden + kCpbHidden * heads),
                                          e * d(t * heads))},
            {"attn_bias_gather", elementwise_cost(n, n, dtype, 0.0)},
            {"attn_bias_permute", elementwise_cost(n, n, dtype, 0.0)}};
}

// Their backward, in autograd's order: the permute's and the gather's (a zeroed table and an
// accumulating index_put), fc2's two GEMMs, the ReLU's, fc1's weight gradient (its input, the
// coordinates, needs none).
std::vector<StackKernel> bias_table_backward(std::int64_t heads, std::int64_t seq, DType dtype) {
    const std::int64_t t = bias_table_rows(seq), n = heads * seq * seq;
    const double e = static_cast<double>(dtype_size(dtype));
    return {{"attn_bias_permute_backward", elementwise_cost(n, n, dtype, 0.0)},
            {"attn_bias_gather_zero", elementwise_cost(0, t * heads, dtype, 0.0)},
            {"attn_bias_gather_backward", elementwise_cost(n, t * heads, dtype)},
            {"attn_cpb_fc2_grad_input", batched_gemm(1, t, kCpbHidden, heads, e * d(t * heads + heads * kCpbHidden),
                                                     e * d(t * kCpbHidden))},
            {"attn_cpb_fc2_grad_weight", batched_gemm(1, heads, kCpbHidden, t, e * d(t * heads + t * kCpbHidden),
                                                      e * d(heads * kCpbHidden))},
            {"attn_cpb_relu_backward", elementwise_cost(2 * t * kCpbHidden, t * kCpbHidden, dtype)},
            {"attn_cpb_fc1_grad_weight", batched_gemm(1, kCpbHidden, 2, t, e * d(t * kCpbHidden + 2 * t),
                                                      e * d(2 * kCpbHidden))}};
}

// A cast as PyTorch runs it: one kernel, or none where the dtypes agree (".float()" and "type_as" of a
// tensor already in the dtype, and "x.to(dtype)", return the tensor itself: an fp32 model casts nothing).
void push_cast(std::vector<StackKernel>& k, const char* name, DType from, DType to, std::int64_t n) {
    if (from != to) k.push_back({name, convert_cost(from, to, n)});
}

// One pass over the S scores: reads `read` and writes `written` bytes per score.
OpCost score_pass(double S, double read, double written, double flops) {
    OpCost c = elementwise_cost(0, 0, DType::kF32);
    c.bytes = (read + written) * S, c.flops = flops * S, c.threads = S / 4;
    return c;
}

}  // namespace

std::vector<StackKernel> unfused_attention_forward(const AttentionArgs& a, const ScorePasses& passes) {
    const std::int64_t B = a.batch * a.heads, q = a.batch * a.seq * a.heads * a.head_dim;
    const double e = static_cast<double>(dtype_size(a.dtype)), S = d(B) * d(a.seq) * d(a.seq), Q = d(q);
    const double p = passes.softmax_f32 ? 4.0 : e;
    std::vector<StackKernel> k;
    if (!passes.scale_scores) k.push_back({"attn_q_scale", elementwise_cost(q, q, a.dtype)});
    const std::int64_t kv = a.batch * a.seq * attention_kv_heads(a.heads, a.kv_heads) * a.head_dim;
    if (kv < q) k.push_back({"attn_repeat_kv", elementwise_cost(2 * kv, 2 * q, a.dtype, 0.0)});
    const bool mask_add = a.causal && passes.mask_add;
    const double mask = a.causal && !mask_add ? S : 0.0;  // the additive mask, baddbmm's C operand
    k.push_back({"attn_qk_bmm", batched_gemm(B, a.seq, a.seq, a.head_dim, e * (2 * Q + mask), e * S)});
    if (passes.scale_scores) k.push_back({"attn_scores_scale", score_pass(S, e, e, 1)});
    if (mask_add) {
        OpCost add = score_pass(S, e, e, 1);
        add.bytes += e * d(a.seq * a.seq);  // the [s, s] mask, broadcast over batch and heads
        k.push_back({"attn_mask_add", add});
    }
    if (passes.bias) {
        for (const StackKernel& t : bias_table_forward(a.heads, a.seq, a.dtype)) k.push_back(t);
        OpCost add = score_pass(S, e, e, 1);
        add.bytes += e * d(a.heads * a.seq * a.seq);  // the bias, broadcast over the batch
        k.push_back({"attn_bias_add", add});
    }
    if (passes.softmax_cast_in) push_cast(k, "attn_scores_cast", a.dtype, DType::kF32, B * a.seq * a.seq);
    k.push_back({"attn_softmax", score_pass(S, passes.softmax_cast_in ? 4 : e, p, 5)});
    if (passes.dropout) {
        OpCost drop = score_pass(S, p, p, 1);
        drop.bytes += S;
        k.push_back({"attn_dropout", drop});
    }
    if (passes.softmax_f32) push_cast(k, "attn_probs_cast", DType::kF32, a.dtype, B * a.seq * a.seq);
    k.push_back({"attn_pv_bmm", batched_gemm(B, a.seq, a.head_dim, a.seq, e * (S + Q), e * Q)});
    k.push_back({"attn_out_copy", elementwise_cost(q, q, a.dtype, 0.0)});
    return k;
}

// Its autograd backward, in the order autograd runs it:
//   attn_out_copy_backward   reads and writes Q
//   attn_pv_bmm_grad_p       dP = dO v^T: 2*S*d FLOPs; reads 2Q, writes S
//   attn_pv_bmm_grad_v       dV = P^T dO: 2*S*d FLOPs; reads S and Q, writes Q
//   attn_probs_cast_backward reads S (e), writes S (4)                           (with softmax_f32)
//   attn_dropout_backward    dP * mask * scale: reads S (p) and the mask (S bytes), writes S (p)  (with dropout)
//   attn_softmax_backward    reads dP and P (2 S of p), writes dS (e, or 4 with softmax_cast_in)
//   attn_scores_cast_backward  reads dS (4), writes dS (e)                        (with softmax_cast_in)
//   (with bias)              attn_bias_reduce: the bias gradient, dS summed over the batch: reads
//                            S, writes h*s*s; then the bias table's backward (bias_table_backward)
//   attn_scores_scale_backward  dS / sqrt(d): reads S, writes S                   (with scale_scores)
//   attn_qk_bmm_grad_q       dQ = dS k: 2*S*d FLOPs; reads S and Q, writes Q
//   attn_qk_bmm_grad_k       dK = dS^T q: 2*S*d FLOPs; reads S and Q, writes Q
//   attn_q_scale_backward    reads and writes Q                                 (without scale_scores)
//   attn_repeat_kv_backward  GQA: dK and dV summed over each group's heads: reads 2Q, writes 2 KV
// The additive mask's (and the bias add's) gradient for the scores is the incoming one (autograd
// passes it through: no kernel, with mask_add too); without causal there is no mask and the same kernels run (bmm's
// backward is baddbmm's without C).
std::vector<StackKernel> unfused_attention_backward(const AttentionBackwardArgs& a, const ScorePasses& passes) {
    const std::int64_t B = a.batch * a.heads, q = a.batch * a.seq * a.heads * a.head_dim;
    const double e = static_cast<double>(dtype_size(a.dtype)), S = d(B) * d(a.seq) * d(a.seq), Q = d(q);
    const double p = passes.softmax_f32 ? 4.0 : e;
    std::vector<StackKernel> k;
    k.push_back({"attn_out_copy_backward", elementwise_cost(q, q, a.dtype, 0.0)});
    k.push_back({"attn_pv_bmm_grad_p", batched_gemm(B, a.seq, a.seq, a.head_dim, e * 2 * Q, e * S)});
    k.push_back({"attn_pv_bmm_grad_v", batched_gemm(B, a.seq, a.head_dim, a.seq, e * (S + Q), e * Q)});
    if (passes.softmax_f32) push_cast(k, "attn_probs_cast_backward", a.dtype, DType::kF32, B * a.seq * a.seq);
    if (passes.dropout) {
        OpCost drop = score_pass(S, p, p, 1);
        drop.bytes += S;
        k.push_back({"attn_dropout_backward", drop});
    }
    k.push_back({"attn_softmax_backward", score_pass(S, 2 * p, passes.softmax_cast_in ? 4 : e, 3)});
    if (passes.softmax_cast_in) push_cast(k, "attn_scores_cast_backward", DType::kF32, a.dtype, B * a.seq * a.seq);
    if (passes.bias) {
        OpCost reduce = score_pass(S, e, 0, 1);
        reduce.bytes += e * d(a.heads * a.seq * a.seq);
        k.push_back({"attn_bias_reduce", reduce});
        for (const StackKernel& t : bias_table_backward(a.heads, a.seq, a.dtype)) k.push_back(t);
    }
    if (passes.scale_scores) k.push_back({"attn_scores_scale_backward", score_pass(S, e, e, 1)});
    k.push_back({"attn_qk_bmm_grad_q", batched_gemm(B, a.seq, a.head_dim, a.seq, e * (S + Q), e * Q)});
    k.push_back({"attn_qk_bmm_grad_k", batched_gemm(B, a.seq, a.head_dim, a.seq, e * (S + Q), e * Q)});
    if (!passes.scale_scores) k.push_back({"attn_q_scale_backward", elementwise_cost(q, q, a.dtype)});
    const std::int64_t kv = a.batch * a.seq * attention_kv_heads(a.heads, a.kv_heads) * a.head_dim;
    if (kv < q) k.push_back({"attn_repeat_kv_backward", elementwise_cost(2 * q, 2 * kv, a.dtype)});
    return k;
}

// Tutel's dispatch, from microsoft/tutel 82af7aa: moe_layer.py casts the layer input to fp32 ("x.to(
// logits_dtype)"), fast_encode runs GatingEncoder in fp32 ("dispatched_input = torch.zeros([
// num_global_experts * capacity, model_dim], ...)", then "for g, i, l in zip(...): func_fwd(...)": one
// scatter per choice), and ".to(x.dtype)" casts the capacity buffer back for the all-to-all;
// fast_decode casts the expert outputs to fp32 ("y.to(logits_dtype)"), GatingDecoder runs one gather
// per choice into a fresh [tokens, model_dim] tensor ("single_output = torch.empty(...)",
// "last_result = single_output if last_result is None else last_result + single_output": k - 1
// adds) and ".to(original_dtype)" casts the result back. Their backwards (fast_dispatch.py
// GatingDecoder.backward: "grad_expert_output = torch.zeros(...)", one func_fwd per choice and one
// func_bwd_gate per choice for the gate gradients; GatingEncoder.backward: one func_bwd_data per
// choice and the adds) and the casts' backwards (casts the other way) in autograd's order. With T
// tokens, R capacity slots, H hidden, e the activations' size (2) and 4 for fp32:
//   tutel_cast_in        T*H e -> 4              tutel_zero_fill   writes R*H 4
//   tutel_encode (k x)   reads T*H 4, writes T*H 4 (a gather of x rows scattered into the buffer)
//   tutel_cast_out       R*H 4 -> e
//   decode: cast R*H e -> 4; k x gather (reads T*H 4, writes T*H 4); (k-1) x add (reads 2 T*H 4,
//   writes T*H 4); cast T*H 4 -> e. The backwards: the same kernels mirrored, and k gate-gradient
//   kernels (reads 2 T*H 4, writes T 4).
namespace {
OpCost tutel_rows(std::int64_t n) { return elementwise_cost(n, n, DType::kF32, 0.0); }
OpCost tutel_add(std::int64_t n) { return elementwise_cost(2 * n, n, DType::kF32); }
OpCost tutel_fill(std::int64_t n) { return elementwise_cost(0, n, DType::kF32, 0.0); }
void check_shape(const DispatchShape& d) {
    SCMOE_CHECK(d.tokens > 0 && d.rows > 0 && d.hidden > 0 && d.top_k >= 1,
                "Tutel dispatch cost: tokens " << d.tokens << ", rows " << d.rows << ", hidden " << d.hidden
                                               << ", top_k " << d.top_k << ": all must be positive");
}
}  // namespace

std::vector<StackKernel> tutel_encode_forward(const DispatchShape& d) {
    check_shape(d);
    const std::int64_t th = d.tokens * d.hidden, rh = d.rows * d.hidden;
    std::vector<StackKernel> k;
    push_cast(k, "tutel_cast_in", d.dtype, DType::kF32, th);
    k.push_back({"tutel_zero_fill", tutel_fill(rh)});
    for (int j = 0; j < d.top_k; ++j) k.push_back({"tutel_encode", tutel_rows(th)});
    push_cast(k, "tutel_cast_out", DType::kF32, d.dtype, rh);
    return k;
}

std::vector<StackKernel> tutel_decode_forward(const DispatchShape& d) {
    check_shape(d);
    const std::int64_t th = d.tokens * d.hidden, rh = d.rows * d.hidden;
    std::vector<StackKernel> k;
    push_cast(k, "tutel_cast_in", d.dtype, DType::kF32, rh);
    for (int j = 0; j < d.top_k; ++j) {
        k.push_back({"tutel_decode", tutel_rows(th)});
        if (j > 0) k.push_back({"tutel_add", tutel_add(th)});
    }
    push_cast(k, "tutel_cast_out", DType::kF32, d.dtype, th);
    return k;
}

std::vector<StackKernel> tutel_decode_backward(const DispatchShape& d) {
    check_shape(d);
    const std::int64_t th = d.tokens * d.hidden, rh = d.rows * d.hidden;
    std::vector<StackKernel> k;
    push_cast(k, "tutel_cast_out_backward", d.dtype, DType::kF32, th);
    k.push_back({"tutel_zero_fill", tutel_fill(rh)});
    for (int j = 0; j < d.top_k; ++j) k.push_back({"tutel_decode_backward", tutel_rows(th)});
    for (int j = 0; j < d.top_k; ++j)
        k.push_back({"tutel_gate_backward", elementwise_cost(2 * th, d.tokens, DType::kF32)});
    push_cast(k, "tutel_cast_in_backward", DType::kF32, d.dtype, rh);
    return k;
}

std::vector<StackKernel> tutel_encode_backward(const DispatchShape& d) {
    check_shape(d);
    const std::int64_t th = d.tokens * d.hidden, rh = d.rows * d.hidden;
    std::vector<StackKernel> k;
    push_cast(k, "tutel_cast_out_backward", d.dtype, DType::kF32, rh);
    for (int j = 0; j < d.top_k; ++j) {
        k.push_back({"tutel_encode_backward", tutel_rows(th)});
        if (j > 0) k.push_back({"tutel_add", tutel_add(th)});
    }
    push_cast(k, "tutel_cast_in_backward", DType::kF32, d.dtype, th);
    return k;
}

// fairseq's gelu (Stack::activation_f32) on rows x ffn elements of dtype e: forward "x.float()" (reads
// e, writes 4), the GELU in fp32 (scmoe's GELU kernel's cost in fp32, activation.h), ".type_as(x)"
// (reads 4, writes e). Backward in autograd's order: type_as's (e -> 4), the GELU's in fp32 (reads the
// gradient and its saved fp32 input), float()'s (4 -> e).
std::vector<StackKernel> fp32_gelu_forward(std::int64_t rows, std::int64_t ffn, DType dtype) {
    const std::int64_t n = rows * ffn;
    std::vector<StackKernel> k;
    push_cast(k, "activation_cast_in", dtype, DType::kF32, n);
    k.push_back({"activation_forward", op_cost(ActivationArgs{Activation::kGeLU, rows, ffn, DType::kF32}, rows)});
    push_cast(k, "activation_cast_out", DType::kF32, dtype, n);
    return k;
}
std::vector<StackKernel> fp32_gelu_backward(std::int64_t rows, std::int64_t ffn, DType dtype) {
    const std::int64_t n = rows * ffn;
    std::vector<StackKernel> k;
    push_cast(k, "activation_backward_cast_in", dtype, DType::kF32, n);
    k.push_back(
        {"activation_backward", op_cost(ActivationBackwardArgs{Activation::kGeLU, rows, ffn, DType::kF32}, rows)});
    push_cast(k, "activation_backward_cast_out", DType::kF32, dtype, n);
    return k;
}

// fairseq's LM loss (Stack::loss_f32) over tokens x vocab logits of dtype e: log_softmax to fp32 (reads
// e, writes 4; scmoe's 4 FLOPs an element) and nll_loss (gathers one per token); with the backward,
// nll_loss's (a zeroed fp32 [tokens, vocab], one scattered per token) and log_softmax's (reads the fp32
// gradient and output, writes e).
std::vector<StackKernel> fp32_loss(std::int64_t tokens, std::int64_t vocab, DType dtype, bool backward) {
    const std::int64_t tv = tokens * vocab;
    OpCost log_softmax = convert_cost(dtype, DType::kF32, tv);
    log_softmax.flops = 4.0 * static_cast<double>(tv);
    std::vector<StackKernel> k = {{"log_softmax", log_softmax},
                                  {"nll_loss", elementwise_cost(tokens, tokens, DType::kF32)}};
    if (backward) {
        k.push_back({"nll_loss_backward_zero", elementwise_cost(0, tv, DType::kF32, 0.0)});
        k.push_back({"nll_loss_backward", elementwise_cost(tokens, tokens, DType::kF32)});
        OpCost back = elementwise_cost(2 * tv, 0, DType::kF32, 0.0) + elementwise_cost(0, tv, dtype, 0.0);
        back.flops = 3.0 * static_cast<double>(tv);
        k.push_back({"log_softmax_backward", back});
    }
    return k;
}

// LLaMA's reference RMSNorm (Stack::norm_f32; meta-llama/llama llama/model.py, RMSNorm: "output =
// self._norm(x.float()).type_as(x)", "return output * self.weight", "_norm: x * torch.rsqrt(x.pow(2).
// mean(-1, keepdim=True) + self.eps)") over n = T*H elements of e bytes (T tokens, H hidden), each op
// one eager kernel (the casts none in an fp32 model):
//   rmsnorm_cast_in      x.float(): reads e, writes 4
//   rmsnorm_pow          x.pow(2): reads 4, writes 4
//   rmsnorm_mean         .mean(-1): reads n 4, writes T 4
//   rmsnorm_add_eps      + eps: reads and writes T 4
//   rmsnorm_rsqrt        torch.rsqrt: reads and writes T 4
//   rmsnorm_mul          x * rsqrt: reads n 4 and T 4, writes n 4
//   rmsnorm_cast_out     .type_as(x): reads 4, writes e
//   rmsnorm_weight_mul   * self.weight: reads n e and H e, writes n e
// 28 + 4e bytes an element (scmoe's fused kernel: 2e). The backward, in autograd's order (PyTorch's
// tools/autograd/derivatives.yaml and FunctionsManual.cpp), 76 + 8e bytes an element with the weight's
// gradient (scmoe's fused kernel: 3e):
//   rmsnorm_weight_mul_backward  grad * weight: reads n e and H e, writes n e
//   rmsnorm_weight_grad_mul      (with the weight's gradient) grad * normalized: reads 2n e, writes n e
//   rmsnorm_weight_grad_sum      its sum over the tokens: reads n e, writes H e
//   rmsnorm_cast_out_backward    reads e, writes 4
//   rmsnorm_mul_backward_x       grad * rsqrt: reads n 4 and T 4, writes n 4
//   rmsnorm_mul_backward_r       (grad * x).sum(-1): a product (reads 2n 4, writes n 4), then its sum
//   rmsnorm_mul_backward_r_sum   reads n 4, writes T 4
//   rmsnorm_rsqrt_backward_*     "-0.5 * grad * result.pow(3)": three per-token kernels (a scale, the
//                                cube, the product; T 4 each in and out, 2T in for the product)
//   rmsnorm_mean_backward        the gradient expanded over H and divided: reads T 4, writes n 4
//   rmsnorm_pow_backward_*       pow_backward, "grad * (exp * self.pow(exp - 1))": self.pow(1) (a copy:
//                                reads 4, writes 4), exp * (reads 4, writes 4), grad * (reads 8, writes 4)
//   rmsnorm_grad_add             the two gradients of x.float() summed: reads 2n 4, writes n 4
//   rmsnorm_cast_in_backward     reads 4, writes e
//   rmsnorm_grad_accumulate      (residual paths) into the incoming gradient: reads 2n e, writes n e
std::vector<StackKernel> fp32_rmsnorm_forward(std::int64_t tokens, std::int64_t hidden, DType dtype) {
    const std::int64_t n = tokens * hidden;
    const DType f = DType::kF32;
    std::vector<StackKernel> k;
    push_cast(k, "rmsnorm_cast_in", dtype, f, n);
    k.push_back({"rmsnorm_pow", elementwise_cost(n, n, f)});
    k.push_back({"rmsnorm_mean", elementwise_cost(n, tokens, f)});
    k.push_back({"rmsnorm_add_eps", elementwise_cost(tokens, tokens, f)});
    k.push_back({"rmsnorm_rsqrt", elementwise_cost(tokens, tokens, f)});
    k.push_back({"rmsnorm_mul", elementwise_cost(n + tokens, n, f)});
    push_cast(k, "rmsnorm_cast_out", f, dtype, n);
    k.push_back({"rmsnorm_weight_mul", elementwise_cost(n + hidden, n, dtype)});
    return k;
}
std::vector<StackKernel> fp32_rmsnorm_backward(std::int64_t tokens, std::int64_t hidden, DType dtype, bool accumulate,
                                               bool grad_weight) {
    const std::int64_t n = tokens * hidden;
    const DType f = DType::kF32;
    std::vector<StackKernel> k = {{"rmsnorm_weight_mul_backward", elementwise_cost(n + hidden, n, dtype)}};
    if (grad_weight) {
        k.push_back({"rmsnorm_weight_grad_mul", elementwise_cost(2 * n, n, dtype)});
        k.push_back({"rmsnorm_weight_grad_sum", elementwise_cost(n, hidden, dtype)});
    }
    push_cast(k, "rmsnorm_cast_out_backward", dtype, f, n);
    k.push_back({"rmsnorm_mul_backward_x", elementwise_cost(n + tokens, n, f)});
    k.push_back({"rmsnorm_mul_backward_r", elementwise_cost(2 * n, n, f)});
    k.push_back({"rmsnorm_mul_backward_r_sum", elementwise_cost(n, tokens, f)});
    k.push_back({"rmsnorm_rsqrt_backward_scale", elementwise_cost(tokens, tokens, f)});
    k.push_back({"rmsnorm_rsqrt_backward_cube", elementwise_cost(tokens, tokens, f)});
    k.push_back({"rmsnorm_rsqrt_backward_mul", elementwise_cost(2 * tokens, tokens, f)});
    k.push_back({"rmsnorm_mean_backward", elementwise_cost(tokens, n, f)});
    k.push_back({"rmsnorm_pow_backward_copy", elementwise_cost(n, n, f, 0.0)});
    k.push_back({"rmsnorm_pow_backward_scale", elementwise_cost(n, n, f)});
    k.push_back({"rmsnorm_pow_backward_mul", elementwise_cost(2 * n, n, f)});
    k.push_back({"rmsnorm_grad_add", elementwise_cost(2 * n, n, f)});
    push_cast(k, "rmsnorm_cast_in_backward", f, dtype, n);
    if (accumulate) k.push_back({"rmsnorm_grad_accumulate", elementwise_cost(2 * n, n, dtype)});
    return k;
}

// fairseq b5e7b250's optimizer step under --fp16 --fp16-no-flatten-grads with its own Adam
// (Stack::fairseq_optimizer), on n parameters: the model's in e bytes (param_dtype), fp32 copies (p32),
// their fp32 gradients and Adam's two fp32 moments. trainer.py's train_step multiplies the gradients
// lazily ("self.optimizer.multiply_grads(numer / (sample_size or 1.0))"), then clip_grad_norm, then the
// step, then zero_grad; fp16_optimizer.py and adam.py run, per tensor:
//   fp16_grads_to_fp32  _sync_fp16_grads_to_fp32: "p32.grad.data.copy_(p.grad.data)"     reads e, writes 4
//   unscale_grads       _unscale_grads (fairseq's Adam has no step with scale, so the factor, never 1
//                       with a loss scale, is applied): "p.grad.data.mul_(c)"            reads 4, writes 4
//   adam_exp_avg_mul    "exp_avg.mul_(beta1)"                                            reads 4, writes 4
//   adam_exp_avg_add    ".add_(grad, alpha=1 - beta1)"                                   reads 8, writes 4
//   adam_exp_avg_sq_mul "exp_avg_sq.mul_(beta2)"                                         reads 4, writes 4
//   adam_exp_avg_sq_addcmul ".addcmul_(grad, grad, value=1 - beta2)" (grad read once)    reads 8, writes 4
//   adam_denom_sqrt     "denom = exp_avg_sq.sqrt()"                                      reads 4, writes 4
//   adam_denom_add_eps  ".add_(group[\"eps\"])"                                          reads 4, writes 4
//   adam_param_addcdiv  "p_data_fp32.addcdiv_(exp_avg, denom, value=-step_size)"         reads 12, writes 4
//   fp32_params_to_fp16 _sync_fp32_params_to_fp16: "p.data.copy_(p32.data)"              reads 4, writes e
//   zero_fp32_grads     zero_grad: "p32.grad.zero_()"                                    writes 4
// 92 + 2e bytes a parameter (scmoe's fused AdamW: 28 + e). An fp32 model has no FP16Optimizer (trainer.py
// builds it only under --fp16, --bf16 or --amp): the gradients are multiplied in place
// (FairseqOptimizer.multiply_grads: "p.grad.data.mul_(c)", named unscale_grads here too), Adam runs its
// seven passes, and zero_grad sets "p.grad = None" (no kernel): 80 bytes a parameter. Weight decay adds
// no pass: FairseqAdamConfig's "weight_decay: float = field(default=0.0" and run_fairseq.sh passes none.
// Not here: the norm (clip_grad_norm's per-tensor "torch.norm(g, p=2, dtype=torch.float32)", one fp32
// read of the non-expert gradients, for which the trainer's own sum of squares over all of them stands),
// the fp16 gradients' memory beside the fp32 ones, and the framework time of running each pass once per
// tensor (charged once per pass: the passes are whole buffers here).
std::vector<StackKernel> fairseq_adam_step(std::int64_t n, DType param_dtype) {
    SCMOE_CHECK(n >= 0, "fairseq_adam_step: n = " << n << ", expected >= 0");
    const DType f = DType::kF32;
    const bool fp16_optimizer = param_dtype != f;
    std::vector<StackKernel> k;
    if (fp16_optimizer) k.push_back({"fp16_grads_to_fp32", convert_cost(param_dtype, f, n)});
    k.push_back({"unscale_grads", elementwise_cost(n, n, f)});
    k.push_back({"adam_exp_avg_mul", elementwise_cost(n, n, f)});
    k.push_back({"adam_exp_avg_add", elementwise_cost(2 * n, n, f, 2.0)});
    k.push_back({"adam_exp_avg_sq_mul", elementwise_cost(n, n, f)});
    k.push_back({"adam_exp_avg_sq_addcmul", elementwise_cost(2 * n, n, f, 3.0)});
    k.push_back({"adam_denom_sqrt", elementwise_cost(n, n, f)});
    k.push_back({"adam_denom_add_eps", elementwise_cost(n, n, f)});
    k.push_back({"adam_param_addcdiv", elementwise_cost(3 * n, n, f, 3.0)});
    if (fp16_optimizer) {
        k.push_back({"fp32_params_to_fp16", convert_cost(f, param_dtype, n)});
        k.push_back({"zero_fp32_grads", elementwise_cost(0, n, f, 0.0)});
    }
    return k;
}

}  // namespace scmoe::emu
