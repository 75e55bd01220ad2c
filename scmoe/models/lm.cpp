#include "scmoe/models/lm.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>

#include "scmoe/comm/communicator.h"
#include "scmoe/kernels/cross_entropy.h"
#include "scmoe/kernels/embedding.h"
#include "scmoe/kernels/error.h"
#include "scmoe/kernels/gemm.h"
#include "scmoe/kernels/host_io.h"
#include "scmoe/kernels/workspace.h"
#include "scmoe/moe/keyed_normal.h"
#include "scmoe/moe/params.h"
#include "scmoe/moe/trace.h"

namespace scmoe::models {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The initial standard deviation of a tensor by its name (0: the constant 1, a norm weight).
float init_std(const std::string& name, std::int64_t layers) {
    if (ends_with(name, "norm_w") || ends_with(name, "norm_x") || ends_with(name, "norm_s") || name == "final_norm")
        return 0.0f;
    if (name == "pos") return 0.01f;
    if (ends_with(name, ".wo") || ends_with(name, ".w2") || ends_with(name, "_w2"))
        return 0.02f / std::sqrt(2.0f * static_cast<float>(layers));
    return 0.02f;
}

}  // namespace

LanguageModel::LanguageModel(const LmConfig& config, Device& device, std::int64_t max_tokens, Communicator* ep,
                             Communicator* agree, Device* moe_param_device)
    : config_(config), device_(device), max_tokens_(max_tokens) {
    config_.validate();
    SCMOE_CHECK(config_.backbone.dtype == device.compute_dtype(),
                "LanguageModel: dtype " << dtype_name(config_.backbone.dtype) << " but the "
                                        << backend_name(device.backend()) << " backend computes in "
                                        << dtype_name(device.compute_dtype()));
    SCMOE_CHECK(max_tokens >= 0 && max_tokens % config_.backbone.seq_len == 0,
                "LanguageModel: max_tokens = " << max_tokens << " must be a positive multiple of seq_len "
                                               << config_.backbone.seq_len << " (or 0: inference only)");
    const bool training = max_tokens > 0;
    blocks_ = std::make_unique<BlockStack>(config_.block_stack(), device, max_tokens, ep, agree, moe_param_device);
    const std::int64_t V = config_.vocab, H = config_.backbone.hidden, S = config_.backbone.seq_len;
    const DType dt = config_.backbone.dtype;
    const std::vector<ParamSpec> specs = {{"embed", {V, H}}, {"pos", {S, H}}, {"final_norm", {H}}};
    params_ = ParamSet(device, specs, dt);
    if (training) grads_ = ParamSet(device, specs, DType::kF32);
    final_norm_ = std::make_unique<NormSublayer>(config_.backbone, device, max_tokens);

    // Parameter groups: the LM's own, the blocks' backbone, one per MoE layer.
    auto add_set = [&](const std::string& name, const ParamSet& p, const ParamSet& g) {
        ParamGroup group{name, p.data(), dt, training ? static_cast<float*>(g.data()) : nullptr, p.numel(), {}};
        std::int64_t offset = 0;
        for (const ParamSpec& s : p.specs()) {
            group.tensors.push_back({s.name, s.shape, offset, false, 0});
            offset += s.numel();
        }
        groups_.push_back(std::move(group));
    };
    add_set("lm", params_, grads_);
    add_set("backbone", blocks_->backbone_params(), blocks_->backbone_grads());
    const int ep_size = ep ? ep->size() : 1, ep_rank = ep ? ep->rank() : 0;
    const MoeConfig& moe = blocks_->config().moe;
    const std::vector<ParamSpec> moe_specs = moe_param_specs(moe, ep_size);
    const int local_experts = moe.num_experts / ep_size;
    std::size_t m = 0;
    for (std::size_t b = 0; b < blocks_->config().blocks.size(); ++b) {
        if (blocks_->config().blocks[b].ffn != FfnKind::kMoe) continue;
        const MoeParamStore& p = *blocks_->moe_params()[m];
        float* g = training ? static_cast<float*>(blocks_->moe_grads()[m]->data()) : nullptr;
        ++m;
        const std::string prefix = "blocks." + std::to_string(b) + ".moe";
        ParamGroup group{prefix, p.data(), dt, g, p.numel(), {}};
        const Tensor* t = p.view().begin();
        for (std::size_t i = 0; i < moe_specs.size(); ++i, ++t) {
            if (moe_specs[i].shape.empty()) continue;
            const auto offset = static_cast<std::int64_t>((static_cast<const char*>(t->data) -
                                                           static_cast<const char*>(p.data())) /
                                                          static_cast<std::ptrdiff_t>(dtype_size(dt)));
            const bool expert = moe_specs[i].reduce_over == GradGroup::kExpertReplicas;
            group.tensors.push_back(
                {prefix + "." + moe_specs[i].name, moe_specs[i].shape, offset, expert, expert ? ep_rank * local_experts : 0});
        }
        groups_.push_back(std::move(group));
    }
    for (ParamGroup& g : groups_)
        for (NamedTensor& t : g.tensors) {
            if (t.name == "final_norm") t.grads_stage = 0;
            else if (t.name.rfind("blocks.", 0) == 0) t.grads_stage = 1 + std::stoi(t.name.substr(7));
            else t.grads_stage = num_grads_stages() - 1;  // embed, pos
        }

    // Workspace: token ids, activations [T, H], logits [T, V], per-token loss. None for inference.
    if (!training) return;
    const std::int64_t T = max_tokens;
    auto carve = [&](WorkspaceCarver& w) {
        ids_ = w.take<std::int32_t>(T);
        targets_ = w.take<std::int32_t>(T);
        loss_ = w.take<float>(T);
        for (void** p : {&h0_, &hl_, &hn_, &grad_hn_, &grad_hl_, &grad_h0_})
            *p = w.take_bytes(static_cast<std::size_t>(T * H) * dtype_size(dt));
        logits_ = w.take_bytes(static_cast<std::size_t>(T * V) * dtype_size(dt));
    };
    WorkspaceCarver sizing(nullptr);
    carve(sizing);
    workspace_ = DeviceBuffer(device, sizing.bytes_used());
    WorkspaceCarver real(workspace_.data());
    carve(real);
}

