// scmoe-train's reporting on rank 0: the progress and eval lines, the metrics JSON lines and the
// summary table of the variants.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "scmoe/models/trainer.h"

namespace scmoe::launch {

// What one variant's run reports (rank 0's view; losses and counts are already world means/sums).
struct RunSummary {
    std::string variant;
    double first_loss = 0, final_loss = 0;                       // the first step's, the mean of the last 10% of steps
    double tokens_per_s = 0, step_ms = 0, exposed_comm_pct = 0;  // means over the steps after the first
    double tflops_per_device = 0;  // model training FLOP/s per rank (tokens/s x FLOPs per token / world)
    std::int64_t steps = 0, dropped = 0;
    std::optional<models::EvalMetrics> eval;  // the last evaluation, with --eval-data
    double forward_ms = 0;                    // --infer-passes: mean forward-only pass (0: not measured)
};

// "42s", "3m07s", "1h05m".
std::string format_eta(double seconds);
// "step   150/200  loss 2.3793  lr 1.23e-03  7310 tok/s ...  ETA 12s".
std::string step_line(const models::StepMetrics& m, std::int64_t total_steps, double eta_seconds);
// "eval step 150: loss 2.4123  ppl 11.17  (15232 tokens in 238 windows, 1.2 s)".
std::string eval_line(const models::EvalMetrics& e);
// One JSON object (one line of --metrics) per step and per evaluation.
std::string step_json(const std::string& variant, const models::StepMetrics& m);
std::string eval_json(const std::string& variant, const models::EvalMetrics& e);
// Before a resumed run appends to the --metrics file at `path`: drops the lines of steps after
// `step` (the checkpoint's), which the interrupted run logged past its last checkpoint and the
// resumed run logs again, so that every step is there exactly once. Rewrites the file atomically;
// keeps lines that are not JSON objects with a "step" as they are; no file: nothing to do. Throws
// scmoe::Error naming the file on an I/O error.
void drop_metrics_after(const std::string& path, std::int64_t step);

// The table of every variant (the first is the speedup's and the loss's baseline), with eval loss
// and perplexity columns when a run evaluated, and each variant's model TFLOP/s (MFU with peak_tflops).
void print_summary(const std::vector<RunSummary>& runs, double peak_tflops);

}  // namespace scmoe::launch
