// BlockStack: transformer blocks whose FFN is a dense MLP or an MoE, with the MoE's routed experts
// fed from a shortcut (ScMoE) or from the current representation (standard MoE), run forward and
// backward by the LayerScheduler so each MoE branch's all-to-all overlaps backbone compute.
//
// Block b maps H_b to H_{b+1}:
//   H_b^MH  = H_b + Attn_b(RMSNorm(H_b))
//   dense:   H_{b+1} = H_b^MH + MLP_b(RMSNorm(H_b^MH))
//   MoE:     x = RMSNorm_x(H_b^MH);  s = x (current) or RMSNorm_s(S) with the shortcut S =
//              Pos-1: H_b (the previous block's output)      Pos-2: H_{b-1}^MH (its post-attention)
//              Pos-3: H_{b-1} (its input)
//            H_{b+1} = H_b^MH + sum_j G(s)_j E_j(s) [+ c * SE(x)]   (MoeLayer: routed on s, shared on x)
// The pair the ScMoE paper studies is two blocks [dense, MoE]; the every-block layouts are MoE blocks
// with Pos-1 shortcuts (block b's dispatch overlaps block b-1's FFN) or on the current
// representation (the LLaMA2-MoE baselines). block_variant() builds the paper's configurations.
//
// Overlap never changes numerics: outputs and every gradient are bitwise identical with overlap
// on and off (every op writes its own buffers; all accumulations run on the backbone stream in
// program order).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "scmoe/kernels/device.h"
#include "scmoe/kernels/tensor.h"
#include "scmoe/moe/backbone.h"
#include "scmoe/moe/config.h"
#include "scmoe/moe/layer_scheduler.h"
#include "scmoe/moe/moe_layer.h"
#include "scmoe/moe/params.h"

namespace scmoe {

class Communicator;
class Tracer;

enum class FfnKind { kDense, kMoe };
enum class ShortcutSource { kCurrent, kPos1, kPos2, kPos3 };
const char* shortcut_source_name(ShortcutSource s);  // "current", "pos1", ...

struct BlockSpec {
    FfnKind ffn = FfnKind::kDense;
    ShortcutSource shortcut = ShortcutSource::kCurrent;  // MoE blocks only; Pos-2/3 need b >= 1
};

struct BlockStackConfig {
    BackboneShape backbone;        // hidden, heads, seq_len, dense MLP ffn, activation, dtype
    MoeConfig moe;                 // every MoE block's layer (hidden and dtype must match the backbone)
    std::vector<BlockSpec> blocks;  // 1 .. 65,536 blocks (more is refused as a corrupted count)
    // Throws naming the field: shapes, a shortcut that points before block 0, hidden/dtype mismatch.
    void validate() const;
    std::string to_string() const;
};

// The ScMoE paper's configurations as a [dense, MoE] pair, all but top-K (K >= 3) and scmoe2 with the
// compute per token of top-2:
//   "top2"        top-2 routed on the current representation (baseline)
//   "top1"        top-1 routed on the current representation
//   "topK"        top-K routed on the current representation, any K in 1..kMaxTopK ("top3": the
//                 paper's top-3, one routed expert's compute more than top-2)
//   "shared"      shared expert + top-1, both on the current representation
//   "scmoe-pos1|scmoe-pos2|scmoe-pos3"  shared expert on the current + top-1 on the shortcut
//   "scmoe2"      shared expert on the current + top-2 on the Pos-2 shortcut
// and with an MoE in every one of `num_blocks` blocks (the paper's LLaMA2-MoE layouts, Table 2):
//   "every-block-pos1"    shared + top-1 on each block's Pos-1 shortcut (ScMoE)
//   "every-block-top2"    top-2 on the current representation (the standard MoE baseline)
//   "every-block-shared"  shared expert + top-1, both on the current representation
// and without experts:
//   "dense"       the pair with a dense MLP in both blocks (the dense model of the same backbone;
//                 no MoE layer, no exchange: a baseline, and the stages of a model without MoE)
// base: the backbone shape and the MoE's experts/ffn/dispatch; top_k, shared_expert and the
// shortcut are set here; coefficient_gate = CG-1 (false: direct add). Throws for an unknown name
// (listing the names) or a K the router cannot take.
BlockStackConfig block_variant(const std::string& name, const BackboneShape& backbone, const MoeConfig& moe_base,
                               bool coefficient_gate = true, int num_blocks = 2);
// The names block_variant accepts, with top1, top2 and top3 standing for every topK (tests and tools
// run each listed name; K > 3 needs more experts than small configurations have).
std::vector<std::string> block_variant_names();
// Whether block_variant accepts `name`: a listed name or topK for K in 1..kMaxTopK.
bool is_block_variant(const std::string& name);
// The listed names and the topK rule, for help texts and errors: "top2, top1, ...; topK for any K in 1..8".
std::string block_variant_list();
// Whether `name` is a [dense, MoE] pair (an LM tiles it over its layers) rather than an every-block
// layout (one MoE block per layer).
bool block_variant_is_pair(const std::string& name);

// The scratch group of each MoE block, in block order: blocks in one group never have branch windows
// that share a block, so their layers share one MoeLayer scratch (BlockStack). Pos-1 MoE in every
// block, or MoE in every other block: one group; Pos-2/3 MoE in adjacent blocks: two.
std::vector<int> moe_scratch_groups(const std::vector<BlockSpec>& blocks);

class BlockStack {
public:
    // max_tokens: most tokens per pass on this rank (a multiple of seq_len); 0: inference only, the
    // parameters without gradients, activations or MoE scratch (forward/backward/calibrate refuse;
    // scmoe/models/decoder.h decodes on its own buffers). ep: expert-parallel group
    // of the MoE layers (nullptr = single rank). agree: the group calibrate() averages its times over
    // (nullptr = ep). A trainer with data parallelism passes the world, so every rank chooses the
    // same slots and chunks and issues its NCCL operations in one global order (review R1: with
    // several communicators per GPU, ranks whose host launch orders differ can deadlock). The stack
    // owns its two streams.
    // moe_param_device: where the MoE layers' parameter stores are allocated (nullptr: `device`; an
    // inference-only stack decoding with host-resident experts passes pinned host memory,
    // scmoe/models/expert_cache.h).
    BlockStack(const BlockStackConfig& config, Device& device, std::int64_t max_tokens, Communicator* ep = nullptr,
               Communicator* agree = nullptr, Device* moe_param_device = nullptr);
    ~BlockStack();
    BlockStack(const BlockStack&) = delete;
    BlockStack& operator=(const BlockStack&) = delete;

