// LanguageModel: the decoder-only transformer LM of LmConfig on one rank, forward and backward.
//
//   h0     = embed[ids] + pos[t % seq]                 (scmoe/kernels/embedding.h)
//   hL     = BlockStack(h0)                            (moe/: the ScMoE blocks with their overlap)
//   logits = RMSNorm(hL) . embed^T                     (tied LM head)
//   loss   = sum_t CE(logits_t, target_t) * grad_scale (scmoe/kernels/cross_entropy.h) + the MoE router losses
//
// Every op runs on the block stack's backbone stream (the stack adds its MoE stream), so a step is
// stream-ordered and, like the blocks, bitwise identical with overlap on and off.
//
// Parameters are grouped as the optimizer and the gradient reduction see them (param_groups()):
// the LM's own (embedding, positions, final norm), the blocks' backbone, and one group per MoE
// layer. Each tensor says whether it is an expert tensor (sharded over the expert-parallel group,
// reduced only across replicas of the same experts) or dense (replicated on every rank).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "scmoe/kernels/device.h"
#include "scmoe/kernels/tensor.h"
#include "scmoe/models/lm_config.h"
#include "scmoe/moe/backbone.h"
#include "scmoe/moe/block_stack.h"

namespace scmoe {
class Communicator;
class Tracer;
}  // namespace scmoe

namespace scmoe::models {

// One named tensor inside a group's flat arrays (offsets in elements). Expert tensors are
// [local experts, ...]: local expert e is global expert first_expert + e.
struct NamedTensor {
    std::string name;                 // "embed", "blocks.1.moe.expert_w1", ...
    std::vector<std::int64_t> shape;
    std::int64_t offset = 0;
    bool expert = false;
    int first_expert = 0;
    int grads_stage = 0;  // when its gradient is final in the backward (LanguageModel::GradsReadyFn)

    std::int64_t numel() const {  // elements: the product of shape
        std::int64_t n = 1;
        for (std::int64_t d : shape) n *= d;
        return n;
    }
};

// A flat parameter array (compute dtype) with its f32 gradient array of the same layout (nullptr
// for an inference-only model).
struct ParamGroup {
    std::string name;  // "lm", "backbone", "blocks.1.moe"
    void* params = nullptr;
    DType dtype = DType::kF32;
    float* grads = nullptr;
    std::int64_t numel = 0;
    std::vector<NamedTensor> tensors;
};

class LanguageModel {
  public:
    // max_tokens: most tokens per pass on this rank (a multiple of seq_len); 0: inference only, the
    // parameters without gradients (ParamGroup::grads nullptr), activations or workspace, so the
    // device holds what decoding needs (scmoe/models/decoder.h); forward passes refuse. ep: the MoE layers'
    // expert-parallel group (nullptr: single rank); it must outlive the model.
    // agree: the group the blocks' schedule is agreed over (BlockStack; nullptr = ep); a trainer
    // passes the world.
    // moe_param_device (inference only): where the MoE layers' parameters live (BlockStack), e.g.
    // pinned host memory for decoding with offloaded experts (scmoe/models/expert_cache.h); it must
    // outlive the model.
    LanguageModel(const LmConfig& config, Device& device, std::int64_t max_tokens, Communicator* ep = nullptr,
                  Communicator* agree = nullptr, Device* moe_param_device = nullptr);
    ~LanguageModel();
    LanguageModel(const LanguageModel&) = delete;
    LanguageModel& operator=(const LanguageModel&) = delete;

    const LmConfig& config() const { return config_; }
    BlockStack& blocks() { return *blocks_; }
    Device& device() { return device_; }
    Stream& stream() { return blocks_->stream(); }
    const std::vector<ParamGroup>& param_groups() const { return groups_; }
    std::int64_t num_params() const;         // this rank's parameters (its experts only)
    std::int64_t num_global_params() const;  // the whole model, every expert counted once
    // Training FLOPs per token (forward + backward = 3 x forward): 6 x the matmul parameters a
    // token uses (dense tensors, top_k experts, the tied head once; not the position table) plus
    // causal attention's 6 x layers x hidden x seq (half of the 12 L H S of full attention).
    double train_flops_per_token() const;

