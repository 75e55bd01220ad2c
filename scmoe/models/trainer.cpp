#include "scmoe/models/trainer.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <optional>
#include <nlohmann/json.hpp>
#include <span>
#include <vector>

#include "scmoe/comm/communicator.h"
#include "scmoe/kernels/error.h"
#include "scmoe/models/checkpoint.h"
#include "scmoe/moe/moe_layer.h"
#include "scmoe/moe/trace.h"

namespace scmoe::models {

Trainer::Trainer(const TrainConfig& config, Device& device, const ParallelLayout& layout, TrainComms comms)
    : config_(config), device_(device), layout_(layout), comms_(comms) {
    layout_.validate();
    SCMOE_CHECK(layout_.world == 1 || comms_.world,
                "Trainer: world size " << layout_.world << " needs a world communicator");
    config_.model.backbone.dtype = device.compute_dtype();
    agree_on_settings();
    SCMOE_CHECK(config_.batch > 0, "batch = " << config_.batch << " sequences per rank must be > 0");
    SCMOE_CHECK(config_.steps > 0, "steps = " << config_.steps << " must be > 0");
    config_.model.validate();
    SCMOE_CHECK(config_.model.moe.num_experts % layout_.ep == 0,
                "experts = " << config_.model.moe.num_experts << " is not divisible by ep = " << layout_.ep);
    config_.adamw.schedule.total_steps = config_.steps;
    if (config_.fault)
        SCMOE_CHECK(config_.fault->rank >= 0 && config_.fault->rank < layout_.world && config_.fault->step >= 1,
                    "fault: step " << config_.fault->step << ", rank " << config_.fault->rank
                                   << ": expected a step >= 1 and a rank of the world");

    std::optional<DefaultCorpus> corpus;
    std::vector<std::string> paths = config_.data;
    if (paths.empty()) {
        corpus = default_corpus();
        paths = corpus->paths;
        data_description_ = corpus->description;
    } else {
        data_description_ = std::to_string(paths.size()) + " file(s) from --data";
    }
    ByteDataset train_data(paths);
    if (corpus) train_data.restrict_to(0, corpus->held_out_begin);  // never a held-out byte
    ByteBatcherConfig bc;
    bc.batch = config_.batch;
    bc.seq_len = config_.model.backbone.seq_len;
    bc.rank = layout_.rank;
    bc.world = layout_.world;
    bc.seed = config_.seed;
    batcher_ = std::make_unique<ByteBatcher>(std::move(train_data), bc);
    init_checkpoint_run(paths);
    open_eval_data(corpus ? &*corpus : nullptr);

    const std::int64_t tokens = config_.batch * config_.model.backbone.seq_len;
    // The schedule is agreed over the world: one global launch order (review R1).
    model_ = std::make_unique<LanguageModel>(config_.model, device, tokens, comms_.ep, comms_.world);
    model_->init_params(config_.seed);
    for (const ParamGroup& g : model_->param_groups())
        adamw_.push_back(std::make_unique<AdamW>(device, g.params, g.dtype, g.numel, config_.adamw, model_->stream()));
    reducer_ = std::make_unique<GradientReducer>(*model_, layout_, comms_, device, config_.grad_reduce_dtype);
    reduce_buffer_ = DeviceBuffer(device, 8 * sizeof(float));
    gather_buffer_ = DeviceBuffer(device, static_cast<std::size_t>(layout_.world) * sizeof(double));
    step_trace_ = std::make_unique<Tracer>(device, layout_.rank);
    model_->blocks().synchronize();
}

Trainer::~Trainer() = default;

void Trainer::agree_on_settings() {
    // What every rank must share before any collective depends on it: the model (its shapes size
    // every exchange), the layout, the batch and schedule, the seed (the replicas' initial
    // parameters), the optimizer, and how gradients are summed (the order and dtype of the calls).
    // Data paths, evaluation and fault injection may differ per rank.
    std::vector<std::pair<std::string, std::string>> fields = {
        {"world", std::to_string(layout_.world)}, {"ep", std::to_string(layout_.ep)}};
    const nlohmann::ordered_json model = nlohmann::ordered_json::parse(config_.model.to_json());
    for (auto it = model.begin(); it != model.end(); ++it) fields.emplace_back("model " + it.key(), it.value().dump());
    auto number = [](float v) {  // the shortest text that reads back as the same float
        char buf[32];
        const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
        return ec == std::errc() ? std::string(buf, end) : std::string("?");
    };
    const AdamWConfig& a = config_.adamw;
    fields.insert(fields.end(),
                  {{"batch", std::to_string(config_.batch)},
                   {"steps", std::to_string(config_.steps)},
                   {"seed", std::to_string(config_.seed)},
                   {"lr", number(a.schedule.peak_lr)},
                   {"min lr", number(a.schedule.min_lr)},
                   {"warmup", std::to_string(a.schedule.warmup_steps)},
                   {"adamw", number(a.beta1) + " " + number(a.beta2) + " " + number(a.eps) + " " + number(a.weight_decay)},
                   {"clip", number(config_.max_grad_norm)},
                   {"overlap", config_.overlap ? "on" : "off"},
                   {"gradient all-reduce", std::string(config_.overlap_grad_reduce ? "overlapped" : "after the backward") +
                                               " in " + dtype_name(config_.grad_reduce_dtype)},
                   {"calibrate", config_.calibrate ? "on" : "off"}});
    auto stream = device_.create_stream();
    check_same_on_every_rank(comms_.world, fields, "training settings", device_, *stream);
}

void Trainer::open_eval_data(const DefaultCorpus* corpus) {
    if (config_.eval_data.empty()) return;
    const std::int64_t seq_len = config_.model.backbone.seq_len;
    const std::int64_t max_windows =
        config_.eval_batches > 0 ? config_.eval_batches * config_.batch * layout_.world : 0;
    const bool held_out = config_.eval_data == std::vector<std::string>{kDefaultHeldOut};
    if (held_out) {
        SCMOE_CHECK(corpus, "eval data '" << kDefaultHeldOut << "' is the default corpus's held-out split; with "
                                          << "training files (--data) name held-out files instead");
        ByteDataset data(corpus->paths, "eval data");
        const std::int64_t end = data.size();
        data.restrict_to(corpus->held_out_begin, end);
        eval_description_ = "the default corpus's held-out last tenth, bytes [" +
                            std::to_string(corpus->held_out_begin) + ", " + std::to_string(end) + ")";
        eval_windows_ =
            std::make_unique<EvalWindows>(std::move(data), seq_len, max_windows, layout_.rank, layout_.world);
    } else {
        eval_windows_ = std::make_unique<EvalWindows>(ByteDataset(config_.eval_data, "eval data"), seq_len, max_windows,
                                                      layout_.rank, layout_.world);
        eval_description_ = std::to_string(config_.eval_data.size()) + " file(s), " +
                            std::to_string(eval_windows_->data().size()) + " bytes";
    }
    const EvalWindows& w = *eval_windows_;
    eval_description_ += ": " + std::to_string(w.num_windows()) + " of its " + std::to_string(w.stream_windows()) +
                         " windows of " + std::to_string(seq_len + 1) + " bytes, in " +
                         std::to_string(w.num_batches(config_.batch)) + " batches per rank";
}

std::vector<AdamW*> Trainer::optimizers() {
    std::vector<AdamW*> out;
    for (auto& a : adamw_) out.push_back(a.get());
    return out;
}

std::vector<float> Trainer::world_sum(const std::vector<float>& values) {
    if (!comms_.world || comms_.world->size() == 1) return values;
    std::vector<float> out = values;
    all_reduce_sum_host(*comms_.world, out.data(), static_cast<std::int64_t>(out.size()), reduce_buffer_.data(),
                        model_->stream());
    return out;
}

double Trainer::world_sum_exact(double value) {
    if (!comms_.world || comms_.world->size() == 1) return value;
    const auto world = static_cast<std::size_t>(comms_.world->size());
    Stream& s = model_->stream();
    // A double travels as two i32 words: all_gather copies them bit for bit.
    auto* slots = static_cast<double*>(gather_buffer_.data());
    double* own = slots + comms_.world->rank();
    s.copy(own, &value, sizeof(double));
    comms_.world->all_gather(own, 2, slots, DType::kI32, s);
    std::vector<double> values(world);
    s.copy(values.data(), slots, world * sizeof(double));
    s.synchronize();
    double sum = 0;
    for (double v : values) sum += v;
    return sum;
}

void Trainer::calibrate_once(const ByteBatcher::Batch& batch) {
    const std::int64_t tokens = config_.batch * config_.model.backbone.seq_len;
    model_->calibrate(batch.inputs.data(), batch.targets.data(), tokens);
    schedule_description_ = model_->blocks().describe_schedule();
    calibrated_ = true;
}

StepMetrics Trainer::step() {
    // The device's host clock: wall time on CPU and CUDA, the emulated host's on emu.
    double t0 = device_.host_time_us();
    const ByteBatcher::Batch batch = batcher_->next();
    if (config_.calibrate && !calibrated_) {
        calibrate_once(batch);
        t0 = device_.host_time_us();  // the one-off calibration is not part of the step time
    }
    const std::int64_t tokens = config_.batch * config_.model.backbone.seq_len;
    const bool overlap_reduce = config_.overlap && config_.overlap_grad_reduce;
    // Every op of the step is traced (the caller's tracer or the trainer's own): exposed_comm_pct.
    Tracer& trace = trace_ ? *trace_ : *step_trace_;
    if (!trace_) step_trace_->clear();
    const std::size_t first_entry = trace.entries().size();
    model_->set_noise_key(static_cast<std::uint64_t>(steps_done_), static_cast<std::uint64_t>(layout_.rank));
    const StepFault* fault =
        config_.fault && config_.fault->step == steps_done_ + 1 && config_.fault->rank == layout_.rank ? &*config_.fault
                                                                                                       : nullptr;
    const bool overflow = fault && fault->kind == StepFault::Kind::kGradient;
    const float grad_scale = overflow ? std::numeric_limits<float>::max() : 1.0f / static_cast<float>(tokens);
    model_->forward_backward(batch.inputs.data(), batch.targets.data(), tokens, grad_scale,
                             config_.overlap, &trace,
                             overlap_reduce ? reducer_->grads_ready(&trace) : LanguageModel::GradsReadyFn{});
    Stream& s = model_->stream();
    if (fault && fault->kind == StepFault::Kind::kHostError)
        SCMOE_FAIL("step " << steps_done_ + 1 << ": injected host error on rank " << layout_.rank
                           << " (StepFault), its step's work still in flight");
    if (overlap_reduce)
        reducer_->finish();
    else
        reducer_->reduce(&trace);
    // The loss, agreed over the world before anything is updated: a rank whose loss is not finite
    // (or whose loss could not be read) makes every rank stop at this step, each having made the
    // same collective calls, instead of leaving its peers waiting. A failed collective is not
    // agreed on: its communicator is unusable, the peers have failed too or will time out, and the
    // agreement could only wait out another timeout before reporting a later, wrong operation.
    // Slots 3.. flag the ranks that failed, so every rank names them in the same words.
    std::vector<float> local(3 + static_cast<std::size_t>(layout_.world), 0.0f);
    std::string local_failure;
    try {
        local[0] = static_cast<float>(model_->loss_sum() / static_cast<double>(tokens));
        local[1] = static_cast<float>(model_->router_loss());
        local[2] = static_cast<float>(model_->dropped_tokens());
        if (!std::isfinite(local[0])) local_failure = "the loss is not finite";
    } catch (const CommError&) {
        throw;
    } catch (const std::exception& e) {
        local_failure = e.what();
    }
    if (!local_failure.empty()) local[3 + static_cast<std::size_t>(layout_.rank)] = 1.0f;
    const std::vector<float> sums = world_sum(local);
    std::string failed;
    for (int r = 0; r < layout_.world; ++r)
        if (sums[3 + static_cast<std::size_t>(r)] != 0.0f) failed += (failed.empty() ? "" : ", ") + std::to_string(r);
    if (!failed.empty())
        SCMOE_FAIL("step " << steps_done_ + 1 << ": the loss or its gradients are not finite on rank(s) " << failed
                           << ": every rank stops at this step, before any update"
                           << (local_failure.empty() ? "" : "; on this rank: " + local_failure));

    const float norm = reducer_->global_norm() / static_cast<float>(layout_.world);
    SCMOE_CHECK(std::isfinite(norm), "step " << steps_done_ + 1 << ": the gradient norm is " << norm
                                             << " (diverged; lower the learning rate)");
    const float scale = clip_scale(norm, config_.max_grad_norm) / static_cast<float>(layout_.world);
    float lr = 0;
    for (std::size_t g = 0; g < adamw_.size(); ++g) lr = adamw_[g]->step(model_->param_groups()[g].grads, scale, s);
    model_->blocks().synchronize();
    const double step_ms = (device_.host_time_us() - t0) / 1000.0;

    ++steps_done_;
    StepMetrics m;
    m.step = steps_done_;
    m.loss = static_cast<double>(sums[0]) / layout_.world;
    m.router_loss = static_cast<double>(sums[1]) / layout_.world;
    m.dropped_tokens = static_cast<std::int64_t>(std::lround(sums[2]));
    m.lr = lr;
    m.grad_norm = norm;
    m.step_ms = step_ms;
    m.tokens_per_s = static_cast<double>(tokens) * layout_.world / (step_ms / 1000.0);
    trace.collect();
    const std::span<const TraceEntry> step_entries = std::span(trace.entries()).subspan(first_entry);
    m.exposed_comm_pct = std::min(100.0, summarize_overlap(step_entries).exposed_us / 1000.0 / step_ms * 100.0);
    return m;
}

namespace {

// Evaluation mode for the scope (BlockStack::set_training): no gate noise, and attention keeps no
// statistics for a backward; restored on the way out.
class EvalMode {
  public:
    explicit EvalMode(LanguageModel& model) : blocks_(model.blocks()) { blocks_.set_training(false); }
    ~EvalMode() { blocks_.set_training(true); }
    EvalMode(const EvalMode&) = delete;
    EvalMode& operator=(const EvalMode&) = delete;