LanguageModel::~LanguageModel() = default;

std::int64_t LanguageModel::num_params() const {
    std::int64_t n = 0;
    for (const ParamGroup& g : groups_) n += g.numel;
    return n;
}

std::int64_t LanguageModel::num_global_params() const {
    std::int64_t n = 0;
    const int experts = config_.moe.num_experts;
    for (const ParamGroup& g : groups_)
        for (const NamedTensor& t : g.tensors)
            n += t.expert ? t.numel() / t.shape[0] * experts : t.numel();
    return n;
}

double LanguageModel::train_flops_per_token() const {
    const int top_k = blocks_->config().moe.top_k;
    double params = 0;
    for (const ParamGroup& g : groups_)
        for (const NamedTensor& t : g.tensors) {
            if (t.name == "pos") continue;
            const auto n = static_cast<double>(t.numel());
            params += t.expert ? n / static_cast<double>(t.shape[0]) * top_k : n;
        }
    return 6.0 * params + 6.0 * static_cast<double>(config_.layers * config_.backbone.hidden * config_.backbone.seq_len);
}

Tensor LanguageModel::act(void* p) const { return Tensor(p, config_.backbone.dtype, {tokens_, config_.backbone.hidden}); }

void LanguageModel::init_params(std::uint64_t seed) {
    Stream& s = stream();
    blocks_->synchronize();
    if (device_.backend() == Backend::kEmu) return;  // an emulated GPU holds no payload to initialise
    for (const ParamGroup& g : groups_) {
        std::vector<float> host(static_cast<std::size_t>(g.numel), 0.0f);
        for (const NamedTensor& t : g.tensors) {
            // The short name after the block prefix picks the init ("blocks.1.attn.wo" -> ".wo").
            const float std_dev = init_std(t.name, config_.layers);
            const std::int64_t n = t.numel();
            const std::int64_t parts = t.expert ? t.shape[0] : 1;
            for (std::int64_t e = 0; e < parts; ++e) {
                KeyedNormal rng(seed, t.name, static_cast<std::uint64_t>(t.expert ? t.first_expert + e : 0));
                float* out = host.data() + t.offset + e * (n / parts);
                for (std::int64_t i = 0; i < n / parts; ++i) out[i] = std_dev == 0.0f ? 1.0f : std_dev * rng.next();
            }
        }
        copy_from_host(host, Tensor(g.params, g.dtype, {g.numel}), s);  // converts; synchronizes
    }
}

