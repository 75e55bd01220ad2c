// MoeLayer: construction, workspace layout, forward stages and statistics.
// The backward stages live in moe_layer_backward.cpp.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "scmoe/comm/communicator.h"
#include "scmoe/kernels/activation.h"
#include "scmoe/kernels/elementwise.h"
#include "scmoe/kernels/error.h"
#include "scmoe/kernels/gemm.h"
#include "scmoe/kernels/layout.h"
#include "scmoe/kernels/math.h"
#include "scmoe/kernels/permute.h"
#include "scmoe/kernels/router.h"
#include "scmoe/kernels/workspace.h"
#include "scmoe/moe/detail/moe_layer_buffers.h"
#include "scmoe/moe/detail/nonfinite_checks.h"

namespace scmoe {

std::pair<std::size_t, std::size_t> MoeLayer::workspace_parts(const MoeConfig& config, std::int64_t max_tokens,
                                                              int ep_size) {
    config.validate();
    moe_param_specs(config, ep_size);  // checks num_experts % ep_size
    Buffers b;
    WorkspaceCarver kept(nullptr), scratch(nullptr);
    b.carve(kept, scratch, config, max_tokens, ep_size);
    return {kept.bytes_used(), scratch.bytes_used()};
}

std::size_t MoeLayer::workspace_bytes(const MoeConfig& config, std::int64_t max_tokens, int ep_size,
                                      bool shared_scratch) {
    const auto [kept, scratch] = workspace_parts(config, max_tokens, ep_size);
    return shared_scratch ? kept : kept + scratch;
}

std::size_t MoeLayer::scratch_bytes(const MoeConfig& config, std::int64_t max_tokens, int ep_size) {
    return workspace_parts(config, max_tokens, ep_size).second;
}

MoeLayer::MoeLayer(const MoeConfig& config, Device& device, std::int64_t max_tokens, Communicator* ep,
                   void* workspace, std::size_t workspace_size, void* scratch, std::size_t scratch_size)
    : config_(config),
      device_(device),
      max_tokens_(max_tokens),
      ep_(ep),
      buf_(std::make_unique<Buffers>()),
      host_(std::make_unique<HostScratch>()),
      nonfinite_(std::make_unique<NonfiniteChecks>(device)) {
    config_.validate();
    SCMOE_CHECK(max_tokens >= 0, "MoeLayer: max_tokens = " << max_tokens << ": must be >= 0");
    SCMOE_CHECK(config_.dtype == device.compute_dtype(),
                "MoeConfig.dtype = " << dtype_name(config_.dtype) << ": the " << backend_name(device.backend())
                                     << " backend computes in " << dtype_name(device.compute_dtype()));
    if (ep_) {
        ep_size_ = ep_->size();
        ep_rank_ = ep_->rank();
    }
    noise_stream_ = static_cast<std::uint64_t>(ep_rank_);
    const std::size_t need = workspace_bytes(config_, max_tokens_, ep_size_, scratch != nullptr);
    if (scratch) {
        const std::size_t scratch_need = scratch_bytes(config_, max_tokens_, ep_size_);
        SCMOE_CHECK(scratch_size >= scratch_need, "MoeLayer: shared scratch of "
                                                      << scratch_size << " bytes is smaller than the " << scratch_need
                                                      << " bytes scratch_bytes() asks for");
    }
    if (!workspace) {
        owned_workspace_ = DeviceBuffer(device, need);
        workspace = owned_workspace_.data();
    } else {
        SCMOE_CHECK(workspace_size >= need, "MoeLayer: workspace of " << workspace_size
                                                                      << " bytes is smaller than the " << need
                                                                      << " bytes workspace_bytes() asks for");
    }
    WorkspaceCarver carver(workspace);
    if (scratch) {
        WorkspaceCarver scratch_carver(scratch);
        buf_->carve(carver, scratch_carver, config_, max_tokens_, ep_size_);
    } else {
        buf_->carve(carver, carver, config_, max_tokens_, ep_size_);
    }
    WorkspaceCarver host_sizing(nullptr);
    host_->carve(host_sizing, config_, ep_size_);
    host_scratch_ = device.allocate_host(host_sizing.bytes_used());
    WorkspaceCarver host_carver(host_scratch_);
    host_->carve(host_carver, config_, ep_size_);
    for (int p = 0; p < ep_size_; ++p) host_->counts_per_peer[p] = num_local_experts();
    chunk_counts_built_.assign(static_cast<std::size_t>(max_chunks()) + 1, false);
    if (const char* provider = std::getenv("SCMOE_GROUPED_GEMM_PROVIDER"); provider && *provider) {
        try {
            provider_ = parse_grouped_gemm_provider(provider);
        } catch (const Error& e) {
            throw Error(std::string("SCMOE_GROUPED_GEMM_PROVIDER: ") + e.what());
        }
    }
    if (ep_size_ > 1) check_config_across_ranks();
}

MoeLayer::~MoeLayer() { device_.deallocate_host(host_scratch_); }

std::int64_t MoeLayer::rows() const { return permuted_rows(tokens_, config_.num_experts, config_.top_k, capacity_); }

std::int64_t MoeLayer::expert_rows() const {
    if (ep_size_ == 1) return rows();
    return Buffers::max_expert_rows(config_, max_tokens_, ep_size_);
}

// A device count and a read at the stream's next synchronize (NonfiniteChecks): no host callback in
// the stream, which on CUDA would stall the other stream's callbacks (review L2).
void MoeLayer::check_finite(const Tensor& t, int slot, const char* what, Stream& stream) {
    if (!config_.check_finite) return;
    SCMOE_CHECK(!stream.capturing(), "MoeLayer: " << what << ": the NaN/Inf check cannot be captured into a CUDA "
                                                     "graph (it is read at a sync, not on replay); set "
                                                     "MoeConfig.check_finite = false for captured layers");
    nonfinite_->enqueue(t, buf_->nonfinite + 2 * slot, what, stream);
}

void MoeLayer::forward(const Tensor& x, const Tensor& shortcut, const MoeParams& params, Tensor y, Stream& stream) {
    // Reject bad shapes before anything is enqueued.
    const std::int64_t T = x.ndim == 2 ? x.dim(0) : -1;
    check_tensor(x, {T, config_.hidden}, config_.dtype, "MoeLayer.forward: x");
    if (shortcut.defined()) check_tensor(shortcut, {T, config_.hidden}, config_.dtype, "MoeLayer.forward: shortcut");
    SCMOE_CHECK(T <= max_tokens_, "MoeLayer.forward: " << (shortcut.defined() ? "x and shortcut have " : "x has ") << T
                                                        << " tokens (" << describe(x) << ") > max_tokens = "
                                                        << max_tokens_ << ", the most this layer was built for");
    check_tensor(y, {T, config_.hidden}, config_.dtype, "MoeLayer.forward: y");
    route(shortcut.defined() ? shortcut : x, params, stream);
    x_ = x;
    permute(stream);
    dispatch(stream);
    experts(params, stream);
    collect(stream);
    combine(y, stream);
    if (config_.shared_expert) shared_expert(x, params, y, stream);
    separate_shortcut_ = shortcut.defined();  // what the caller passed, even if it is x's buffer
}

void MoeLayer::route(const Tensor& s, const MoeParams& params, Stream& stream) {
    const std::int64_t T = s.ndim == 2 ? s.dim(0) : -1;
    const char* what = "MoeLayer.route: routed input (shortcut, or x)";
    SCMOE_CHECK(T >= 0, what << ": expected [tokens, " << config_.hidden << "] " << dtype_name(config_.dtype)
                             << ", got " << describe(s));
    SCMOE_CHECK(T <= max_tokens_, what << " " << describe(s) << " has " << T << " tokens > max_tokens = "
                                       << max_tokens_ << ", the most this layer was built for");
    check_tensor(s, {T, config_.hidden}, config_.dtype, what);
    check_moe_params(config_, params, config_.dtype, "MoeParams", ep_size_);
    tokens_ = T;
    shortcut_ = s;
    x_ = s;
    forward_started_ = true;
    separate_shortcut_ = false;  // until shared_expert sees an x other than s (or forward() says so)
    capacity_ = config_.dispatch == DispatchMode::kCapacity
                    ? expert_capacity(T, config_.num_experts, config_.top_k, config_.capacity_factor)
                    : 0;
    check_finite(s, 0, "input (shortcut) of forward", stream);

    const int E = config_.num_experts, K = config_.top_k;
    Buffers& b = *buf_;
    gemm({false, false, T, E, config_.hidden, 1.0f, 0.0f, s.data, params.gate_w.data, b.logits, config_.dtype,
          DType::kF32},
         stream);
    RouterForwardArgs r;
    r.tokens = T;
    r.num_experts = E;
    r.top_k = K;
    r.noise_std = training_ ? config_.noise_std : 0.0f;
    r.noise_seed = config_.noise_seed;
    r.noise_stream = noise_stream_;
    r.noise_step = noise_step_;
    r.logits = b.logits;
    r.probs = b.probs;
    r.logsumexp = b.logsumexp;
    r.expert_index = b.expert_index;
    r.gate_weight = b.gate_weight;
    r.expert_fraction = b.expert_fraction;
    r.losses = b.losses;
    router_forward(r, stream);
    if (training_) ++noise_step_;  // the next training forward draws fresh noise
    if (!forced_index_.empty()) {
        SCMOE_CHECK(static_cast<std::int64_t>(forced_index_.size()) == T * K,
                    "MoeLayer.route: forced routing holds " << forced_index_.size() << " choices; this forward has "
                                                            << T << " tokens x top_k " << K << " = " << T * K);
        stream.copy(b.expert_index, forced_index_.data(), forced_index_.size() * sizeof(std::int32_t));
        stream.copy(b.gate_weight, forced_weight_.data(), forced_weight_.size() * sizeof(float));
    }

    LayoutArgs l;
    l.tokens = T;
    l.num_experts = E;
    l.top_k = K;
    l.capacity = capacity_;
    l.expert_index = b.expert_index;
    l.expert_counts = b.expert_counts;
    l.group_offsets = b.group_offsets;
    l.slot_of_choice = b.slot_of_choice;
    l.choice_of_row = b.choice_of_row;
    l.dropped = b.dropped;
    compute_layout(l, stream);
}

void MoeLayer::permute(Stream& stream) {
    PermuteArgs a;
    a.rows = rows();
    a.tokens = tokens_;
    a.hidden = config_.hidden;
    a.top_k = config_.top_k;
    a.dtype = config_.dtype;
    a.x = shortcut_.data;
    a.choice_of_row = buf_->choice_of_row;
    a.xp = buf_->xp;
    scmoe::permute(a, stream);
}

void MoeLayer::experts(const MoeParams& params, Stream& stream) { experts_range(params, 0, num_local_experts(), stream); }

// The grouped GEMMs over local experts [first, end): their offsets (absolute rows) and weights are
// the unchunked ones shifted to `first`, so every expert's GEMM sees the same rows and weights.
void MoeLayer::experts_range(const MoeParams& params, int first, int end, Stream& stream) {
    const int El = num_local_experts();
    experts_range_at(expert_slice(params.expert_w1, first, El), expert_slice(params.expert_w2, first, El),
                     expert_range_rows(first, end), stream);
}

// The unchunked offsets (local_offsets with expert parallelism) from `first`: absolute rows, so every
// expert's GEMM sees the rows and weights it would see unchunked.
MoeLayer::ExpertRows MoeLayer::expert_range_rows(int first, int end) const {
    return {first, end - first, expert_gemm_args(*buf_).group_offsets + first, first == 0 && end == num_local_experts()};
}

// Piece `chunk` of `chunks` is the contiguous expert rows [bounds[c], bounds[c + 1]) of the slice
// table (moe_layer_buffers.h).
MoeLayer::ExpertRows MoeLayer::row_slice_rows(int chunk, int chunks) const {
    const std::int64_t at = slice_bounds_at(ep_size_, chunks) + chunk;
    return {0, 1, buf_->slice_table + at, chunks == 1, host_->slice_table[at], host_->slice_table[at + 1]};
}

void MoeLayer::expert_one(int expert, const void* w1, const void* w2, Stream& stream) {
    require_forward("expert_one");
    SCMOE_CHECK(ep_size_ == 1, "MoeLayer.expert_one: single rank only (expert parallelism: " << ep_size_ << " ranks)");
    SCMOE_CHECK(expert >= 0 && expert < num_local_experts(),
                "MoeLayer.expert_one: expert " << expert << " outside [0, " << num_local_experts() << ")");
    SCMOE_CHECK(w1 && w2, "MoeLayer.expert_one: null weights");
    experts_range_at(w1, w2, expert_range_rows(expert, expert + 1), stream);
}

std::vector<std::int32_t> MoeLayer::routed_rows(Stream& stream) {
    require_forward("routed_rows");
    SCMOE_CHECK(ep_size_ == 1, "MoeLayer.routed_rows: single rank only (expert parallelism: " << ep_size_ << " ranks)");
    std::vector<std::int32_t> offsets(static_cast<std::size_t>(config_.num_experts + 1));
    stream.copy(offsets.data(), buf_->group_offsets, offsets.size() * sizeof(std::int32_t));
    stream.synchronize();
    std::vector<std::int32_t> rows(static_cast<std::size_t>(config_.num_experts));
    for (std::size_t e = 0; e < rows.size(); ++e) rows[e] = offsets[e + 1] - offsets[e];
    return rows;
}

// The grouped GEMMs over local experts [first, end) on weights w1/w2 (local expert `first`'s slice
// onwards): their offsets are the unchunked ones shifted to `first`, so every expert's GEMM sees
// the same rows and weights.
void MoeLayer::experts_range_at(const void* w1, const void* w2, const ExpertRows& rows, Stream& stream) {
    Buffers& b = *buf_;
    const std::int64_t Re = expert_rows();
    GroupedGemmArgs g = expert_gemm_args(b);
    g.num_groups = rows.groups;
    g.group_offsets = rows.offsets;
    g.kind = GroupedGemmKind::kForward;
    g.ab_dtype = g.c_dtype = config_.dtype;
    g.k = config_.hidden;
    g.n = config_.expert_inner_width();
    g.a = b.xe;
    g.b = w1;
    g.c = b.h;
    grouped_gemm(g, stream, provider_);

    ActivationArgs act{config_.activation, Re, config_.ffn, config_.dtype, b.h, b.act, expert_rows_in_use(b)};
    act.routed_expert = true;
    if (!rows.whole) {  // the range's rows: the offsets the GEMMs read
        act.first_row = rows.offsets;
        act.num_rows = rows.offsets + rows.groups;
    }
    activation_forward(act, stream);

    g.k = config_.ffn;
    g.n = config_.hidden;
    g.a = b.act;
    g.b = w2;
    g.c = b.ye;
    grouped_gemm(g, stream, provider_);
}

GroupedGemmArgs MoeLayer::expert_gemm_args(const Buffers& b) const {
    GroupedGemmArgs g;
    g.num_groups = num_local_experts();
    g.max_rows = expert_rows();
    // Single rank, capacity mode: every expert holds exactly C rows. Expert-parallel: each source's
    // capacity follows its own token count, so the groups are ragged.
    g.rows_per_group = ep_size_ == 1 ? capacity_ : 0;
    g.group_offsets = ep_size_ == 1 ? b.group_offsets : b.local_offsets;
    return g;
}

const std::int32_t* MoeLayer::expert_rows_in_use(const Buffers& b) const {
    return ep_size_ == 1 ? nullptr : b.local_offsets + num_local_experts();
}

void MoeLayer::combine(Tensor y, Stream& stream) {
    check_tensor(y, {tokens_, config_.hidden}, config_.dtype, "MoeLayer.combine: y");
    CombineArgs a;
    a.tokens = tokens_;
    a.rows = rows();
    a.hidden = config_.hidden;
    a.top_k = config_.top_k;
    a.dtype = config_.dtype;
    a.yp = buf_->yp;
    a.slot_of_choice = buf_->slot_of_choice;
    a.gate_weight = buf_->gate_weight;
    a.y = y.data;
    scmoe::combine(a, stream);
}

void MoeLayer::shared_expert(const Tensor& x, const MoeParams& params, Tensor y, Stream& stream) {
    check_tensor(y, {tokens_, config_.hidden}, config_.dtype, "MoeLayer.shared_expert: y");
    shared_expert_compute(x, params, stream);
    shared_expert_add(y, stream);
}

void MoeLayer::shared_expert_compute(const Tensor& x, const MoeParams& params, Stream& stream) {
    SCMOE_CHECK(config_.shared_expert, "MoeLayer.shared_expert: the config has shared_expert off");
    check_tensor(x, {tokens_, config_.hidden}, config_.dtype, "MoeLayer.shared_expert: x");
    if (x.data != shortcut_.data) check_finite(x, 1, "input x of forward", stream);
    x_ = x;
    separate_shortcut_ = x.data != shortcut_.data;
    Buffers& b = *buf_;
    const std::int64_t T = tokens_, H = config_.hidden, Fs = config_.shared_ffn_width();
    const std::int64_t Is = activation_input_width(config_.activation, Fs);
    const DType dt = config_.dtype;
    gemm({false, false, T, Is, H, 1.0f, 0.0f, x.data, params.shared_w1.data, b.shared_h, dt, dt}, stream);
    activation_forward({config_.activation, T, Fs, dt, b.shared_h, b.shared_act}, stream);
    gemm({false, false, T, H, Fs, 1.0f, 0.0f, b.shared_act, params.shared_w2.data, b.shared_out, dt, dt}, stream);
    if (config_.coefficient_gate) {
        gemm({false, false, T, 1, H, 1.0f, 0.0f, x.data, params.cg_w.data, b.cg_logit, dt, DType::kF32}, stream);
    }
}

void MoeLayer::shared_expert_add(Tensor y, Stream& stream) {
    SCMOE_CHECK(config_.shared_expert, "MoeLayer.shared_expert_add: the config has shared_expert off");
    check_tensor(y, {tokens_, config_.hidden}, config_.dtype, "MoeLayer.shared_expert_add: y");
    const Buffers& b = *buf_;
    gated_add({tokens_, config_.hidden, config_.dtype, config_.coefficient_gate ? b.cg_logit : nullptr, b.shared_out,
               y.data},
              stream);
}

MoeStats MoeLayer::stats(Stream& stream) {
    const int E = config_.num_experts;
    stream.copy(host_->dropped, buf_->dropped, sizeof(std::int32_t));
    stream.copy(host_->losses, buf_->losses, 2 * sizeof(float));
    stream.copy(host_->expert_counts, buf_->expert_counts, static_cast<std::size_t>(E) * sizeof(std::int32_t));
    stream.synchronize();
    MoeStats s;
    s.tokens = tokens_;
    s.capacity = capacity_;
    s.dropped_tokens = *host_->dropped;
    s.aux_loss = host_->losses[0];
    s.z_loss = host_->losses[1];
    s.expert_counts.assign(host_->expert_counts, host_->expert_counts + E);
    return s;
}

MoeRouting MoeLayer::routing(Stream& stream) {
    const std::size_t n = static_cast<std::size_t>(tokens_ * config_.top_k);
    MoeRouting r;
    r.expert_index.resize(n);
    r.gate_weight.resize(n);
    r.slot_of_choice.resize(n);
    r.group_offsets.resize(static_cast<std::size_t>(config_.num_experts + 1));
    stream.copy(r.expert_index.data(), buf_->expert_index, n * sizeof(std::int32_t));
    stream.copy(r.gate_weight.data(), buf_->gate_weight, n * sizeof(float));
    stream.copy(r.slot_of_choice.data(), buf_->slot_of_choice, n * sizeof(std::int32_t));
    stream.copy(r.group_offsets.data(), buf_->group_offsets, r.group_offsets.size() * sizeof(std::int32_t));
    stream.synchronize();
    return r;
}

void MoeLayer::force_routing(std::vector<std::int32_t> expert_index, std::vector<float> gate_weight) {
    SCMOE_CHECK(expert_index.size() == gate_weight.size(),
                "MoeLayer.force_routing: " << expert_index.size() << " expert indices but " << gate_weight.size()
                                           << " gate weights");
    const std::size_t K = static_cast<std::size_t>(config_.top_k);
    SCMOE_CHECK(expert_index.size() % K == 0, "MoeLayer.force_routing: " << expert_index.size()
                                                                         << " choices is not a multiple of top_k "
                                                                         << K);
    for (std::size_t i = 0; i < expert_index.size(); ++i) {
        SCMOE_CHECK(expert_index[i] >= 0 && expert_index[i] < config_.num_experts,
                    "MoeLayer.force_routing: choice " << i << " names expert " << expert_index[i] << " of "
                                                      << config_.num_experts);
        SCMOE_CHECK(std::isfinite(gate_weight[i]),
                    "MoeLayer.force_routing: gate weight " << i << " is " << gate_weight[i]);
        for (std::size_t earlier = i - i % K; earlier < i; ++earlier)
            SCMOE_CHECK(expert_index[i] != expert_index[earlier],
                        "MoeLayer.force_routing: token " << i / K << " chooses expert " << expert_index[i]
                                                         << " twice");
    }
    forced_index_ = std::move(expert_index);
    forced_weight_ = std::move(gate_weight);
}

MoeExpertInputs MoeLayer::expert_inputs(Stream& stream) {
    const int El = num_local_experts();
    const std::int64_t H = config_.hidden;
    // Rows in use per local expert and where they start in the expert-side buffer.
    std::vector<std::int64_t> begin(static_cast<std::size_t>(El)), count(begin.size());
    if (ep_size_ == 1) {
        const MoeRouting r = routing(stream);
        const MoeStats st = stats(stream);
        for (int e = 0; e < El; ++e) {
            begin[static_cast<std::size_t>(e)] = r.group_offsets[static_cast<std::size_t>(e)];
            const std::int64_t n = st.expert_counts[static_cast<std::size_t>(e)];
            count[static_cast<std::size_t>(e)] = capacity_ > 0 ? std::min(n, capacity_) : n;
        }
    } else {
        std::vector<std::int32_t> offsets(static_cast<std::size_t>(El + 1));
        stream.copy(offsets.data(), buf_->local_offsets, offsets.size() * sizeof(std::int32_t));
        stream.synchronize();
        for (std::size_t e = 0; e < begin.size(); ++e) {
            begin[e] = offsets[e];
            count[e] = offsets[e + 1] - offsets[e];
        }
    }
    const std::size_t es = dtype_size(config_.dtype);
    MoeExpertInputs out;
    out.rows.resize(static_cast<std::size_t>(El));
    std::vector<unsigned char> raw;
    for (std::size_t e = 0; e < begin.size(); ++e) {
        const auto n = static_cast<std::size_t>(count[e] * H);
        raw.resize(n * es);
        stream.copy(raw.data(), static_cast<const unsigned char*>(buf_->xe) + static_cast<std::size_t>(begin[e] * H) * es,
                    raw.size());
        stream.synchronize();
        std::vector<float>& rows = out.rows[e];
        rows.resize(n);
        for (std::size_t i = 0; i < n; ++i) {
            if (config_.dtype == DType::kBF16) {
                std::uint16_t bits;
                std::memcpy(&bits, raw.data() + i * 2, 2);
                rows[i] = math::bf16_bits_to_f32(bits);
            } else {
                std::memcpy(&rows[i], raw.data() + i * 4, 4);
            }
        }
        if (row_sliced()) {  // the slice layout back to the documented order: source, then its rows
            const int P = ep_size_, S = kRowSlices;
            const std::int32_t* t = host_->slice_table;  // this forward's, from dispatch_counts
            std::vector<float> ordered;
            ordered.reserve(rows.size());
            for (int p = 0; p < P; ++p)
                for (int sl = 0; sl < S; ++sl) {
                    const auto at = static_cast<std::size_t>(t[p * S + sl]) * static_cast<std::size_t>(H);
                    const auto len = static_cast<std::size_t>(t[2 * P * S + p * S + sl]) * static_cast<std::size_t>(H);
                    ordered.insert(ordered.end(), rows.begin() + static_cast<std::ptrdiff_t>(at),
                                   rows.begin() + static_cast<std::ptrdiff_t>(at + len));
                }
            rows = std::move(ordered);
        }
    }
    return out;
}

}  // namespace scmoe
