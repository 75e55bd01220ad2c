#include "layer_ep_rank.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "scmoe/kernels/error.h"

namespace scmoe::bench {
namespace {

// f32 tolerance of the distributed layer against the single-rank one: the expert GEMMs see other
// row counts and the expert gradients are summed in another order, so results differ by rounding
// (~1e-6 relative); a row sent to the wrong rank or expert is off by O(1).
constexpr double kCheckTol = 1e-4;

// Elements of `got` that are non-finite or further than kCheckTol * max(|ref|, rms(ref)) from `ref`.
std::int64_t count_off(const std::vector<float>& got, const float* ref, std::size_t n) {
    double sq = 0.0;
    for (std::size_t i = 0; i < n; ++i) sq += static_cast<double>(ref[i]) * ref[i];
    const double rms = n ? std::sqrt(sq / static_cast<double>(n)) : 0.0;
    std::int64_t off = 0;
    for (std::size_t i = 0; i < n; ++i) {
        const double diff = std::abs(static_cast<double>(got[i]) - ref[i]);
        if (!std::isfinite(got[i]) || diff > kCheckTol * std::max(std::abs(static_cast<double>(ref[i])), rms)) ++off;
    }
    return off;
}

bool is_expert_param(const ParamSpec& spec) { return spec.name == "expert_w1" || spec.name == "expert_w2"; }

}  // namespace

double EpCaseResult::stage_sum_us() const {
    double sum = 0.0;
    for (double us : stage_us) sum += us;
    return sum;
}

double EpCaseResult::a2a_us() const {
    double sum = 0.0;
    for (int s = 0; s < kNumStages; ++s)
        if (is_a2a_stage(s)) sum += stage_us[static_cast<std::size_t>(s)];
    return sum;
}

double EpCaseResult::a2a_share() const {
    const double total = stage_sum_us();
    return total > 0.0 ? 100.0 * a2a_us() / total : 0.0;
}

void EpCaseResult::pack(double* out) const {
    out[0] = fwd_us;
    out[1] = train_us;
    out[2] = link_model_us;
    out[3] = static_cast<double>(dropped);
    out[4] = static_cast<double>(wrong);
    std::copy(stage_us.begin(), stage_us.end(), out + 5);
}

EpCaseResult EpCaseResult::unpack(const double* in) {
    EpCaseResult r;
    r.fwd_us = in[0];
    r.train_us = in[1];
    r.link_model_us = in[2];
    r.dropped = static_cast<std::int64_t>(in[3]);
    r.wrong = static_cast<std::int64_t>(in[4]);
    std::copy(in + 5, in + kPackedSize, r.stage_us.begin());
    return r;
}

EpLayerRank::EpLayerRank(std::unique_ptr<Communicator> comm, const LayerBenchArgs& args, bool check)
    : owned_(std::move(comm)), inner_(owned_.get()) {
    setup(args, check);
}

EpLayerRank::EpLayerRank(Communicator& comm, const LayerBenchArgs& args, bool check) : inner_(&comm) {
    setup(args, check);
}

EpLayerRank::~EpLayerRank() {
    try {
        if (stream_) stream_->synchronize();
    } catch (...) {  // NOTES: the error was reported by run_case(); a destructor cannot throw
    }
}

Communicator& EpLayerRank::comm() { return link_ ? *link_ : *inner_; }

std::string EpLayerRank::provider_name() const {
    return layer_ ? grouped_gemm_provider_name(layer_->grouped_gemm_provider(), Backend::kCpu) : "";
}

// Every rank builds the full parameter set from the seed (the single-rank benchmark's parameters)
// and keeps its share: the dense parameters whole, experts [rank*E/ep, (rank+1)*E/ep).
void EpLayerRank::setup(const LayerBenchArgs& args, bool check) {
    args_ = args;
    device_ = make_device("cpu");
    stream_ = device_->create_stream();
    if (args.link) link_ = std::make_unique<EmulatedLink>(*inner_, *args.link);
    const int ep = inner_->size(), rank = inner_->rank();
    max_tokens_ = *std::max_element(args.tokens.begin(), args.tokens.end());
    const MoeConfig shape = make_config(args, args.dispatch.front(), DType::kF32);
    full_params_ = std::make_unique<MoeParamStore>(*device_, shape, DType::kF32);
    init_params(*device_, *stream_, shape, full_params_->view(), args.seed);
    params_ = std::make_unique<MoeParamStore>(*device_, shape, DType::kF32, ep);
    const std::vector<ParamSpec> specs = moe_param_specs(shape, ep);
    const Tensor* full = full_params_->view().begin();
    const Tensor* local = params_->view().begin();
    for (std::size_t i = 0; i < specs.size(); ++i, ++full, ++local) {
        if (!local->defined()) continue;
        const std::size_t offset = is_expert_param(specs[i]) ? static_cast<std::size_t>(rank) * local->bytes() : 0;
        stream_->copy(local->data, static_cast<const char*>(full->data) + offset, local->bytes());
    }
    stream_->synchronize();
    grads_ = std::make_unique<MoeParamStore>(*device_, shape, DType::kF32, ep);

    const std::size_t act_bytes = static_cast<std::size_t>(max_tokens_ * args.hidden) * sizeof(float);
    for (DeviceBuffer* b : {&x_, &dy_, &y_, &dx_}) *b = DeviceBuffer(*device_, act_bytes);
    // Rank 0's inputs are the single-rank benchmark's; every rank's differ.
    const std::uint64_t input_seed = args.seed + 1000 * static_cast<std::uint64_t>(rank);
    upload_uniform(*device_, *stream_, x_.data(), DType::kF32, max_tokens_ * args.hidden, 1.0f, input_seed);
    upload_uniform(*device_, *stream_, dy_.data(), DType::kF32, max_tokens_ * args.hidden, 1.0f, input_seed + 1);
    if (check) {
        grads2_ = std::make_unique<MoeParamStore>(*device_, shape, DType::kF32, ep);
        ref_grads_ = std::make_unique<MoeParamStore>(*device_, shape, DType::kF32);
        for (DeviceBuffer* b : {&y2_, &dx2_, &y_ref_, &dx_ref_}) *b = DeviceBuffer(*device_, act_bytes);
    } else {
        full_params_.reset();
    }
}

double EpLayerRank::timed_us(int warmup, int iters, const std::function<void()>& enqueue) {
    for (int i = 0; i < warmup; ++i) enqueue();
    comm().barrier(*stream_);  // every rank's clock starts when all have finished their warmup
    return time_us(*device_, *stream_, 0, iters, enqueue);
}

EpCaseResult EpLayerRank::run_case(DispatchMode dispatch, std::int64_t tokens, const CommonArgs& common) {
    const MoeConfig config = make_config(args_, dispatch, DType::kF32);
    if (!layer_ || layer_dispatch_ != dispatch) {
        layer_.reset();
        layer_ = std::make_unique<MoeLayer>(config, *device_, max_tokens_, &comm());  // collective
        if (args_.provider_given) layer_->set_grouped_gemm_provider(args_.provider);
        layer_dispatch_ = dispatch;
    }
    MoeLayer& layer = *layer_;
    Stream& s = *stream_;
    const std::int64_t T = tokens, H = args_.hidden;
    const Tensor x(x_.data(), DType::kF32, {T, H}), y(y_.data(), DType::kF32, {T, H});
    const Tensor dy(dy_.data(), DType::kF32, {T, H}), dx(dx_.data(), DType::kF32, {T, H});
    const MoeParams& p = params_->view();
    const MoeGrads& g = grads_->view();

    EpCaseResult r;
    r.fwd_us = timed_us(common.warmup, common.iters, [&] { layer.forward(x, Tensor{}, p, y, s); });
    r.train_us = timed_us(common.warmup, common.iters, [&] {
        layer.forward(x, Tensor{}, p, y, s);
        layer.backward(dy, p, g, dx, Tensor{}, s);
    });
    if (link_) link_->reset_counters();  // time_us synchronized the stream: no link op is pending
    comm().barrier(s);
    LayerPass pass{layer, p, g, x, y, dy, dx, args_.shared_expert, true};
    r.stage_us = stage_times_us(*device_, s, pass, common.iters);
    if (link_) r.link_model_us = link_->counters(LinkOp::kAllToAllV).modelled_us / common.iters;
    r.dropped = layer.stats(s).dropped_tokens;
    if (common.check) r.wrong = check(config, T);
    s.synchronize();
    return r;
}

std::int64_t EpLayerRank::check(const MoeConfig& config, std::int64_t T) {
    Stream& s = *stream_;
    const std::int64_t H = args_.hidden;
    const std::size_t n = static_cast<std::size_t>(T * H);
    const Tensor x(x_.data(), DType::kF32, {T, H}), dy(dy_.data(), DType::kF32, {T, H});
    const Tensor y(y_.data(), DType::kF32, {T, H}), dx(dx_.data(), DType::kF32, {T, H});
    const Tensor y2(y2_.data(), DType::kF32, {T, H}), dx2(dx2_.data(), DType::kF32, {T, H});
    const Tensor y_ref(y_ref_.data(), DType::kF32, {T, H}), dx_ref(dx_ref_.data(), DType::kF32, {T, H});
    const MoeParams& p = params_->view();

    // Two more passes on the same inputs: the first is compared with the reference, the second
    // must repeat it bit for bit (no dependence on message arrival order).
    layer_->forward(x, Tensor{}, p, y, s);
    layer_->backward(dy, p, grads_->view(), dx, Tensor{}, s);
    const std::int64_t dropped = layer_->stats(s).dropped_tokens;
    layer_->forward(x, Tensor{}, p, y2, s);
    layer_->backward(dy, p, grads2_->view(), dx2, Tensor{}, s);
    s.synchronize();
    std::int64_t wrong = count_bit_mismatches(download_bytes(s, y.data, y.bytes()),
                                              download_bytes(s, y2.data, y2.bytes()), sizeof(float));
    wrong += count_bit_mismatches(download_bytes(s, dx.data, dx.bytes()), download_bytes(s, dx2.data, dx2.bytes()),
                                  sizeof(float));
    const Tensor* t2 = grads2_->view().begin();
    for (const Tensor* t = grads_->view().begin(); t != grads_->view().end(); ++t, ++t2) {
        if (t->defined())
            wrong += count_bit_mismatches(download_bytes(s, t->data, t->bytes()),
                                          download_bytes(s, t2->data, t2->bytes()), sizeof(float));
    }

    // The single-rank reference: all E experts on this rank's tokens. An expert's gradient in
    // expert parallelism is the sum over every rank's tokens, so the reference's expert gradients
    // are summed over the ranks (in rank order, on every rank).
    MoeLayer ref(config, *device_, max_tokens_);
    if (args_.provider_given) ref.set_grouped_gemm_provider(args_.provider);
    ref.forward(x, Tensor{}, full_params_->view(), y_ref, s);
    ref.backward(dy, full_params_->view(), ref_grads_->view(), dx_ref, Tensor{}, s);
    const std::int64_t ref_dropped = ref.stats(s).dropped_tokens;
    const int ep = inner_->size(), rank = inner_->rank();
    const std::vector<ParamSpec> specs = moe_param_specs(config, ep);
    const Tensor* full = ref_grads_->view().begin();
    for (std::size_t i = 0; i < specs.size(); ++i, ++full)
        if (is_expert_param(specs[i])) comm().all_reduce_sum(full->data, full->numel(), DType::kF32, s);
    s.synchronize();

    wrong += count_off(download_f32(s, y.data, DType::kF32, T * H),
                       download_f32(s, y_ref.data, DType::kF32, T * H).data(), n);
    wrong += count_off(download_f32(s, dx.data, DType::kF32, T * H),
                       download_f32(s, dx_ref.data, DType::kF32, T * H).data(), n);
    full = ref_grads_->view().begin();
    const Tensor* local = grads_->view().begin();
    for (std::size_t i = 0; i < specs.size(); ++i, ++full, ++local) {
        if (!local->defined()) continue;
        const std::vector<float> want = download_f32(s, full->data, DType::kF32, full->numel());
        const std::size_t offset = is_expert_param(specs[i]) ? static_cast<std::size_t>(rank * local->numel()) : 0;
        wrong += count_off(download_f32(s, local->data, DType::kF32, local->numel()), want.data() + offset,
                           static_cast<std::size_t>(local->numel()));
    }
    wrong += std::abs(dropped - ref_dropped);
    return wrong;
}

}  // namespace scmoe::bench
