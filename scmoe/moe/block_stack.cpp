// BlockStack: construction, parameters, variants, and the forward/backward entry points. The
// schedule plans (which op runs where) are built in block_stack_plan.cpp.
#include "scmoe/moe/block_stack.h"

#include <algorithm>
#include <sstream>

#include "scmoe/comm/comm_sms.h"
#include "scmoe/comm/communicator.h"
#include "scmoe/kernels/error.h"
#include "scmoe/kernels/router.h"
#include "scmoe/moe/detail/block.h"

namespace scmoe {
namespace {

// Most blocks a stack may have: far beyond any model, small enough that a corrupted or mistyped
// count is refused instead of allocated.
constexpr int kMaxBlocks = 1 << 16;

}  // namespace

const char* shortcut_source_name(ShortcutSource s) {
    switch (s) {
        case ShortcutSource::kCurrent: return "current";
        case ShortcutSource::kPos1: return "pos1";
        case ShortcutSource::kPos2: return "pos2";
        case ShortcutSource::kPos3: return "pos3";
    }
    return "?";
}

void BlockStackConfig::validate() const {
    SCMOE_CHECK(!blocks.empty(), "BlockStackConfig.blocks is empty");
    SCMOE_CHECK(blocks.size() <= kMaxBlocks,
                "BlockStackConfig.blocks has " << blocks.size() << " blocks, more than the limit of " << kMaxBlocks);
    validate_backbone_shape(backbone, "BlockStackConfig.backbone");
    bool any_moe = false;
    for (std::size_t b = 0; b < blocks.size(); ++b) {
        if (blocks[b].ffn != FfnKind::kMoe) continue;
        any_moe = true;
        const ShortcutSource s = blocks[b].shortcut;
        SCMOE_CHECK(b >= 1 || (s != ShortcutSource::kPos2 && s != ShortcutSource::kPos3),
                    "BlockStackConfig.blocks[" << b << "]: shortcut " << shortcut_source_name(s)
                                               << " reads the previous block; block 0 has none");
    }
    if (any_moe) {
        moe.validate();
        SCMOE_CHECK(moe.hidden == backbone.hidden, "BlockStackConfig.moe.hidden = " << moe.hidden
                                                                                    << " differs from backbone.hidden "
                                                                                    << backbone.hidden);
        SCMOE_CHECK(moe.dtype == backbone.dtype, "BlockStackConfig.moe.dtype differs from backbone.dtype");
    }
}

std::string BlockStackConfig::to_string() const {
    std::ostringstream o;
    o << "blocks=[";
    for (std::size_t b = 0; b < blocks.size(); ++b) {
        o << (b ? "," : "")
          << (blocks[b].ffn == FfnKind::kDense ? "dense" : std::string("moe:") + shortcut_source_name(blocks[b].shortcut));
    }
    o << "] hidden=" << backbone.hidden << " heads=" << backbone.heads;
    if (backbone.kv_heads > 0 && backbone.kv_heads != backbone.heads) o << " kv_heads=" << backbone.kv_heads;
    if (!backbone.causal) o << " bidirectional";
    o << " seq=" << backbone.seq_len << " dense_ffn=" << backbone.ffn << " moe={" << moe.to_string() << "}";
    return o.str();
}

namespace {

// K of a "topK" name (K one or more digits, no sign or leading zero), else 0.
int top_k_of_variant(const std::string& name) {
    if (name.size() < 4 || name.size() > 6 || name.compare(0, 3, "top") != 0 || name[3] == '0') return 0;
    int k = 0;
    for (std::size_t i = 3; i < name.size(); ++i) {
        if (name[i] < '0' || name[i] > '9') return 0;
        k = 10 * k + (name[i] - '0');
    }
    return k;
}

bool is_every_block_variant(const std::string& name) {
    return name == "every-block-pos1" || name == "every-block-top2" || name == "every-block-shared";
}

}  // namespace

std::vector<std::string> block_variant_names() {
    return {"top2",       "top1",   "top3",             "shared",           "scmoe-pos1",         "scmoe-pos2",
            "scmoe-pos3", "scmoe2", "every-block-pos1", "every-block-top2", "every-block-shared", "dense"};
}

bool is_block_variant(const std::string& name) {
    const int k = top_k_of_variant(name);
    if (k >= 1 && k <= kMaxTopK) return true;
    const std::vector<std::string> names = block_variant_names();
    return std::find(names.begin(), names.end(), name) != names.end();
}

bool block_variant_is_pair(const std::string& name) { return !is_every_block_variant(name); }

std::string block_variant_list() {
    std::string names;
    for (const std::string& n : block_variant_names()) names += (names.empty() ? "" : ", ") + n;
    return names + "; topK for any K in 1.." + std::to_string(kMaxTopK);
}

BlockStackConfig block_variant(const std::string& name, const BackboneShape& backbone, const MoeConfig& base,
                               bool coefficient_gate, int num_blocks) {
    BlockStackConfig c;
    c.backbone = backbone;
    c.moe = base;
    c.moe.hidden = backbone.hidden;
    c.moe.dtype = backbone.dtype;
    c.moe.shared_expert = false;
    c.moe.coefficient_gate = false;
    auto pair = [&](int top_k, bool shared, ShortcutSource s) {
        c.moe.top_k = top_k;
        c.moe.shared_expert = shared;
        c.moe.coefficient_gate = shared && coefficient_gate;
        c.blocks = {BlockSpec{FfnKind::kDense, ShortcutSource::kCurrent}, BlockSpec{FfnKind::kMoe, s}};
    };
    // The LLaMA2-MoE layouts: the pair's MoE in each of `num_blocks` blocks.
    auto every_block = [&](int top_k, bool shared, ShortcutSource s) {
        SCMOE_CHECK(num_blocks >= 1 && num_blocks <= kMaxBlocks,
                    "block_variant: num_blocks = " << num_blocks << " outside [1, " << kMaxBlocks << "]");
        pair(top_k, shared, s);
        c.blocks.assign(static_cast<std::size_t>(num_blocks), BlockSpec{FfnKind::kMoe, s});
    };
    const int top_k = top_k_of_variant(name);
    if (top_k > 0) {
        SCMOE_CHECK(top_k <= kMaxTopK, "block variant '" << name << "': top-" << top_k << " exceeds the router's limit of "
                                                         << kMaxTopK << " experts per token (top1 .. top" << kMaxTopK
                                                         << ")");
        pair(top_k, false, ShortcutSource::kCurrent);
    } else if (name == "shared") pair(1, true, ShortcutSource::kCurrent);
    else if (name == "scmoe-pos1") pair(1, true, ShortcutSource::kPos1);
    else if (name == "scmoe-pos2") pair(1, true, ShortcutSource::kPos2);
    else if (name == "scmoe-pos3") pair(1, true, ShortcutSource::kPos3);
    else if (name == "scmoe2") pair(2, true, ShortcutSource::kPos2);
    else if (name == "every-block-pos1") every_block(1, true, ShortcutSource::kPos1);
    else if (name == "every-block-top2") every_block(2, false, ShortcutSource::kCurrent);
    else if (name == "every-block-shared") every_block(1, true, ShortcutSource::kCurrent);
    else if (name == "dense") {  // the pair without its MoE: a dense MLP in both blocks (no experts)
        pair(1, false, ShortcutSource::kCurrent);
        c.blocks[1] = BlockSpec{FfnKind::kDense, ShortcutSource::kCurrent};
    }
    else SCMOE_FAIL("unknown block variant '" << name << "' (one of: " << block_variant_list() << ")");
    c.validate();
    return c;
}

BlockStack::BlockStack(const BlockStackConfig& config, Device& device, std::int64_t max_tokens, Communicator* ep,
                       Communicator* agree, Device* moe_param_device)
    : config_(config),
      device_(device),
      max_tokens_(max_tokens),
      ep_(ep),
      backbone_stream_(device.create_stream()),
      // The MoE branch's stream carries the all-to-alls: high priority, so an exchange's kernels get
      // SMs ahead of the backbone's GEMMs that fill the GPU (review, issue 14 part 6).
      moe_stream_(device.create_stream(StreamPriority::kHigh)) {
    config_.validate();
    SCMOE_CHECK(max_tokens >= 0 && max_tokens % config_.backbone.seq_len == 0,
                "BlockStack: max_tokens = " << max_tokens << " must be a non-negative multiple of seq_len "
                                            << config_.backbone.seq_len);
    SCMOE_CHECK(config_.backbone.dtype == device.compute_dtype(),
                "BlockStack: dtype " << dtype_name(config_.backbone.dtype) << " but the "
                                     << backend_name(device.backend()) << " backend computes in "
                                     << dtype_name(device.compute_dtype()));
    scheduler_ = std::make_unique<LayerScheduler>(device, *backbone_stream_, *moe_stream_, agree ? agree : ep);
    // The exchanges run on the expert-parallel communicator: its channels are the SMs to keep free.
    if (ep) scheduler_->set_comm_sms(default_comm_sms(ep).sms);
    const int ep_size = ep ? ep->size() : 1;
    std::vector<ParamSpec> specs;
    const std::size_t n = config_.blocks.size();
    // The MoE layers' scratch (MoeLayer::scratch_bytes: the backward's gradients, the exchanges'
    // staging), one per group of layers whose branch windows are disjoint (moe_scratch_groups).
    const std::vector<int> scratch_group = moe_scratch_groups(config_.blocks);
    const int groups = scratch_group.empty() ? 0 : *std::max_element(scratch_group.begin(), scratch_group.end()) + 1;
    // Inference only (max_tokens 0): parameters, no scratch, gradients or activations.
    const bool training = max_tokens > 0;
    const std::size_t scratch_bytes = groups && training ? MoeLayer::scratch_bytes(config_.moe, max_tokens, ep_size) : 0;
    for (int g = 0; g < groups; ++g) moe_scratch_.emplace_back(device, scratch_bytes);
    for (std::size_t b = 0; b < n; ++b) {
        auto block = std::make_unique<Block>();
        block->spec = config_.blocks[b];
        block->param_offset = specs.size();
        const std::string prefix = "blocks." + std::to_string(b) + ".";
        for (ParamSpec s : AttentionSublayer::param_specs(config_.backbone)) {
            s.name = prefix + "attn." + s.name;
            specs.push_back(s);
        }
        block->attn = std::make_unique<AttentionSublayer>(config_.backbone, device, max_tokens);
        if (block->spec.ffn == FfnKind::kDense) {
            for (ParamSpec s : MlpSublayer::param_specs(config_.backbone)) {
                s.name = prefix + "mlp." + s.name;
                specs.push_back(s);
            }
            block->mlp = std::make_unique<MlpSublayer>(config_.backbone, device, max_tokens);
        } else {
            specs.push_back({prefix + "moe.norm_x", {config_.backbone.hidden}});
            block->norm_x = std::make_unique<NormSublayer>(config_.backbone, device, max_tokens);
            if (block->spec.shortcut != ShortcutSource::kCurrent) {
                specs.push_back({prefix + "moe.norm_s", {config_.backbone.hidden}});
                block->norm_s = std::make_unique<NormSublayer>(config_.backbone, device, max_tokens);
            }
            block->moe_index = static_cast<int>(moe_params_.size());
            DeviceBuffer& scratch = moe_scratch_[static_cast<std::size_t>(scratch_group[moe_params_.size()])];
            block->moe = std::make_unique<MoeLayer>(config_.moe, device, max_tokens, ep, nullptr, 0, scratch.data(),
                                                    scratch.bytes());
            SCMOE_CHECK(!moe_param_device || !training,
                        "BlockStack: MoE parameters outside the device are for inference only (max_tokens 0)");
            moe_params_.push_back(std::make_unique<MoeParamStore>(moe_param_device ? *moe_param_device : device,
                                                                  config_.moe, config_.moe.dtype, ep_size));
            if (training) moe_grads_.push_back(std::make_unique<MoeParamStore>(device, config_.moe, DType::kF32, ep_size));
        }
        blocks_.push_back(std::move(block));
    }
    backbone_params_ = ParamSet(device, specs, config_.backbone.dtype);
    if (training) backbone_grads_ = ParamSet(device, specs, DType::kF32);
    set_noise_key(0, static_cast<std::uint64_t>(ep ? ep->rank() : 0));
    if (!training) return;

    // Residual stream and MoE activations, each [max_tokens, hidden].
    const std::size_t slab = static_cast<std::size_t>(std::max<std::int64_t>(max_tokens, 1) * config_.backbone.hidden) *
                             dtype_size(config_.backbone.dtype);
    std::size_t count = 2 * (n + 1) + 2 * n;
    for (const auto& block : blocks_)
        if (block->moe) count += 5;
    activations_ = DeviceBuffer(device, count * slab);
    auto* next = static_cast<char*>(activations_.data());
    auto take = [&] {
        void* p = next;
        next += slab;
        return p;
    };
    for (std::size_t b = 0; b <= n; ++b) {
        h_.push_back(take());
        grad_h_.push_back(take());
    }
    for (std::size_t b = 0; b < n; ++b) {
        hmh_.push_back(take());
        grad_hmh_.push_back(take());
    }
    for (auto& block : blocks_) {
        if (!block->moe) continue;
        block->x = take();
        block->s = take();
        block->y = take();
        block->grad_x = take();
        block->grad_s = take();
    }
}

std::vector<int> moe_scratch_groups(const std::vector<BlockSpec>& blocks) {
    // A MoE block b's branch spans blocks [b-1, b] when its shortcut comes from block b-1 (Pos-2,
    // Pos-3), else [b, b], in both passes (block_stack_plan.cpp). Between disjoint windows the
    // scheduler's events order every op of the earlier branch (MoE stream and its expert slot on
    // the backbone) before any op of the later one; windows that share a block may run at once.
    // Greedy interval colouring in block order: the fewest groups.
    std::vector<int> group;
    std::vector<std::size_t> group_last_block;  // per group: the last block of its latest window
    for (std::size_t b = 0; b < blocks.size(); ++b) {
        if (blocks[b].ffn == FfnKind::kDense) continue;
        const ShortcutSource s = blocks[b].shortcut;
        const std::size_t first = (s == ShortcutSource::kPos2 || s == ShortcutSource::kPos3) && b > 0 ? b - 1 : b;
        int chosen = -1;
        for (std::size_t g = 0; g < group_last_block.size() && chosen < 0; ++g)
            if (group_last_block[g] < first) chosen = static_cast<int>(g);
        if (chosen < 0) {
            chosen = static_cast<int>(group_last_block.size());
            group_last_block.push_back(0);
        }
        group_last_block[static_cast<std::size_t>(chosen)] = b;
        group.push_back(chosen);
    }
    return group;
}

BlockStack::~BlockStack() {
    try {
        synchronize();
    } catch (const std::exception&) {
    }
}

std::vector<MoeLayer*> BlockStack::moe_layers() {
    std::vector<MoeLayer*> out;
    for (auto& b : blocks_)
        if (b->moe) out.push_back(b->moe.get());
    return out;
}

void BlockStack::set_training(bool training) {
    for (auto& b : blocks_) {
        if (b->attn) b->attn->set_training(training);
        if (b->moe) b->moe->set_training(training);
    }
}

void BlockStack::set_noise_key(std::uint64_t step, std::uint64_t stream) {
    const std::vector<MoeLayer*> layers = moe_layers();
    for (std::size_t m = 0; m < layers.size(); ++m) layers[m]->set_noise_key(step, stream * layers.size() + m);
}

Tensor BlockStack::act(void* base, std::int64_t tokens) const {
    return Tensor(base, config_.backbone.dtype, {tokens, config_.backbone.hidden});
}

void BlockStack::synchronize() {
    // Drain both streams before reporting, so no queued work outlives an error.
    std::exception_ptr first;
    for (Stream* s : {moe_stream_.get(), backbone_stream_.get()}) {
        try {
            s->synchronize();
        } catch (...) {
            if (!first) first = std::current_exception();
        }
    }
    if (first) std::rethrow_exception(first);
}

void BlockStack::require_training(const char* what) const {
    SCMOE_CHECK(max_tokens_ > 0, "BlockStack." << what << ": this stack was built with max_tokens 0 (inference only: "
                                                  "parameters without activations or gradients; decode with "
                                                  "scmoe/models/decoder.h)");
}

void BlockStack::calibrate(const Tensor& input, const Tensor& grad_output, int repeats) {
    require_training("calibrate");
    const std::int64_t T = input.ndim == 2 ? input.dim(0) : -1;
    check_tensor(input, {T, config_.backbone.hidden}, config_.backbone.dtype, "BlockStack.calibrate: input");
    check_tensor(grad_output, {T, config_.backbone.hidden}, config_.backbone.dtype,
                 "BlockStack.calibrate: grad_output");
    build_plans(T);
    synchronize();
    // The timed ops run more than once, and a row slice's weight gradients add into the earlier
    // slices': a layer that accumulates its gradients over micro-batches gets them back as they were.
    const std::vector<MoeLayer*> layers = moe_layers();
    std::vector<std::pair<MoeParamStore*, DeviceBuffer>> kept;
    for (std::size_t m = 0; m < layers.size(); ++m)
        if (layers[m]->grad_accumulation()) {
            MoeParamStore& g = *moe_grads_[m];
            kept.emplace_back(&g, DeviceBuffer(device_, g.bytes()));
            backbone_stream_->copy(kept.back().second.data(), g.data(), g.bytes());
        }
    backbone_stream_->copy(h_[0], input.data, input.bytes());
    fwd_schedule_ = scheduler_->calibrate(fwd_plan_, repeats, expert_chunks_);
    backbone_stream_->copy(grad_h_.back(), grad_output.data, grad_output.bytes());
    bwd_schedule_ = scheduler_->calibrate(bwd_plan_, repeats, expert_chunks_);
    synchronize();
    for (auto& [g, copy] : kept) backbone_stream_->copy(g->data(), copy.data(), g->bytes());
    synchronize();
    calibrated_ = true;
}

void BlockStack::set_expert_chunks(int chunks) {
    const int ep_size = ep_ ? ep_->size() : 1;
    const int local = config_.moe.num_experts / ep_size;
    // One local expert with expert parallelism: a chunk is a slice of its rows (MoeLayer).
    const bool slices = pipelines_row_slices(config_.moe.num_experts, ep_size);
    const int most = max_pipeline_pieces(config_.moe.num_experts, ep_size);
    SCMOE_CHECK(chunks >= 0 && chunks <= most,
                "BlockStack: expert chunks = " << chunks << ": must be 0 (auto) or 1.." << most << " ("
                                               << (slices ? std::string("a chunk is a slice of the rows of the one "
                                                                        "local expert of an MoE layer on each of the ")
                                                          : "a chunk is a group of the " + std::to_string(local) +
                                                                " local experts of an MoE layer on each of the ")
                                               << ep_size << " rank(s))");
    expert_chunks_ = chunks;
    if (plan_tokens_ < 0) return;  // no plans yet: build_plans applies it
    for (auto [plan, sched] : {std::pair{&fwd_plan_, &fwd_schedule_}, std::pair{&bwd_plan_, &bwd_schedule_}}) {
        choose_slots(*plan, *sched);
        choose_chunks(*plan, *sched, expert_chunks_);
    }
}

std::string BlockStack::describe_schedule() const {
    return fwd_schedule_.describe(fwd_plan_) + bwd_schedule_.describe(bwd_plan_);
}

void BlockStack::forward(const Tensor& input, Tensor output, bool overlap, Tracer* trace) {
    require_training("forward");
    const std::int64_t T = input.ndim == 2 ? input.dim(0) : -1;
    SCMOE_CHECK(T >= 0 && T <= max_tokens_ && T % config_.backbone.seq_len == 0,
                "BlockStack.forward: input " << describe(input) << ": expected [tokens, " << config_.backbone.hidden
                                             << "] with tokens <= " << max_tokens_ << " and a multiple of seq_len "
                                             << config_.backbone.seq_len);
    check_tensor(input, {T, config_.backbone.hidden}, config_.backbone.dtype, "BlockStack.forward: input");
    check_tensor(output, {T, config_.backbone.hidden}, config_.backbone.dtype, "BlockStack.forward: output");
    build_plans(T);
    backbone_stream_->copy(h_[0], input.data, input.bytes());
    scheduler_->run(fwd_plan_, fwd_schedule_, overlap, trace);
    backbone_stream_->copy(output.data, h_.back(), output.bytes());
}

void BlockStack::backward(const Tensor& grad_output, Tensor grad_input, bool overlap, Tracer* trace,
                          const GradsReadyFn& grads_ready) {
    require_training("backward");
    SCMOE_CHECK(plan_tokens_ >= 0, "BlockStack.backward: no forward to differentiate");
    check_tensor(grad_output, {plan_tokens_, config_.backbone.hidden}, config_.backbone.dtype,
                 "BlockStack.backward: grad_output");
    check_tensor(grad_input, {plan_tokens_, config_.backbone.hidden}, config_.backbone.dtype,
                 "BlockStack.backward: grad_input");
    backbone_stream_->copy(grad_h_.back(), grad_output.data, grad_output.bytes());
    LayerScheduler::IndexHook at_index;
    if (grads_ready) {
        at_index = [this, &grads_ready](int i, Stream& s) {
            for (std::size_t b = grads_ready_index_.size(); b-- > 0;)
                if (grads_ready_index_[b] == i) grads_ready(static_cast<int>(b), s);
        };
    }
    scheduler_->run(bwd_plan_, bwd_schedule_, overlap, trace, at_index);
    backbone_stream_->copy(grad_input.data, grad_h_[0], grad_input.bytes());
}

double BlockStack::router_loss() {
    double loss = 0;
    for (auto& b : blocks_) {
        if (!b->moe) continue;
        const MoeStats s = b->moe->stats(*backbone_stream_);
        loss += static_cast<double>(config_.moe.aux_loss_coef) * s.aux_loss +
                static_cast<double>(config_.moe.z_loss_coef) * s.z_loss;
    }
    return loss;
}

}  // namespace scmoe