  private:
    BlockStack& blocks_;
};

}  // namespace

double Trainer::time_forward(int passes) {
    SCMOE_CHECK(passes >= 1, "Trainer::time_forward: passes = " << passes << ", expected >= 1");
    const ByteBatcherState before = batcher_->state();
    const ByteBatcher::Batch batch = batcher_->next();
    batcher_->restore(before);
    const std::int64_t tokens = config_.batch * config_.model.backbone.seq_len;
    EvalMode eval_mode(*model_);
    double total_us = 0;
    for (int i = 0; i <= passes; ++i) {
        const double t0 = device_.host_time_us();
        model_->forward(batch.inputs.data(), batch.targets.data(), tokens, config_.overlap);
        model_->blocks().synchronize();
        if (i > 0) total_us += device_.host_time_us() - t0;  // the first pass is the warm-up
    }
    return total_us / 1000.0 / passes;
}

EvalMetrics Trainer::evaluate() {
    SCMOE_CHECK(eval_windows_, "Trainer::evaluate: no eval data (TrainConfig::eval_data is empty)");
    const double t0 = device_.host_time_us();
    const EvalWindows& w = *eval_windows_;
    const std::int64_t seq_len = config_.model.backbone.seq_len, batch = config_.batch;
    std::vector<std::int32_t> inputs(static_cast<std::size_t>(batch * seq_len)), targets(inputs.size());
    EvalMode eval_mode(*model_);
    // As in step(): a rank whose loss is not finite (or unreadable) still makes every collective call,
    // then every rank stops at the agreement below.
    std::exception_ptr local_error;
    double loss_sum = 0;
    for (std::int64_t b = 0, done = 0; b < w.num_batches(batch); ++b) {
        const std::int64_t count = std::min(batch, w.shard_windows() - done);
        // A rank whose shard is used up still runs a pass (the MoE all-to-alls are collective over
        // its expert-parallel group): of window 0, not counted.
        const std::int64_t passed = std::max<std::int64_t>(count, 1);
        w.read(count > 0 ? w.first_window() + done : 0, passed, inputs.data(), targets.data());
        model_->forward(inputs.data(), targets.data(), passed * seq_len, config_.overlap);
        if (count > 0) done += count;
        if (count <= 0 || local_error) continue;
        try {
            loss_sum += model_->loss_sum();
        } catch (const CommError&) {
            throw;  // as in step(): no agreement after a failed collective
        } catch (...) {
            local_error = std::current_exception();
            loss_sum = std::nan("");
        }
    }
    model_->blocks().synchronize();
    const double total = world_sum_exact(loss_sum);
    if (!std::isfinite(total)) {
        // Every rank takes part in naming the ranks whose loss sum was not finite, and why (a rank's
        // own error, e.g. the layer's NaN check, or the sum), before a rank rethrows its own error:
        // none says only "another rank", and none is left waiting in the gather.
        std::string mine;
        if (local_error) {
            try {
                std::rethrow_exception(local_error);
            } catch (const std::exception& err) {
                mine = err.what();
            } catch (...) {
                mine = "an unknown error";
            }
        } else if (!std::isfinite(loss_sum)) {
            mine = std::to_string(loss_sum);
        }
        const std::vector<std::string> causes = gather_strings(comms_.world, mine, model_->device(), model_->stream());
        if (local_error) std::rethrow_exception(local_error);
        std::string ranks;
        for (std::size_t r = 0; r < causes.size(); ++r)
            if (!causes[r].empty()) ranks += (ranks.empty() ? "" : "; ") + std::to_string(r) + " (" + causes[r] + ")";
        SCMOE_FAIL("eval at step " << steps_done_ << ": the held-out loss sum is not finite on rank"
                                   << (ranks.find(';') == std::string::npos ? " " : "s ") << ranks);
    }
    if (local_error) std::rethrow_exception(local_error);
    EvalMetrics e;
    e.step = steps_done_;
    e.windows = w.num_windows();
    e.tokens = w.num_windows() * seq_len;
    e.loss = total / static_cast<double>(e.tokens);
    e.ppl = std::exp(e.loss);
    e.eval_ms = (device_.host_time_us() - t0) / 1000.0;
    return e;
}

int Trainer::agree_stop(int requested) {
    if (!comms_.world || comms_.world->size() == 1) return requested;
    // Slot r holds rank r's request; gather_buffer_ (world doubles) is scratch enough for it.
    std::vector<std::int32_t> slots(static_cast<std::size_t>(comms_.world->size()), 0);
    slots[static_cast<std::size_t>(comms_.world->rank())] = requested;
    all_reduce_sum_host(*comms_.world, slots.data(), static_cast<std::int64_t>(slots.size()), gather_buffer_.data(),
                        model_->stream());
    for (std::int32_t s : slots)
        if (s != 0) return s;
    return 0;
}

std::string Trainer::save(const std::string& root, int keep) {
    return save_checkpoint(root, {layout_, comms_.world, *model_, optimizers(), *batcher_, steps_done_, &checkpoint_run_},
                           keep);
}

CheckpointLoad Trainer::load(const std::string& path, const std::vector<std::string>& allow_change) {
    return load_checkpoint(
        path, {layout_, comms_.world, *model_, optimizers(), *batcher_, steps_done_, &checkpoint_run_}, allow_change);
}

std::vector<std::string> Trainer::open_checkpoint_dir(const std::string& root, const CheckpointDirOptions& options) {
    return models::open_checkpoint_dir(
        root, {layout_, comms_.world, *model_, optimizers(), *batcher_, steps_done_, &checkpoint_run_}, options);
}

namespace {

// A float as the shortest text that reads back as it ("0.003"), a JSON number.
std::string json_number(float v) {
    char buf[64];
    const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
    return ec == std::errc() && std::isfinite(v) ? std::string(buf, end) : "null";
}

}  // namespace

void Trainer::init_checkpoint_run(const std::vector<std::string>& data_paths) {
    const LrSchedule& lr = config_.adamw.schedule;
    checkpoint_run_.settings = {{"lr", json_number(lr.peak_lr)},
                                {"min-lr", json_number(lr.min_lr)},
                                {"warmup", std::to_string(lr.warmup_steps)},
                                {"steps", std::to_string(config_.steps)},
                                {"weight-decay", json_number(config_.adamw.weight_decay)},
                                {"beta1", json_number(config_.adamw.beta1)},
                                {"beta2", json_number(config_.adamw.beta2)},
                                {"eps", json_number(config_.adamw.eps)},
                                {"clip", json_number(config_.max_grad_norm)},
                                {"batch", std::to_string(config_.batch)}};
    checkpoint_run_.data = data_paths;
}

}  // namespace scmoe::models
