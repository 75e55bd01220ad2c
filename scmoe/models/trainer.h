// Trainer: one rank's training loop for the LM — batches from its data shard, forward/backward with
// the ScMoE overlap, the dp x ep gradient reduction, clipping, AdamW, metrics and checkpoints.
// scmoe-train runs one per rank (threads with in-process communicators, or processes under mpirun);
// tests drive it the same way.
//
// Per step, on every rank (all ranks call step() together; it is collective over the world):
//   loss_r = mean CE of the rank's batch (+ router losses)   grads of loss_r (grad_scale 1/tokens)
//   reduce: dense over the world, experts over their replicas (overlapped with the backward:
//           each block's all-reduce starts once its gradients are final); norm of the summed grads
//   scale  = clip_scale(norm / world, max_grad_norm) / world;   AdamW with lr(step)
// The logged loss is the mean over ranks of loss_r without the router losses.
//
// Evaluation (evaluate(), collective): the held-out loss, mean CE in nats per predicted byte over
// fixed windows of the eval data (EvalWindows: the first min(all, eval_batches x batch x world)
// windows in stream order, sharded over the ranks), forward only, without gate noise, router losses
// not included; the per-rank sums are added in double in rank order. Training is unaffected: a run
// that evaluates takes bitwise the same steps as one that does not.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "scmoe/kernels/device.h"
#include "scmoe/models/checkpoint.h"
#include "scmoe/models/data.h"
#include "scmoe/models/lm.h"
#include "scmoe/models/optimizer.h"
#include "scmoe/models/parallel.h"

namespace scmoe {
class Tracer;
}

namespace scmoe::models {

// A fault to inject (testing) at step `step` (1-based) on rank `rank`:
// - kGradient: the rank's backward runs with a loss gradient scale of FLT_MAX instead of 1/tokens,
//   so its gradients overflow to Inf (and NaN where infinities meet) before the reduction, as a
//   loss scale set too high makes them. The loss stays finite. What follows is the trainer's answer
//   to any non-finite gradient: the reduction carries it to every rank, every rank stops at that
//   step with the same error, before any update, and no checkpoint of that step is written.
// - kHostError: step() throws scmoe::Error on that rank right after it enqueued the step's forward
//   and backward, while its streams (and its peers') are still inside the step's collectives: a
//   host-side failure mid-step. The rank's trainer must unwind safely while its streams still work,
//   and its peers must fail (at once when the launcher abandons the rank's groups) instead of hanging.
struct StepFault {
    enum class Kind { kGradient, kHostError };
    Kind kind = Kind::kGradient;
    std::int64_t step = 0;
    int rank = 0;
};

struct TrainConfig {
    LmConfig model;
    std::int64_t batch = 8;         // sequences per rank per step
    std::int64_t steps = 100;       // total steps of the run (the LR schedule's length)
    AdamWConfig adamw;              // schedule.total_steps is set from `steps`
    float max_grad_norm = 1.0f;     // <= 0: no clipping
    std::uint64_t seed = 1234;      // parameters and data order
    std::vector<std::string> data;  // files; empty: default_corpus()
    bool overlap = true;            // the ScMoE overlap (numerics identical either way)
    // The gradient all-reduce overlapped with the backward (GradientReducer::grads_ready), each
    // block's as soon as its gradients are final; only with `overlap`. Numerics identical either way.
    bool overlap_grad_reduce = true;
    // What the gradients travel in through that all-reduce: kF32, or kBF16 (half the bytes; each
    // rank's gradient and the sum rounded to bf16: GradientReducer).
    DType grad_reduce_dtype = DType::kF32;
    bool calibrate = true;  // measure op times once and choose the expert slots (Eq. 11)
    // Held-out files for evaluate(); {kDefaultHeldOut}: the default corpus's held-out last tenth
    // (only without `data`); empty: no evaluation.
    std::vector<std::string> eval_data;
    std::int64_t eval_batches = 64;  // caps the windows at eval_batches x batch x world; <= 0: all
    std::optional<StepFault> fault;  // testing only (scmoe-train: SCMOE_FAULT_GRAD, SCMOE_FAULT_THROW)
};

// TrainConfig::eval_data = {kDefaultHeldOut}: the held-out split of default_corpus().
inline constexpr const char* kDefaultHeldOut = "default";

struct EvalMetrics {
    std::int64_t step = 0;     // steps done when evaluated
    double loss = 0;           // mean CE in nats per predicted byte, over every rank's windows
    double ppl = 0;            // exp(loss)
    std::int64_t tokens = 0;   // predicted bytes evaluated, over every rank (windows x seq_len)
    std::int64_t windows = 0;  // over every rank
    double eval_ms = 0;        // wall time on this rank
};

struct StepMetrics {
    std::int64_t step = 0;   // 1-based, after the update
    double loss = 0;         // mean CE over every rank's tokens
    double router_loss = 0;  // mean over ranks of the weighted aux + z losses
    float lr = 0;
    float grad_norm = 0;              // of the mean gradient, before clipping
    double step_ms = 0;               // wall time of the step on this rank
    double tokens_per_s = 0;          // every rank's tokens / step time
    double exposed_comm_pct = 0;      // of step_ms: the time in the step's trace in which communication
                                      // (an all-to-all, a gradient all-reduce) runs and no compute runs
                                      // (summarize_overlap); the loss agreement is not traced
    std::int64_t dropped_tokens = 0;  // over every rank and MoE layer
};

class Trainer {
  public:
    // Collective over comms.world (every rank constructs together). Loads the data (throws naming a
    // missing or empty file) and initialises the parameters from config.seed.
    Trainer(const TrainConfig& config, Device& device, const ParallelLayout& layout, TrainComms comms);
    ~Trainer();