void LanguageModel::upload_tokens(const std::int32_t* inputs, const std::int32_t* targets, std::int64_t tokens) {
    const std::int64_t S = config_.backbone.seq_len;
    SCMOE_CHECK(max_tokens_ > 0, "LanguageModel: built with max_tokens 0 (inference only: parameters without "
                                 "activations or gradients); forward passes need max_tokens > 0, decoding uses "
                                 "scmoe/models/decoder.h");
    SCMOE_CHECK(tokens > 0 && tokens <= max_tokens_ && tokens % S == 0,
                "LanguageModel: " << tokens << " tokens; expected a positive multiple of seq_len " << S
                                  << " and at most max_tokens " << max_tokens_);
    SCMOE_CHECK(inputs && targets, "LanguageModel: inputs and targets must not be null");
    for (std::int64_t t = 0; t < tokens; ++t) {
        SCMOE_CHECK(inputs[t] >= 0 && inputs[t] < config_.vocab && targets[t] >= 0 && targets[t] < config_.vocab,
                    "LanguageModel: token " << t << " has input " << inputs[t] << " / target " << targets[t]
                                            << " outside the vocabulary [0, " << config_.vocab << ")");
    }
    // The previous pass's host reads are complete (loss_sum synchronizes); the staging vectors stay
    // alive until the copies have run.
    blocks_->synchronize();
    tokens_ = tokens;
    host_ids_.assign(inputs, inputs + tokens);
    host_targets_.assign(targets, targets + tokens);
    stream().copy(ids_, host_ids_.data(), static_cast<std::size_t>(tokens) * sizeof(std::int32_t));
    stream().copy(targets_, host_targets_.data(), static_cast<std::size_t>(tokens) * sizeof(std::int32_t));
}

void LanguageModel::embed(Stream& s) {
    EmbeddingArgs e;
    e.tokens = tokens_;
    e.hidden = config_.backbone.hidden;
    e.vocab = config_.vocab;
    e.seq_len = config_.backbone.seq_len;
    e.dtype = config_.backbone.dtype;
    e.ids = ids_;
    e.table = params_[0].data;
    e.positions = params_[1].data;
    e.out = h0_;
    embedding_forward(e, s);
}

namespace {

// Enqueues fn on s as an op of the "backbone" lane (an NVTX range; a trace entry when traced).
void traced(Tracer* trace, const char* name, Stream& s, const std::function<void(Stream&)>& fn) {
    run_op(trace, name, "backbone", s, fn);
}

}  // namespace

void LanguageModel::enqueue_forward(bool overlap, Tracer* trace) {
    Stream& s = stream();
    const std::int64_t V = config_.vocab, H = config_.backbone.hidden, T = tokens_;
    const DType dt = config_.backbone.dtype;
    traced(trace, "embed", s, [&](Stream& st) { embed(st); });
    blocks_->forward(act(h0_), act(hl_), overlap, trace);
    traced(trace, "head", s, [&](Stream& st) {
        final_norm_->forward(act(hl_), params_[2], act(hn_), st);
        gemm({false, true, T, V, H, 1.0f, 0.0f, hn_, params_[0].data, logits_, dt, dt}, st);
    });
}

void LanguageModel::enqueue_loss(std::optional<float> grad_scale, Stream& s) {
    CrossEntropyArgs ce;
    ce.tokens = tokens_;
    ce.vocab = config_.vocab;
    ce.dtype = config_.backbone.dtype;
    ce.logits = logits_;
    ce.targets = targets_;
    ce.loss = loss_;
    if (grad_scale) {
        ce.grad_logits = logits_;  // in place: the logits are not needed after their gradient
        ce.grad_scale = *grad_scale;
    }
    cross_entropy(ce, s);
}