    // Sets every parameter from `seed`, identically whatever the expert-parallel size or rank:
    // each tensor (and each expert) draws from its own stream keyed by its name and global index.
    // Weights N(0, 0.02) (output projections scaled by 1/sqrt(2 layers)), norms 1. Synchronizes.
    void init_params(std::uint64_t seed);
    // Sets the gate-noise key of every MoE layer for the next forward (BlockStack::set_noise_key):
    // with noise_std > 0, training noise is a function of (noise_seed, step, stream), so calling it
    // with (step, rank) before each step gives fresh noise per step and per rank and a resumed run
    // the noise of an uninterrupted one. Without calls, each forward advances the step by one.
    void set_noise_key(std::uint64_t step, std::uint64_t stream) { blocks_->set_noise_key(step, stream); }

    // Stages of the backward at which gradients become final, for overlapping their all-reduce with
    // the rest of the backward: 0 the head (final_norm), 1 + b block b (BlockStack::GradsReadyFn),
    // blocks + 1 the embedding (embed, which the tied head also adds to, and pos). forward_backward
    // calls the function once per stage as its gradients become final in stream order: work it
    // enqueues on `s` sees them. The order is the same on every rank: head, the blocks as they
    // complete, embedding.
    using GradsReadyFn = std::function<void(int stage, Stream& s)>;
    int num_grads_stages() const { return static_cast<int>(blocks_->config().blocks.size()) + 2; }

    // Enqueues forward and backward of one batch: inputs/targets are [tokens] host token ids in
    // [0, vocab) (checked here; copied before the call returns), tokens a multiple of seq_len.
    // Gradients are written (not accumulated) into the groups' grads; grad_scale multiplies the CE
    // gradient (1 / tokens of the global batch for a mean loss). Read the loss with loss_sum().
    // trace (optional) records every op: the blocks' (both streams), embed, head, loss_head_bwd,
    // embed_bwd.
    void forward_backward(const std::int32_t* inputs, const std::int32_t* targets, std::int64_t tokens,
                          float grad_scale, bool overlap = true, Tracer* trace = nullptr,
                          const GradsReadyFn& grads_ready = {});
    // Forward and loss only (evaluation).
    void forward(const std::int32_t* inputs, const std::int32_t* targets, std::int64_t tokens, bool overlap = true);
    // Chooses the blocks' expert slots from measured op times (BlockStack::calibrate) on this batch.
    void calibrate(const std::int32_t* inputs, const std::int32_t* targets, std::int64_t tokens);

    // Sum over the last pass's tokens of their CE loss (unscaled), in double, in token order.
    // Synchronizes; throws scmoe::Error if any token's loss is not finite.
    double loss_sum();
    // The MoE layers' weighted aux + z losses and dropped assignments of the last forward (synchronizes).
    double router_loss();
    // The logits of the last pass, [tokens, vocab] widened to f32 on the host (synchronizes).
    std::vector<float> logits();
    std::int64_t dropped_tokens();

  private:
    void upload_tokens(const std::int32_t* inputs, const std::int32_t* targets, std::int64_t tokens);
    void embed(Stream& s);  // h0 = embed[ids] + pos
    void enqueue_forward(bool overlap, Tracer* trace);
    // Per-token CE into loss_; with grad_scale, the logits are overwritten by their gradient.
    void enqueue_loss(std::optional<float> grad_scale, Stream& s);
    Tensor act(void* p) const;

    LmConfig config_;
    Device& device_;
    std::int64_t max_tokens_;
    std::unique_ptr<BlockStack> blocks_;
    ParamSet params_, grads_;  // embed [V, H], pos [S, H], final_norm [H]
    std::unique_ptr<NormSublayer> final_norm_;
    std::vector<ParamGroup> groups_;
    DeviceBuffer workspace_;
    std::int32_t *ids_ = nullptr, *targets_ = nullptr;
    void *h0_ = nullptr, *hl_ = nullptr, *hn_ = nullptr, *logits_ = nullptr, *grad_hn_ = nullptr,
         *grad_hl_ = nullptr, *grad_h0_ = nullptr;
    float* loss_ = nullptr;
    std::vector<std::int32_t> host_ids_, host_targets_;
    std::vector<float> host_loss_;
    std::int64_t tokens_ = 0;
};

}  // namespace scmoe::models