    // One training step (collective). Throws scmoe::Error on a non-finite loss or gradient: on
    // every rank, at the same step, with the same message, before anything is updated. A failed
    // collective (CommError) is thrown at once, without the loss agreement.
    StepMetrics step();
    // The held-out loss of the current parameters (collective; see the top of this file). Changes
    // nothing a later step depends on. Throws scmoe::Error without eval data or on a non-finite loss.
    EvalMetrics evaluate();
    // Inference speed: the mean host time in ms of `passes` (>= 1) forward-only passes (no gate
    // noise, no backward) over the batch the next step would read, after one untimed pass.
    // Collective like a step; changes nothing a later step depends on.
    double time_forward(int passes);
    bool has_eval_data() const { return eval_windows_ != nullptr; }
    const EvalWindows* eval_windows() const { return eval_windows_.get(); }
    std::string eval_description() const { return eval_description_; }
    std::int64_t steps_done() const { return steps_done_; }
    // A stop request agreed over the world (collective; cheap: one i32 per rank, no device work).
    // `requested` is this rank's request (a signal number; 0: none). Returns the request of the
    // lowest rank that has one, or 0: the same on every rank, so every rank stops after the same
    // step even when only one process was signalled. scmoe-train calls it at each step boundary.
    int agree_stop(int requested);

    // Checkpoints (collective): see scmoe/models/checkpoint.h for the layout and the protocol.
    // save() writes root/step-XXXXXXXX atomically and points root/latest at it; load() verifies
    // the checkpoint (manifest, checksums, run and save ids) and restores everything a step depends
    // on (parameters, AdamW state, data position, step), so training continues bitwise as if
    // uninterrupted. load() refuses a checkpoint of another model config or world/ep, and one whose
    // training settings or data differ unless `allow_change` names them (checkpoint_setting_names();
    // the result's notes report the allowed changes and a fallback from a bad `latest`).
    std::string save(const std::string& root, int keep = 2);
    CheckpointLoad load(const std::string& path, const std::vector<std::string>& allow_change = {});
    // The run id its checkpoints carry: "" until the first save or load.
    const std::string& run_id() const { return checkpoint_run_.run_id; }
    // Prepares `root` for this run's checkpoints (collective, after load(), before the first step):
    // its lock, held while the trainer lives; a fresh run refused in a directory with checkpoints
    // unless options.overwrite; writable, with room for options.keep's checkpoints
    // (checkpoint.h's open_checkpoint_dir). Returns notes to print (rank 0's).
    std::vector<std::string> open_checkpoint_dir(const std::string& root, const CheckpointDirOptions& options);

    const TrainConfig& config() const { return config_; }
    const ParallelLayout& layout() const { return layout_; }
    LanguageModel& model() { return *model_; }
    ByteBatcher& batcher() { return *batcher_; }
    std::vector<AdamW*> optimizers();
    std::string data_description() const { return data_description_; }
    // The chosen expert slots (after the first step's calibration), for the log.
    std::string schedule_description() const { return schedule_description_; }
    // Records the next steps' ops into `trace` (nullptr: the trainer's own tracer, cleared every step).
    void set_trace(Tracer* trace) { trace_ = trace; }

  private:
    // Throws on every rank unless every rank was given the same settings (check_same_on_every_rank):
    // the model, layout, batch, schedule, seed, optimizer and gradient sums. First in the
    // constructor, before any collective depends on them.
    void agree_on_settings();
    void calibrate_once(const ByteBatcher::Batch& batch);
    // The sum over the world of `values` (f32), in rank order; every rank gets the same result.
    std::vector<float> world_sum(const std::vector<float>& values);
    // The same in double, exactly: every rank's value gathered bit for bit, added in rank order.
    double world_sum_exact(double value);
    void open_eval_data(const DefaultCorpus* corpus);
    // The settings and data files checkpoint_run_ records (after config_ is final).
    void init_checkpoint_run(const std::vector<std::string>& data_paths);

    TrainConfig config_;
    Device& device_;
    ParallelLayout layout_;
    TrainComms comms_;
    std::string data_description_, schedule_description_, eval_description_;
    std::unique_ptr<LanguageModel> model_;
    std::unique_ptr<ByteBatcher> batcher_;
    std::unique_ptr<EvalWindows> eval_windows_;
    std::vector<std::unique_ptr<AdamW>> adamw_;
    std::unique_ptr<GradientReducer> reducer_;
    DeviceBuffer reduce_buffer_, gather_buffer_;
    std::unique_ptr<Tracer> step_trace_;  // every step's ops, for exposed_comm_pct
    std::int64_t steps_done_ = 0;
    CheckpointRun checkpoint_run_;  // the settings and data a checkpoint records, the run id
    bool calibrated_ = false;
    Tracer* trace_ = nullptr;
};

}  // namespace scmoe::models
