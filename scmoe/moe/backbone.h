// The backbone sublayers ScMoE overlaps its all-to-all with: pre-norm causal multi-head attention
// (bidirectional where BackboneShape::causal is false: encoders, SwinV2's window attention) and a
// pre-norm dense MLP, each with its residual, forward and backward.
//
//   AttentionSublayer:  out = h + Attn(RMSNorm(h) . Wqkv) . Wo     (GQA: kv_heads K/V heads)
//   MlpSublayer:        out = h + act(RMSNorm(h) . W1) . W2        (SwiGLU: W1 = [gate | up])
//
// Tokens are [batch * seq, hidden], sequence-major inside a batch. A sublayer keeps the activations
// its backward needs in its own workspace (sized once for max_tokens) and a pointer to its input,
// which must stay unchanged until backward has been enqueued. Parameters are in the compute dtype,
// gradients f32 and written (never accumulated); grad_in is written with the residual included.
#pragma once

#include <cstdint>
#include <vector>

#include "scmoe/kernels/activation.h"
#include "scmoe/kernels/device.h"
#include "scmoe/kernels/tensor.h"
#include "scmoe/moe/params.h"

namespace scmoe {

struct BackboneShape {
    std::int64_t hidden = 0;
    std::int64_t heads = 0;     // attention heads; hidden % heads == 0
    // K/V heads: grouped-query attention (scmoe/kernels/attention.h) when fewer than heads;
    // heads % kv_heads == 0. 0 (the default) means kv_heads = heads, i.e. multi-head attention.
    std::int64_t kv_heads = 0;
    std::int64_t seq_len = 0;   // tokens per sequence; every pass carries a multiple of it
    std::int64_t ffn = 0;       // dense MLP width
    Activation activation = Activation::kSwiGLU;
    DType dtype = DType::kF32;
    float norm_eps = 1e-5f;
    // Attention mask (scmoe/kernels/attention.h, AttentionArgs::causal): true (the default), query i
    // sees tokens 0..i of its sequence (decoders; language models require it); false, bidirectional:
    // every token of its sequence (encoders, vision blocks such as SwinV2's window attention).
    bool causal = true;
};

// The K/V head count of `shape`: kv_heads, or heads where it is 0.
std::int64_t backbone_kv_heads(const BackboneShape& shape);
// Width of the QKV projection's output: (heads + 2 * kv_heads) * (hidden / heads); 3H for MHA.
std::int64_t backbone_qkv_width(const BackboneShape& shape);
// Throws scmoe::Error naming the field (`what`.hidden, .heads, .kv_heads, .seq_len, .ffn) when the
// shape is not valid.
void validate_backbone_shape(const BackboneShape& shape, const char* what);

// Parameters: norm_w [H], wqkv [H, Q] with Q = backbone_qkv_width (3H without GQA), wo [H, H].
class AttentionSublayer {
public:
    AttentionSublayer(const BackboneShape& shape, Device& device, std::int64_t max_tokens);
    static std::vector<ParamSpec> param_specs(const BackboneShape& shape);  // norm_w, wqkv, wo
    // params / grads: the three tensors in param_specs order.
    void forward(const Tensor& h, const std::vector<Tensor>& params, Tensor out, Stream& stream);
    void backward(const Tensor& grad_out, const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                  Tensor grad_in, Stream& stream);
    // Training (the default): forward keeps attention's softmax statistics (lse) for backward.
    // Inference (false): forward stores none (attention_forward with lse null, which also tells the
    // emulator's unfused attention that no dropout runs); a backward after it throws.
    void set_training(bool training) { training_ = training; }

private:
    BackboneShape shape_;
    std::int64_t max_tokens_, tokens_ = 0;
    Tensor h_;
    DeviceBuffer workspace_;
    void *normed_ = nullptr, *qkv_ = nullptr, *attn_ = nullptr, *grad_attn_ = nullptr, *grad_qkv_ = nullptr,
         *grad_normed_ = nullptr;
    float *rstd_ = nullptr, *lse_ = nullptr;
    bool training_ = true, saved_for_backward_ = false;
};

// Parameters: norm_w [H], w1 [H, I] (I = 2F for SwiGLU, F for GELU), w2 [F, H].
class MlpSublayer {
public:
    MlpSublayer(const BackboneShape& shape, Device& device, std::int64_t max_tokens);
    static std::vector<ParamSpec> param_specs(const BackboneShape& shape);  // norm_w, w1, w2
    void forward(const Tensor& h, const std::vector<Tensor>& params, Tensor out, Stream& stream);
    void backward(const Tensor& grad_out, const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                  Tensor grad_in, Stream& stream);

private:
    BackboneShape shape_;
    std::int64_t max_tokens_, tokens_ = 0;
    Tensor h_;
    DeviceBuffer workspace_;
    void *normed_ = nullptr, *hidden_ = nullptr, *act_ = nullptr, *grad_act_ = nullptr, *grad_hidden_ = nullptr,
         *grad_normed_ = nullptr;
    float* rstd_ = nullptr;
};

// A standalone RMSNorm with its saved rstd: the norms in front of the MoE (x and the shortcut).
class NormSublayer {
public:
    NormSublayer(const BackboneShape& shape, Device& device, std::int64_t max_tokens);
    void forward(const Tensor& in, const Tensor& weight, Tensor out, Stream& stream);
    // grad_in (+)= RMSNorm backward of grad_out; grad_weight [H] f32 written.
    void backward(const Tensor& grad_out, const Tensor& weight, const Tensor& grad_weight, Tensor grad_in,
                  bool accumulate, Stream& stream);

private:
    BackboneShape shape_;
    std::int64_t max_tokens_, tokens_ = 0;
    Tensor in_;
    DeviceBuffer rstd_;
};

// Named parameters (or gradients) of any shapes packed back to back in one allocation (data() is
// the flat [numel] array, in specs order).
class ParamSet {
public:
    ParamSet() = default;
    ParamSet(Device& device, std::vector<ParamSpec> specs, DType dtype);
    const std::vector<ParamSpec>& specs() const { return specs_; }
    const std::vector<Tensor>& tensors() const { return tensors_; }
    const Tensor& operator[](std::size_t i) const { return tensors_[i]; }
    void* data() const { return buffer_.data(); }
    std::int64_t numel() const { return numel_; }
    std::size_t bytes() const { return buffer_.bytes(); }

private:
    std::vector<ParamSpec> specs_;
    std::vector<Tensor> tensors_;
    DeviceBuffer buffer_;
    std::int64_t numel_ = 0;
};

}  // namespace scmoe