    const BlockStackConfig& config() const { return config_; }
    // Parameters and gradients (f32; none for an inference-only stack), one ParamSet for the backbone of every block (attention,
    // MLP, MoE norms) and one MoeParamStore per MoE block (this rank's experts).
    const ParamSet& backbone_params() const { return backbone_params_; }
    const ParamSet& backbone_grads() const { return backbone_grads_; }
    const std::vector<std::unique_ptr<MoeParamStore>>& moe_params() const { return moe_params_; }
    const std::vector<std::unique_ptr<MoeParamStore>>& moe_grads() const { return moe_grads_; }
    std::vector<MoeLayer*> moe_layers();
    // Training (the default) or inference for every block: the MoE layers' gate noise
    // (MoeLayer::set_training) and whether attention keeps its statistics for a backward
    // (AttentionSublayer::set_training). A backward after an inference forward throws.
    void set_training(bool training);
    // Sets the gate-noise key of every MoE layer (MoeLayer::set_noise_key): the m-th MoE layer in
    // block order gets (step, stream * number of MoE layers + m), so the layers draw different noise
    // and (config noise_seed, step, stream) reproduces all of it. A trainer calls it before each
    // step's forward with (step, rank). The constructor sets (0, the ep rank); after that each layer's
    // step advances by one per training forward (calibrate() runs forwards too).
    void set_noise_key(std::uint64_t step, std::uint64_t stream);