void LanguageModel::forward(const std::int32_t* inputs, const std::int32_t* targets, std::int64_t tokens,
                            bool overlap) {
    upload_tokens(inputs, targets, tokens);
    enqueue_forward(overlap, nullptr);
    enqueue_loss(std::nullopt, stream());
}

void LanguageModel::forward_backward(const std::int32_t* inputs, const std::int32_t* targets, std::int64_t tokens,
                                     float grad_scale, bool overlap, Tracer* trace,
                                     const GradsReadyFn& grads_ready) {
    upload_tokens(inputs, targets, tokens);
    enqueue_forward(overlap, trace);
    Stream& s = stream();
    const std::int64_t V = config_.vocab, H = config_.backbone.hidden, T = tokens_;
    const DType dt = config_.backbone.dtype;
    traced(trace, "loss_head_bwd", s, [&](Stream& st) {
        enqueue_loss(grad_scale, st);  // the logits become their gradient
        // Tied head: d hn = d logits . embed; d embed = d logits^T . hn (the embedding adds its part below).
        gemm({false, false, T, H, V, 1.0f, 0.0f, logits_, params_[0].data, grad_hn_, dt, dt}, st);
        gemm({true, false, V, H, T, 1.0f, 0.0f, logits_, hn_, grads_[0].data, dt, DType::kF32}, st);
        final_norm_->backward(act(grad_hn_), params_[2], grads_[2], act(grad_hl_), false, st);
    });
    if (grads_ready) grads_ready(0, s);
    BlockStack::GradsReadyFn block_ready;
    if (grads_ready) block_ready = [&grads_ready](int b, Stream& bs) { grads_ready(1 + b, bs); };
    blocks_->backward(act(grad_hl_), act(grad_h0_), overlap, trace, block_ready);
    EmbeddingBackwardArgs eb;
    eb.tokens = T;
    eb.hidden = H;
    eb.vocab = V;
    eb.seq_len = config_.backbone.seq_len;
    eb.dtype = dt;
    eb.ids = ids_;
    eb.grad_out = grad_h0_;
    eb.grad_table = grads_[0].as<float>();
    eb.accumulate_table = true;
    eb.grad_positions = grads_[1].as<float>();
    traced(trace, "embed_bwd", s, [&](Stream& st) { embedding_backward(eb, st); });
    if (grads_ready) grads_ready(num_grads_stages() - 1, s);
}

void LanguageModel::calibrate(const std::int32_t* inputs, const std::int32_t* targets, std::int64_t tokens) {
    upload_tokens(inputs, targets, tokens);
    Stream& s = stream();
    embed(s);
    s.fill_zero(grad_hl_, static_cast<std::size_t>(tokens_ * config_.backbone.hidden) * dtype_size(config_.backbone.dtype));
    blocks_->calibrate(act(h0_), act(grad_hl_));
}

double LanguageModel::loss_sum() {
    SCMOE_CHECK(tokens_ > 0, "LanguageModel.loss_sum: no pass has run");
    host_loss_.resize(static_cast<std::size_t>(tokens_));
    stream().copy(host_loss_.data(), loss_, host_loss_.size() * sizeof(float));
    blocks_->synchronize();
    double sum = 0;
    for (std::size_t t = 0; t < host_loss_.size(); ++t) {
        SCMOE_CHECK(std::isfinite(host_loss_[t]), "LanguageModel: the loss of token " << t << " is " << host_loss_[t]
                                                                                     << " (diverged or NaN input)");
        sum += host_loss_[t];
    }
    return sum;
}

std::vector<float> LanguageModel::logits() {
    SCMOE_CHECK(tokens_ > 0, "LanguageModel.logits: no pass has run");
    return copy_to_host(Tensor(logits_, config_.backbone.dtype, {tokens_ * config_.vocab}), stream());
}

double LanguageModel::router_loss() { return blocks_->router_loss(); }

std::int64_t LanguageModel::dropped_tokens() {
    std::int64_t n = 0;
    for (MoeLayer* layer : blocks_->moe_layers()) n += layer->stats(stream()).dropped_tokens;
    return n;
}

}  // namespace scmoe::models
