#include "scmoe/moe/backbone.h"

#include "scmoe/kernels/attention.h"
#include "scmoe/kernels/error.h"
#include "scmoe/kernels/gemm.h"
#include "scmoe/kernels/rmsnorm.h"
#include "scmoe/kernels/workspace.h"

namespace scmoe {
namespace {

void check_shape(const BackboneShape& s, std::int64_t max_tokens, const char* what) {
    validate_backbone_shape(s, what);
    SCMOE_CHECK(max_tokens >= 0, what << ": max_tokens = " << max_tokens);
}

std::int64_t check_tokens(const BackboneShape& s, std::int64_t max_tokens, const Tensor& h, const Tensor& out,
                          const char* what) {
    const std::int64_t T = h.ndim == 2 ? h.dim(0) : -1;
    SCMOE_CHECK(T >= 0 && T <= max_tokens && T % s.seq_len == 0,
                what << ": input " << describe(h) << ": expected [tokens, " << s.hidden << "] with tokens <= "
                     << max_tokens << " and a multiple of seq_len " << s.seq_len);
    check_tensor(h, {T, s.hidden}, s.dtype, what);
    check_tensor(out, {T, s.hidden}, s.dtype, what);
    return T;
}

void check_params(const std::vector<ParamSpec>& specs, const std::vector<Tensor>& t, const char* what) {
    SCMOE_CHECK(t.size() == specs.size(), what << ": " << t.size() << " tensors, expected " << specs.size());
    for (std::size_t i = 0; i < specs.size(); ++i) {
        bool ok = t[i].data && t[i].ndim == static_cast<int>(specs[i].shape.size());
        for (std::size_t d = 0; ok && d < specs[i].shape.size(); ++d) ok = t[i].dim(static_cast<int>(d)) == specs[i].shape[d];
        SCMOE_CHECK(ok, what << "." << specs[i].name << ": got " << describe(t[i]));
    }
}

// out = in (copy) then out += a . b (beta = 1): the residual add folded into the GEMM.
void residual_gemm(const void* in, const void* a, const void* b, void* out, std::int64_t m, std::int64_t n,
                   std::int64_t k, DType dt, Stream& stream) {
    stream.copy(out, in, static_cast<std::size_t>(m * n) * dtype_size(dt));
    gemm({false, false, m, n, k, 1.0f, 1.0f, a, b, out, dt, dt}, stream);
}

// Lays the buffers out with `carve` twice, sizing then real, and returns the one allocation.
template <class Carve>
DeviceBuffer allocate_carved(Device& device, Carve&& carve) {
    WorkspaceCarver sizing(nullptr);
    carve(sizing);
    DeviceBuffer buffer(device, sizing.bytes_used());
    WorkspaceCarver real(buffer.data());
    carve(real);
    return buffer;
}

}  // namespace

std::int64_t backbone_kv_heads(const BackboneShape& s) { return s.kv_heads > 0 ? s.kv_heads : s.heads; }

std::int64_t backbone_qkv_width(const BackboneShape& s) {
    return s.heads > 0 ? (s.heads + 2 * backbone_kv_heads(s)) * (s.hidden / s.heads) : 0;
}

void validate_backbone_shape(const BackboneShape& s, const char* what) {
    SCMOE_CHECK(s.hidden > 0 && s.heads > 0 && s.hidden % s.heads == 0,
                what << ": hidden " << s.hidden << " must be a positive multiple of heads " << s.heads);
    SCMOE_CHECK(s.kv_heads >= 0 && (s.kv_heads == 0 || (s.kv_heads <= s.heads && s.heads % s.kv_heads == 0)),
                what << ".kv_heads = " << s.kv_heads << " must divide heads " << s.heads << " (0: as many as heads)");
    SCMOE_CHECK(s.seq_len > 0 && s.ffn > 0,
                what << ": seq_len " << s.seq_len << " and ffn " << s.ffn << " must be > 0");
}

std::vector<ParamSpec> AttentionSublayer::param_specs(const BackboneShape& s) {
    return {{"norm_w", {s.hidden}}, {"wqkv", {s.hidden, backbone_qkv_width(s)}}, {"wo", {s.hidden, s.hidden}}};
}

AttentionSublayer::AttentionSublayer(const BackboneShape& shape, Device& device, std::int64_t max_tokens)
    : shape_(shape), max_tokens_(max_tokens) {
    check_shape(shape, max_tokens, "AttentionSublayer");
    const std::int64_t T = std::max<std::int64_t>(max_tokens, 1), H = shape.hidden, Q = backbone_qkv_width(shape);
    const std::size_t ds = dtype_size(shape.dtype);
    auto carve = [&](WorkspaceCarver& w) {
        auto take = [&](std::int64_t n) { return w.take_bytes(static_cast<std::size_t>(n) * ds); };
        normed_ = take(T * H);
        qkv_ = take(T * Q);
        attn_ = take(T * H);
        grad_attn_ = take(T * H);
        grad_qkv_ = take(T * Q);
        grad_normed_ = take(T * H);
        rstd_ = w.take<float>(T);
        lse_ = w.take<float>(T * shape.heads);
    };
    workspace_ = allocate_carved(device, carve);
}

void AttentionSublayer::forward(const Tensor& h, const std::vector<Tensor>& p, Tensor out, Stream& stream) {
    const std::int64_t T = check_tokens(shape_, max_tokens_, h, out, "AttentionSublayer.forward");
    check_params(param_specs(shape_), p, "AttentionSublayer params");
    const std::int64_t H = shape_.hidden, Q = backbone_qkv_width(shape_);
    const DType dt = shape_.dtype;
    tokens_ = T;
    h_ = h;
    saved_for_backward_ = training_;
    if (T == 0) return;
    rmsnorm_forward({T, H, shape_.norm_eps, dt, h.data, p[0].data, normed_, rstd_}, stream);
    gemm({false, false, T, Q, H, 1.0f, 0.0f, normed_, p[1].data, qkv_, dt, dt}, stream);
    attention_forward({T / shape_.seq_len, shape_.seq_len, shape_.heads, H / shape_.heads, dt, qkv_, attn_,
                       training_ ? lse_ : nullptr, backbone_kv_heads(shape_), shape_.causal},
                      stream);
    residual_gemm(h.data, attn_, p[2].data, out.data, T, H, H, dt, stream);
}

void AttentionSublayer::backward(const Tensor& grad_out, const std::vector<Tensor>& p, const std::vector<Tensor>& g,
                                 Tensor grad_in, Stream& stream) {
    check_tensor(grad_out, {tokens_, shape_.hidden}, shape_.dtype, "AttentionSublayer.backward: grad_out");
    check_tensor(grad_in, {tokens_, shape_.hidden}, shape_.dtype, "AttentionSublayer.backward: grad_in");
    check_params(param_specs(shape_), g, "AttentionSublayer grads");
    SCMOE_CHECK(saved_for_backward_, "AttentionSublayer.backward: the last forward ran in inference mode "
                                     "(set_training(false)) and kept nothing for a backward");
    const std::int64_t T = tokens_, H = shape_.hidden, Q = backbone_qkv_width(shape_);
    const DType dt = shape_.dtype, f32 = DType::kF32;
    if (T == 0) {
        for (const Tensor& t : g) stream.fill_zero(t.data, t.bytes());
        return;
    }
    // out = h + attn . Wo
    gemm({true, false, H, H, T, 1.0f, 0.0f, attn_, grad_out.data, g[2].data, dt, f32}, stream);
    gemm({false, true, T, H, H, 1.0f, 0.0f, grad_out.data, p[2].data, grad_attn_, dt, dt}, stream);
    attention_backward({T / shape_.seq_len, shape_.seq_len, shape_.heads, H / shape_.heads, dt, qkv_, attn_, lse_,
                        grad_attn_, grad_qkv_, backbone_kv_heads(shape_), shape_.causal},
                       stream);
    // qkv = normed . Wqkv
    gemm({true, false, H, Q, T, 1.0f, 0.0f, normed_, grad_qkv_, g[1].data, dt, f32}, stream);
    gemm({false, true, T, H, Q, 1.0f, 0.0f, grad_qkv_, p[1].data, grad_normed_, dt, dt}, stream);
    stream.copy(grad_in.data, grad_out.data, grad_out.bytes());
    rmsnorm_backward({T, H, shape_.norm_eps, dt, h_.data, p[0].data, rstd_, grad_normed_, grad_in.data, true,
                      static_cast<float*>(g[0].data)},
                     stream);
}

std::vector<ParamSpec> MlpSublayer::param_specs(const BackboneShape& s) {
    return {{"norm_w", {s.hidden}},
            {"w1", {s.hidden, activation_input_width(s.activation, s.ffn)}},
            {"w2", {s.ffn, s.hidden}}};
}

MlpSublayer::MlpSublayer(const BackboneShape& shape, Device& device, std::int64_t max_tokens)
    : shape_(shape), max_tokens_(max_tokens) {
    check_shape(shape, max_tokens, "MlpSublayer");
    const std::int64_t T = std::max<std::int64_t>(max_tokens, 1), H = shape.hidden, F = shape.ffn;
    const std::int64_t I = activation_input_width(shape.activation, F);
    const std::size_t ds = dtype_size(shape.dtype);
    auto carve = [&](WorkspaceCarver& w) {
        auto take = [&](std::int64_t n) { return w.take_bytes(static_cast<std::size_t>(n) * ds); };
        normed_ = take(T * H);
        hidden_ = take(T * I);
        act_ = take(T * F);
        grad_act_ = take(T * F);
        grad_hidden_ = take(T * I);
        grad_normed_ = take(T * H);
        rstd_ = w.take<float>(T);
    };
    workspace_ = allocate_carved(device, carve);
}

void MlpSublayer::forward(const Tensor& h, const std::vector<Tensor>& p, Tensor out, Stream& stream) {
    const std::int64_t T = check_tokens(shape_, max_tokens_, h, out, "MlpSublayer.forward");
    check_params(param_specs(shape_), p, "MlpSublayer params");
    const std::int64_t H = shape_.hidden, F = shape_.ffn, I = activation_input_width(shape_.activation, F);
    const DType dt = shape_.dtype;
    tokens_ = T;
    h_ = h;
    if (T == 0) return;
    rmsnorm_forward({T, H, shape_.norm_eps, dt, h.data, p[0].data, normed_, rstd_}, stream);
    gemm({false, false, T, I, H, 1.0f, 0.0f, normed_, p[1].data, hidden_, dt, dt}, stream);
    activation_forward({shape_.activation, T, F, dt, hidden_, act_}, stream);
    residual_gemm(h.data, act_, p[2].data, out.data, T, H, F, dt, stream);
}

void MlpSublayer::backward(const Tensor& grad_out, const std::vector<Tensor>& p, const std::vector<Tensor>& g,
                           Tensor grad_in, Stream& stream) {
    check_tensor(grad_out, {tokens_, shape_.hidden}, shape_.dtype, "MlpSublayer.backward: grad_out");
    check_tensor(grad_in, {tokens_, shape_.hidden}, shape_.dtype, "MlpSublayer.backward: grad_in");
    check_params(param_specs(shape_), g, "MlpSublayer grads");
    const std::int64_t T = tokens_, H = shape_.hidden, F = shape_.ffn, I = activation_input_width(shape_.activation, F);
    const DType dt = shape_.dtype, f32 = DType::kF32;
    if (T == 0) {
        for (const Tensor& t : g) stream.fill_zero(t.data, t.bytes());
        return;
    }
    gemm({true, false, F, H, T, 1.0f, 0.0f, act_, grad_out.data, g[2].data, dt, f32}, stream);
    gemm({false, true, T, F, H, 1.0f, 0.0f, grad_out.data, p[2].data, grad_act_, dt, dt}, stream);
    activation_backward({shape_.activation, T, F, dt, hidden_, grad_act_, grad_hidden_}, stream);
    gemm({true, false, H, I, T, 1.0f, 0.0f, normed_, grad_hidden_, g[1].data, dt, f32}, stream);
    gemm({false, true, T, H, I, 1.0f, 0.0f, grad_hidden_, p[1].data, grad_normed_, dt, dt}, stream);
    stream.copy(grad_in.data, grad_out.data, grad_out.bytes());
    rmsnorm_backward({T, H, shape_.norm_eps, dt, h_.data, p[0].data, rstd_, grad_normed_, grad_in.data, true,
                      static_cast<float*>(g[0].data)},
                     stream);
}

NormSublayer::NormSublayer(const BackboneShape& shape, Device& device, std::int64_t max_tokens)
    : shape_(shape),
      max_tokens_(max_tokens),
      rstd_(device, static_cast<std::size_t>(std::max<std::int64_t>(max_tokens, 1)) * sizeof(float)) {
    check_shape(shape, max_tokens, "NormSublayer");
}

void NormSublayer::forward(const Tensor& in, const Tensor& weight, Tensor out, Stream& stream) {
    const std::int64_t T = check_tokens(shape_, max_tokens_, in, out, "NormSublayer.forward");
    check_tensor(weight, {shape_.hidden}, shape_.dtype, "NormSublayer.forward: weight");
    tokens_ = T;
    in_ = in;
    if (T == 0) return;
    rmsnorm_forward({T, shape_.hidden, shape_.norm_eps, shape_.dtype, in.data, weight.data, out.data, rstd_.as<float>()},
                    stream);
}

void NormSublayer::backward(const Tensor& grad_out, const Tensor& weight, const Tensor& grad_weight, Tensor grad_in,
                            bool accumulate, Stream& stream) {
    check_tensor(grad_out, {tokens_, shape_.hidden}, shape_.dtype, "NormSublayer.backward: grad_out");
    check_tensor(grad_in, {tokens_, shape_.hidden}, shape_.dtype, "NormSublayer.backward: grad_in");
    check_tensor(grad_weight, {shape_.hidden}, DType::kF32, "NormSublayer.backward: grad_weight");
    if (tokens_ == 0) {
        stream.fill_zero(grad_weight.data, grad_weight.bytes());
        return;
    }
    rmsnorm_backward({tokens_, shape_.hidden, shape_.norm_eps, shape_.dtype, in_.data, weight.data, rstd_.as<float>(),
                      grad_out.data, grad_in.data, accumulate, static_cast<float*>(grad_weight.data)},
                     stream);
}

ParamSet::ParamSet(Device& device, std::vector<ParamSpec> specs, DType dtype) : specs_(std::move(specs)) {
    std::size_t bytes = 0;
    for (const ParamSpec& s : specs_) {
        numel_ += s.numel();
        bytes += static_cast<std::size_t>(s.numel()) * dtype_size(dtype);
    }
    buffer_ = DeviceBuffer(device, std::max<std::size_t>(bytes, 1));
    auto* base = static_cast<char*>(buffer_.data());
    std::size_t offset = 0;
    for (const ParamSpec& s : specs_) {
        Tensor t;
        t.data = base + offset;
        t.dtype = dtype;
        t.ndim = static_cast<int>(s.shape.size());
        for (std::size_t i = 0; i < s.shape.size(); ++i) t.dims[i] = s.shape[i];
        tensors_.push_back(t);
        offset += static_cast<std::size_t>(s.numel()) * dtype_size(dtype);
    }
}

}  // namespace scmoe