    // Measures the ops of a forward and a backward pass on `input`/`grad_output` (values matter not)
    // and chooses every branch's expert slot (Eq. 11) and chunks; a collective over `agree` (and
    // `ep`). Runs both passes. The MoE layers that accumulate their gradients
    // (MoeLayer::set_grad_accumulation) keep them as they were; other gradients are left as a
    // backward's (the next backward writes them).
    void calibrate(const Tensor& input, const Tensor& grad_output, int repeats = 2);
    // The chunked all-to-all / expert-FFN pipeline of the MoE branches (LayerScheduler): 0 = auto
    // (the default: calibrate() chooses per branch and pass from the measured times), N >= 1 = N
    // pieces, capped at each layer's MoeLayer::max_chunks() (its local experts with expert
    // parallelism, or kMaxRowPieces slices of the rows of a single local expert; 1 on one rank, where
    // there is no exchange to pipeline). Applies at once, to the calibrated times if any. Throws for
    // N < 0 or N above that bound.
    void set_expert_chunks(int chunks);
    int expert_chunks() const { return expert_chunks_; }
    const Schedule& forward_schedule() const { return fwd_schedule_; }
    const Schedule& backward_schedule() const { return bwd_schedule_; }
    // The chosen slots and chunks, one line per MoE branch and pass.
    std::string describe_schedule() const;
    // How the passes issue their ops from the host (LayerScheduler): default IssueOrder::kBackboneAhead.
    void set_issue_order(IssueOrder order) { scheduler_->set_issue_order(order); }
    // R, the SMs the backbone leaves free while an exchange overlaps it (LayerScheduler::set_comm_sms;
    // 0 = none). Default: default_comm_sms(ep) (scmoe/comm/comm_sms.h: SCMOE_COMM_SMS, the expert-parallel
    // communicator's own count where it knows it, NCCL's channel settings, else 32).
    void set_comm_sms(int sms) { scheduler_->set_comm_sms(sms); }
    int comm_sms() const { return scheduler_->comm_sms(); }

    // input, output: [tokens, hidden] in the compute dtype, on the device. Enqueued on the stack's
    // streams; output is complete once synchronize() returns. Without calibrate(), every expert
    // FFN runs at its earliest slot.
    void forward(const Tensor& input, Tensor output, bool overlap = true, Tracer* trace = nullptr);
    // Called while backward() enqueues, once per block, as soon as every gradient of block b is
    // final in stream order: work enqueued on `backbone` there sees its backbone tensors (attention,
    // MLP or MoE norms, the shortcut's norm included) and its MoE layer's (router, shared expert,
    // experts) written. Blocks come in the order they complete, the same on every rank (roughly
    // last to first; a Pos-2/3 block after the block its shortcut reads). For overlapping the
    // gradient all-reduce with the rest of the backward.
    using GradsReadyFn = std::function<void(int block, Stream& backbone)>;

    // grad_output -> grad_input (both [tokens, hidden]); parameter gradients written.
    void backward(const Tensor& grad_output, Tensor grad_input, bool overlap = true, Tracer* trace = nullptr,
                  const GradsReadyFn& grads_ready = {});
    void synchronize();
    Stream& stream() { return *backbone_stream_; }

    // Sum of the MoE layers' aux_loss_coef * aux + z_loss_coef * z of the last forward (synchronizes).
    double router_loss();

private:
    struct Block;
    void build_plans(std::int64_t tokens);
    void require_training(const char* what) const;  // throws for an inference-only stack
    Tensor act(void* base, std::int64_t tokens) const;

    BlockStackConfig config_;
    Device& device_;
    std::int64_t max_tokens_;
    Communicator* ep_;
    std::unique_ptr<Stream> backbone_stream_, moe_stream_;  // moe_stream_: high priority (it carries the exchanges)
    std::unique_ptr<LayerScheduler> scheduler_;
    ParamSet backbone_params_, backbone_grads_;
    std::vector<std::unique_ptr<MoeParamStore>> moe_params_, moe_grads_;
    std::vector<std::unique_ptr<Block>> blocks_;
    DeviceBuffer activations_;
    std::vector<DeviceBuffer> moe_scratch_;  // shared by the MoE layers of one moe_scratch_groups group
    std::vector<void*> h_, hmh_, grad_h_, grad_hmh_;  // [blocks + 1] / [blocks] residual-stream buffers
    std::int64_t plan_tokens_ = -1;
    SchedulePlan fwd_plan_, bwd_plan_;
    std::vector<int> grads_ready_index_;  // [blocks]: the backward index where block b's gradients are final
    Schedule fwd_schedule_, bwd_schedule_;
    bool calibrated_ = false;
    int expert_chunks_ = 0;  // 0 = auto
};

}  // namespace scmoe
