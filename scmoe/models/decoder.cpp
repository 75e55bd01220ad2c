#include "scmoe/models/decoder.h"

#include <algorithm>
#include <sstream>

#include "scmoe/comm/communicator.h"
#include "scmoe/kernels/activation.h"
#include "scmoe/kernels/attention_decode.h"
#include "scmoe/kernels/elementwise.h"
#include "scmoe/kernels/embedding.h"
#include "scmoe/kernels/error.h"
#include "scmoe/kernels/gemm.h"
#include "scmoe/kernels/host_io.h"
#include "scmoe/kernels/rmsnorm.h"
#include "scmoe/kernels/workspace.h"

namespace scmoe::models {

const char* expert_residency_name(ExpertResidency mode) {
    switch (mode) {
        case ExpertResidency::kResident: return "resident";
        case ExpertResidency::kBlocking: return "blocking";
        case ExpertResidency::kPrefetch: return "prefetch";
    }
    return "?";
}

ExpertResidency parse_expert_residency(const std::string& name) {
    if (name == "resident") return ExpertResidency::kResident;
    if (name == "blocking") return ExpertResidency::kBlocking;
    if (name == "prefetch") return ExpertResidency::kPrefetch;
    SCMOE_FAIL("--experts '" << name << "': expected resident, blocking or prefetch");
}

// One MoE block's decoding layer and its per-pass buffers ([max_rows, hidden] each).
struct Decoder::MoeBlock {
    std::size_t block = 0;
    ShortcutSource shortcut = ShortcutSource::kCurrent;
    std::unique_ptr<MoeLayer> layer;
    const MoeParams* params = nullptr;  // what route / the shared expert read: the model's, or `offload`
    MoeParams offload;                  // offloaded experts: the device copies of the non-expert weights,
                                        // the model's host experts (never read by route or the shared expert)
    DeviceBuffer dense;                 // the device copies `offload` points to
    int cache_layer = -1;               // its layer in the expert cache
    std::vector<int> chosen;            // prefetch: the experts this pass's gate chose
    std::unique_ptr<Event> start, end;  // the block's span (set_moe_block_timing)
    const Tensor* norm_x = nullptr;
    const Tensor* norm_s = nullptr;     // with a shortcut only
    void *x = nullptr, *s = nullptr, *y = nullptr;
    bool gated = false;                 // this pass's gate has run
};

namespace {

// The MoE layer's config for decoding: dropless (no room limit, so no step fails for load) and
// otherwise the model's.
MoeConfig decoding_moe_config(const MoeConfig& trained) {
    MoeConfig c = trained;
    c.dispatch = DispatchMode::kDropless;
    c.recv_limit_factor = 0.0f;
    return c;
}

}  // namespace

std::int64_t default_prefetch_slots(const MoeConfig& moe, std::int64_t batch) {
    return 2 * std::min<std::int64_t>(moe.num_experts, batch * moe.top_k) + 1;
}

Decoder::Decoder(LanguageModel& model, const DecoderOptions& options, Communicator* ep)
    : model_(model), options_(options), ep_(ep) {
    const LmConfig& config = model.config();
    const BackboneShape& bb = config.backbone;
    const ExpertResidency mode = options.experts;
    const char* mode_name = expert_residency_name(mode);
    SCMOE_CHECK(mode == ExpertResidency::kResident || !ep || ep->size() == 1,
                "--experts " << mode_name << ": single rank only (with " << ep->size()
                             << " expert-parallel ranks a rank's experts' rows are known only after the dispatch "
                                "exchange); use --experts resident");
    SCMOE_CHECK(options.expert_cache_slots >= 0, "Decoder: expert cache of " << options.expert_cache_slots << " slots");
    SCMOE_CHECK(mode == ExpertResidency::kPrefetch || options.expert_cache_slots == 0,
                "--experts " << mode_name << ": an expert cache (" << options.expert_cache_slots
                             << " slots) is for --experts prefetch only");
    SCMOE_CHECK(options.batch > 0, "Decoder: batch = " << options.batch << " must be positive");
    SCMOE_CHECK(options.max_length > 0 && options.max_length <= bb.seq_len,
                "Decoder: max_length = " << options.max_length << " positions (prompt + new tokens) must be in [1, "
                                         << bb.seq_len << "], the model's seq_len (its learned positions)");
    const BlockStackConfig& stack = model.blocks().config();
    const auto n = stack.blocks.size();
    max_rows_ = std::max(options.batch, options.max_length);
    cache_ = std::make_unique<KvCache>(
        model.device(), KvCacheShape{static_cast<std::int64_t>(n), options.batch, options.max_length,
                                     backbone_kv_heads(bb), bb.hidden / bb.heads, bb.dtype});

    moe_of_block_.assign(n, -1);
    const MoeConfig moe_config = decoding_moe_config(stack.moe);
    const int local_experts = moe_config.num_experts / (ep ? ep->size() : 1);
    const std::size_t ds = dtype_size(bb.dtype);
    if (mode != ExpertResidency::kResident) {
        const std::size_t w1 = static_cast<std::size_t>(moe_config.hidden * moe_config.expert_inner_width()) * ds;
        const std::size_t w2 = static_cast<std::size_t>(moe_config.ffn * moe_config.hidden) * ds;
        const std::int64_t slots = mode == ExpertResidency::kBlocking ? 1
                                   : options.expert_cache_slots > 0
                                       ? options.expert_cache_slots
                                       : default_prefetch_slots(moe_config, options.batch);
        experts_ = std::make_unique<ExpertCache>(
            model.device(), mode == ExpertResidency::kBlocking ? ExpertCache::Mode::kBlocking : ExpertCache::Mode::kPrefetch,
            slots, w1, w2);
    }
    for (std::size_t b = 0; b < n; ++b) {
        if (stack.blocks[b].ffn != FfnKind::kMoe) continue;
        auto m = std::make_unique<MoeBlock>();
        m->block = b;
        m->shortcut = stack.blocks[b].shortcut;
        m->layer = std::make_unique<MoeLayer>(moe_config, model.device(), max_rows_, ep);
        m->layer->set_training(false);
        moe_workspace_bytes_ += MoeLayer::workspace_bytes(moe_config, max_rows_, ep ? ep->size() : 1);
        m->params = &model.blocks().moe_params()[moe_.size()]->view();
        if (experts_) {
            // The router, shared expert and CG-1 gate on the device; the routed experts stay where they are.
            const MoeParams& host = *m->params;
            std::size_t bytes = 0;
            for (const Tensor* t : {&host.gate_w, &host.shared_w1, &host.shared_w2, &host.cg_w})
                if (t->data) bytes += (t->bytes() + 255) / 256 * 256;
            m->dense = DeviceBuffer(model.device(), bytes);
            m->offload = host;
            char* next = m->dense.as<char>();
            Stream& s = model.stream();
            for (Tensor* t : {&m->offload.gate_w, &m->offload.shared_w1, &m->offload.shared_w2, &m->offload.cg_w}) {
                if (!t->data) continue;
                s.copy(next, t->data, t->bytes());
                t->data = next;
                next += (t->bytes() + 255) / 256 * 256;
            }
            s.synchronize();
            m->params = &m->offload;
            m->cache_layer = experts_->add_layer(host.expert_w1.data, host.expert_w2.data, local_experts);
        }
        const std::string prefix = "blocks." + std::to_string(b) + ".moe.";
        m->norm_x = &backbone_param(prefix + "norm_x");
        if (m->shortcut != ShortcutSource::kCurrent) m->norm_s = &backbone_param(prefix + "norm_s");
        m->start = model.device().create_event();
        m->end = model.device().create_event();
        moe_of_block_[b] = static_cast<int>(moe_.size());
        moe_.push_back(std::move(m));
    }

    const std::int64_t R = max_rows_, H = bb.hidden, F = bb.ffn;
    const std::int64_t I = activation_input_width(bb.activation, F);
    auto carve = [&](WorkspaceCarver& w) {
        auto take = [&](std::int64_t elements) { return w.take_bytes(static_cast<std::size_t>(elements) * ds); };
        ids_ = w.take<std::int32_t>(R);
        h_.clear();
        hmh_.clear();
        for (std::size_t b = 0; b <= n; ++b) h_.push_back(take(R * H));
        for (std::size_t b = 0; b < n; ++b) hmh_.push_back(take(R * H));
        normed_ = take(R * H);
        qkv_ = take(R * backbone_qkv_width(bb));
        attn_ = take(R * H);
        mlp_hidden_ = take(R * I);
        mlp_act_ = take(R * F);
        logits_ = take(R * config.vocab);
        for (auto& m : moe_) {
            m->x = take(R * H);
            m->s = take(R * H);
            m->y = take(R * H);
        }
    };
    WorkspaceCarver sizing(nullptr);
    carve(sizing);
    workspace_ = DeviceBuffer(model.device(), sizing.bytes_used());
    WorkspaceCarver real(workspace_.data());
    carve(real);
}

Decoder::~Decoder() {
    try {
        model_.blocks().synchronize();
    } catch (const std::exception&) {
    }
}

const Tensor& Decoder::backbone_param(const std::string& name) const {
    const ParamSet& P = model_.blocks().backbone_params();
    for (std::size_t i = 0; i < P.specs().size(); ++i)
        if (P.specs()[i].name == name) return P[i];
    SCMOE_FAIL("Decoder: the model has no parameter " << name);
}

std::uint64_t Decoder::device_bytes() const {
    std::uint64_t bytes = workspace_.bytes() + moe_workspace_bytes_;
    for (const auto& m : moe_) bytes += m->dense.bytes();
    if (experts_) bytes += experts_->device_bytes();
    return bytes;
}

std::string Decoder::describe_experts() const {
    std::ostringstream o;
    o.precision(4);  // significant digits: a test model's experts are KiB
    o << "experts " << expert_residency_name(options_.experts);
    if (!experts_) return o.str() + ": every routed expert on the device";
    const double mib = 1024.0 * 1024.0;
    o << ": routed experts in pinned host memory, " << experts_->slots() << " device slot(s) x "
      << static_cast<double>(experts_->expert_bytes()) / mib << " MiB = "
      << static_cast<double>(experts_->device_bytes()) / mib << " MiB";
    if (options_.experts == ExpertResidency::kBlocking) return o.str() + "; each chosen expert copied before its FFN";
    bool early = false, late = false;
    for (const auto& m : moe_) (m->shortcut == ShortcutSource::kCurrent ? late : early) = true;
    o << " (LRU cache; hits not copied); copies issued at the gate";
    if (early)
        o << ": a ScMoE block's gate runs where its shortcut exists (Pos-2/3: in the previous block; Pos-1: before "
             "its attention), so its copies overlap the backbone until its experts";
    if (late) o << (early ? "; " : ": ") << "a top-k block's gate runs after its own norm, so its copies can only start there";
    return o.str();
}

void Decoder::set_probes(DecoderProbes probes) {
    probes_ = std::move(probes);
    if (experts_) experts_->set_copy_probe(probes_.expert_copy);
}

// The pass's chosen experts (rows > 0), read on the host (a sync of `s`).
static std::vector<int> chosen_experts(MoeLayer& layer, Stream& s) {
    const std::vector<std::int32_t> rows = layer.routed_rows(s);
    std::vector<int> chosen;
    for (std::size_t e = 0; e < rows.size(); ++e)
        if (rows[e] > 0) chosen.push_back(static_cast<int>(e));
    return chosen;
}

void Decoder::run_experts(MoeBlock& m, Stream& s) {
    if (!experts_) {
        m.layer->experts(*m.params, s);
        return;
    }
    if (options_.experts == ExpertResidency::kBlocking) m.chosen = chosen_experts(*m.layer, s);
    for (int e : m.chosen) {
        const auto [w1, w2] = experts_->acquire(m.cache_layer, e, s);
        m.layer->expert_one(e, w1, w2, s);
        experts_->release(m.cache_layer, e, s);
    }
}

const std::vector<float>& Decoder::prefill(std::int64_t sequence, const std::int32_t* tokens, std::int64_t n) {
    SCMOE_CHECK(sequence >= 0 && sequence < options_.batch,
                "Decoder.prefill: sequence " << sequence << " outside the batch of " << options_.batch);
    SCMOE_CHECK(n > 0, "Decoder.prefill: " << n << " tokens; a pass needs at least one");
    run(sequence, 1, n, tokens);
    return host_logits_;
}

const std::vector<float>& Decoder::step(const std::int32_t* tokens) {
    run(0, options_.batch, 1, tokens);
    if (timing_)
        for (const auto& m : moe_) {
            block_times_.total_ms += m->end->elapsed_ms_since(*m->start);
            ++block_times_.count;
        }
    return host_logits_;
}

void Decoder::gate(MoeBlock& m, std::int64_t rows, Stream& s) {
    const BackboneShape& bb = model_.config().backbone;
    const Tensor x(m.x, bb.dtype, {rows, bb.hidden});
    Tensor routed = x;
    if (m.norm_s) {
        void* source = nullptr;
        switch (m.shortcut) {
            case ShortcutSource::kPos1: source = h_[m.block]; break;
            case ShortcutSource::kPos2: source = hmh_[m.block - 1]; break;
            case ShortcutSource::kPos3: source = h_[m.block - 1]; break;
            case ShortcutSource::kCurrent: break;
        }
        rmsnorm_forward({rows, bb.hidden, bb.norm_eps, bb.dtype, source, m.norm_s->data, m.s, nullptr}, s);
        routed = Tensor(m.s, bb.dtype, {rows, bb.hidden});
    }
    m.layer->route(routed, *m.params, s);
    m.layer->permute(s);
    m.gated = true;
    if (options_.experts == ExpertResidency::kPrefetch) {
        m.chosen = chosen_experts(*m.layer, s);
        experts_->prefetch(m.cache_layer, m.chosen);
    }
}

void Decoder::run(std::int64_t first, std::int64_t sequences, std::int64_t new_tokens, const std::int32_t* tokens) {
    const LmConfig& config = model_.config();
    const BackboneShape& bb = config.backbone;
    const std::int64_t rows = sequences * new_tokens, H = bb.hidden, V = config.vocab, F = bb.ffn;
    const std::int64_t heads = bb.heads, kv = backbone_kv_heads(bb), D = H / heads, Q = backbone_qkv_width(bb);
    const std::int64_t I = activation_input_width(bb.activation, F);
    const DType dt = bb.dtype;
    const std::size_t row_bytes = static_cast<std::size_t>(H) * dtype_size(dt);
    SCMOE_CHECK(tokens, "Decoder: tokens must not be null");
    SCMOE_CHECK(rows <= max_rows_, "Decoder: a pass of " << rows << " tokens exceeds " << max_rows_);
    for (std::int64_t i = 0; i < rows; ++i)
        SCMOE_CHECK(tokens[i] >= 0 && tokens[i] < V,
                    "Decoder: token " << i << " of the pass is " << tokens[i] << ", outside the vocabulary [0, " << V << ")");
    for (std::int64_t q = first; q < first + sequences; ++q)
        SCMOE_CHECK(cache_->length(q) + new_tokens <= options_.max_length,
                    "Decoder: sequence " << q << " holds " << cache_->length(q) << " positions; " << new_tokens
                                         << " more exceed the cache's max_length " << options_.max_length);
    Stream& s = model_.stream();
    model_.blocks().synchronize();  // the previous pass's host buffers are free
    host_ids_.assign(tokens, tokens + rows);
    s.copy(ids_, host_ids_.data(), static_cast<std::size_t>(rows) * sizeof(std::int32_t));

    // Embedding: each sequence's tokens at its own positions (a position table offset by its length).
    const ParamGroup& lm = model_.param_groups()[0];
    auto lm_tensor = [&](const char* name) {
        for (const NamedTensor& t : lm.tensors)
            if (t.name == name) return static_cast<void*>(static_cast<char*>(lm.params) + t.offset * static_cast<std::int64_t>(dtype_size(dt)));
        SCMOE_FAIL("Decoder: the model has no parameter " << name);
    };
    void* embed = lm_tensor("embed");
    char* pos = static_cast<char*>(lm_tensor("pos"));
    for (std::int64_t q = 0; q < sequences; ++q) {
        EmbeddingArgs e;
        e.tokens = new_tokens;
        e.seq_len = new_tokens;
        e.hidden = H;
        e.vocab = V;
        e.dtype = dt;
        e.ids = ids_ + q * new_tokens;
        e.table = embed;
        e.positions = pos + static_cast<std::size_t>(cache_->length(first + q)) * row_bytes;
        e.out = static_cast<char*>(h_[0]) + static_cast<std::size_t>(q * new_tokens) * row_bytes;
        embedding_forward(e, s);
    }
    for (std::int64_t q = first; q < first + sequences; ++q) cache_->set_length(q, cache_->length(q) + new_tokens);
    const std::int32_t* lengths = cache_->upload_lengths(s) + first;
    std::int64_t longest = 0;  // the emulator's cost of the attention
    for (std::int64_t q = first; q < first + sequences; ++q) longest = std::max(longest, cache_->length(q));

    for (auto& m : moe_) m->gated = false;
    auto gate_if = [&](std::size_t b, ShortcutSource when) {
        if (b >= moe_of_block_.size() || moe_of_block_[b] < 0) return;
        MoeBlock& m = *moe_[static_cast<std::size_t>(moe_of_block_[b])];
        if (m.shortcut == when && !m.gated) gate(m, rows, s);
    };
    const std::size_t n = moe_of_block_.size();
    for (std::size_t b = 0; b < n; ++b) {
        const std::string prefix = "blocks." + std::to_string(b) + ".";
        if (probes_.block_start) probes_.block_start(b, s);
        if (timing_ && moe_of_block_[b] >= 0) moe_[static_cast<std::size_t>(moe_of_block_[b])]->start->record(s);
        // Gates whose routing input is h_b: block b's Pos-1, block b+1's Pos-3.
        gate_if(b, ShortcutSource::kPos1);
        gate_if(b + 1, ShortcutSource::kPos3);
        // Attention over the cache.
        rmsnorm_forward({rows, H, bb.norm_eps, dt, h_[b], backbone_param(prefix + "attn.norm_w").data, normed_, nullptr}, s);
        gemm({false, false, rows, Q, H, 1.0f, 0.0f, normed_, backbone_param(prefix + "attn.wqkv").data, qkv_, dt, dt}, s);
        const auto layer = static_cast<std::int64_t>(b);
        kv_cache_append({sequences, new_tokens, heads, kv, D, options_.max_length, dt, qkv_, lengths,
                         cache_->k(layer, first), cache_->v(layer, first)},
                        s);
        attention_decode({sequences, new_tokens, heads, kv, D, options_.max_length, dt, qkv_, lengths,
                          cache_->k(layer, first), cache_->v(layer, first), attn_, longest},
                         s);
        s.copy(hmh_[b], h_[b], static_cast<std::size_t>(rows) * row_bytes);
        gemm({false, false, rows, H, H, 1.0f, 1.0f, attn_, backbone_param(prefix + "attn.wo").data, hmh_[b], dt, dt}, s);
        // Gates whose routing input is H_b^MH: block b+1's Pos-2.
        gate_if(b + 1, ShortcutSource::kPos2);
        if (moe_of_block_[b] < 0) {
            rmsnorm_forward({rows, H, bb.norm_eps, dt, hmh_[b], backbone_param(prefix + "mlp.norm_w").data, normed_, nullptr}, s);
            gemm({false, false, rows, I, H, 1.0f, 0.0f, normed_, backbone_param(prefix + "mlp.w1").data, mlp_hidden_, dt, dt}, s);
            activation_forward({bb.activation, rows, F, dt, mlp_hidden_, mlp_act_}, s);
            s.copy(h_[b + 1], hmh_[b], static_cast<std::size_t>(rows) * row_bytes);
            gemm({false, false, rows, H, F, 1.0f, 1.0f, mlp_act_, backbone_param(prefix + "mlp.w2").data, h_[b + 1], dt, dt}, s);
            continue;
        }
        MoeBlock& m = *moe_[static_cast<std::size_t>(moe_of_block_[b])];
        const Tensor x(m.x, dt, {rows, H}), y(m.y, dt, {rows, H});
        rmsnorm_forward({rows, H, bb.norm_eps, dt, hmh_[b], m.norm_x->data, m.x, nullptr}, s);
        gate_if(b, ShortcutSource::kCurrent);  // routes on x (a top-k block): its gate runs now
        SCMOE_CHECK(m.gated, "Decoder: block " << b << "'s gate did not run before its experts");
        const bool shared = model_.blocks().config().moe.shared_expert;
        if (shared) m.layer->shared_expert_compute(x, *m.params, s);  // after route: it sizes the pass
        m.layer->dispatch(s);
        run_experts(m, s);
        m.layer->collect(s);
        m.layer->combine(y, s);
        if (shared) m.layer->shared_expert_add(y, s);
        s.copy(h_[b + 1], hmh_[b], static_cast<std::size_t>(rows) * row_bytes);
        gated_add({rows, H, dt, nullptr, m.y, h_[b + 1]}, s);
        if (timing_) m.end->record(s);
    }
    // Final norm and the tied head.
    rmsnorm_forward({rows, H, bb.norm_eps, dt, h_[n], lm_tensor("final_norm"), normed_, nullptr}, s);
    gemm({false, true, rows, V, H, 1.0f, 0.0f, normed_, embed, logits_, dt, dt}, s);
    host_logits_.assign(static_cast<std::size_t>(rows * V), 0.0f);
    if (dt == DType::kF32) {
        s.copy(host_logits_.data(), logits_, host_logits_.size() * sizeof(float));
        model_.blocks().synchronize();
    } else {
        host_logits_ = copy_to_host(Tensor(logits_, dt, {rows * V}), s);  // widens; synchronizes
    }
}

}  // namespace scmoe::models
