// Design for your compute: the search behind scmoe-plan. Each candidate configuration (variant, ep,
// chunks, dispatch, capacity factor, micro-batch) trains a few steps of the real Trainer on emulated
// GPUs of the given cluster (every rank an in-process thread, emulated NCCL between them), and is
// ranked by its predicted throughput. Predictions, not measurements: see scmoe/kernels/emu/.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "launch/emu_choice.h"
#include "scmoe/comm/topology.h"
#include "scmoe/models/lm_config.h"
#include "scmoe/moe/config.h"

namespace scmoe::launch {

// The error band printed beside every prediction: how far the emulator's predictions have been from
// measurements, as (predicted - measured) / measured of a throughput or speedup. One place, so that a
// new validation updates every output (docs/emu.md, "Against the ScMoE paper" and issue 25's check of
// the paper's other rows; docs/plan/README.md explains it).
struct ErrorBand {
    double low, high;  // e.g. -0.16, +0.69
    const char* source;
};
inline constexpr ErrorBand kPredictionErrorBand = {
    -0.19, 0.69,
    "the emulator's error against measurements so far, (predicted - measured) / measured: -16% to +23% on the "
    "ScMoE paper's speedups under the scmoe stack (issue 25's full table, docs/emu.md), +69% and +63% on absolute "
    "throughput (gpt2-moe-small on one H100 and one H200, the built-in specs against the acceptance runs of "
    "2026-11-27 and 2026-11-26, docs/results/gpu-h100-2026-11-27, docs/results/gpu-h200-2026-11-26), "
    "-19.0% to +12.1% on CPU step times (four sittings, docs/emu.md)"};
// The measured value a prediction allows, given the band: [predicted / (1 + high), predicted / (1 + low)].
inline double band_low(double predicted) { return predicted / (1.0 + kPredictionErrorBand.high); }
inline double band_high(double predicted) { return predicted / (1.0 + kPredictionErrorBand.low); }

// Memory kept free on every GPU unless --memory-headroom says otherwise: CUDA's context, NCCL's
// buffers and the allocator's fragmentation, which the emulator does not count.
inline constexpr double kDefaultMemoryHeadroom = 0.10;

struct PlanSpace {
    std::vector<std::string> variants;
    std::vector<int> ep;                  // expert-parallel sizes (each divides the world and the experts)
    std::vector<int> chunks;              // 0 = auto (the scheduler's choice), N = forced pieces
    std::vector<DispatchMode> dispatch;   // capacity and/or dropless
    std::vector<float> capacity_factors;  // capacity mode only
    std::vector<std::int64_t> batches;    // sequences per GPU per step; empty: grow until memory ends
    std::int64_t max_batch = 128;         // where an open-ended batch search stops
};

struct PlanCase {
    std::string variant;
    int ep = 1, dp = 1, chunks = 0;
    DispatchMode dispatch = DispatchMode::kCapacity;
    float capacity_factor = 1.25f;
    std::int64_t batch = 8;
    // Results (the mean of the steps after the first; rank 0's).
    bool out_of_memory = false;    // the emulator's out of memory, or the peak above the headroom
    std::string error;             // the out-of-memory message, or another failure
    double step_ms = 0, tokens_per_s = 0, exposed_comm_pct = 0;
    double exposed_a2a_pct = 0, exposed_grad_pct = 0;  // the exposed time split: all-to-all, gradient all-reduce
    double comm_pct = 0;           // of the step: the time some communication runs (exposed or not)
    double dropped_tokens = 0;     // per step, over every rank and MoE layer (capacity mode)
    double peak_gib = 0;           // the largest peak device memory over the ranks
};

struct PlanRequest {
    models::LmConfig model;
    Topology cluster;              // = emu.topology
    EmuChoice emu;                 // the emulated GPU, routing and cluster flags
    int steps = 3;                 // per candidate; the first (calibration) is not timed
    double memory_headroom = kDefaultMemoryHeadroom;  // fraction of each GPU's memory kept free
    PlanSpace space;
};

// Every candidate of the space, in a fixed order (variant-major), for the given batch list (the
// space's, or one batch when the search grows them).
std::vector<PlanCase> plan_cases(const PlanRequest& request);
// Runs one candidate on world = cluster.world_size() emulated GPUs; never throws for a candidate
// that fails (out of memory, a bad shape): its error is recorded. A peak above the memory headroom
// marks it out of memory too.
void run_plan_case(const PlanRequest& request, PlanCase& c);
// Runs the whole search: the space's cases; with no batch list, each configuration from batch 4 up,
// doubling, until it runs out of memory (or headroom) or reaches max_batch. `progress` (optional) is
// called after each case with its index.
std::vector<PlanCase> run_plan(const PlanRequest& request,
                               const std::function<void(const PlanCase&, std::size_t)>& progress = {});
// Sorted by tokens/s, best first; failed candidates last.
void rank_plan(std::vector<PlanCase>& cases);

// Warnings for a winner at the edge of the searched range (largest micro-batch tried, a larger
// expert-parallel size not tried, the smallest or largest capacity factor tried, ...): one line each.
// `cases`: every case run (to know what was tried and what ran out of memory).
std::vector<std::string> search_edge_warnings(const PlanRequest& request, const std::vector<PlanCase>& cases,
                                              const PlanCase& best);

// The commands that give `c` again: the same cluster flags in all three tools.
struct PlanCommands {
    std::string train_emu;  // scmoe-train --backend emu ... (the emulated replay of the whole model)
    std::string bench_emu;  // scmoe-bench block --backend emu ... (its MoE block, the ep group's ranks)
    std::string train_cuda; // mpirun -np N [--map-by ppr:G:node] scmoe-train --backend cuda ...
    std::string slurm;      // multi-node: sbatch ... launch/slurm.sbatch <flags>; else empty
};
PlanCommands plan_commands(const PlanRequest& request, const PlanCase& c);
// The old single command: plan_commands(...).train_cuda.
std::string train_command(const PlanRequest& request, const PlanCase& c);

}  // namespace scmoe::launch
