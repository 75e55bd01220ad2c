// Design for your compute: the search behind scmoe-plan. Each candidate configuration (variant, ep,
// chunks, capacity factor, micro-batch) trains a few steps of the real Trainer on emulated GPUs of
// the given cluster (every rank an in-process thread, emulated NCCL between them), and is ranked by
// its predicted throughput. Predictions, not measurements: see scmoe/kernels/emu/.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "scmoe/comm/topology.h"
#include "launch/emu_choice.h"
#include "scmoe/models/lm_config.h"

namespace scmoe::launch {

struct PlanSpace {
    std::vector<std::string> variants;
    std::vector<int> ep;                  // expert-parallel sizes (each divides the world and the experts)
    std::vector<int> chunks;              // 0 = auto (the scheduler's choice), N = forced pieces
    std::vector<float> capacity_factors;
    std::vector<std::int64_t> batches;    // sequences per GPU per step
};

struct PlanCase {
    std::string variant;
    int ep = 1, dp = 1, chunks = 0;
    float capacity_factor = 1.25f;
    std::int64_t batch = 8;
    // Results (the mean of the steps after the first; rank 0's).
    bool out_of_memory = false;
    std::string error;             // the out-of-memory message, or another failure
    double step_ms = 0, tokens_per_s = 0, exposed_comm_pct = 0;
    double peak_gib = 0;           // the largest peak device memory over the ranks
};

struct PlanRequest {
    models::LmConfig model;
    Topology cluster;
    EmuChoice emu;                 // the emulated GPU and routing (emu.cluster: the preset `cluster` came from)
    int steps = 3;                 // per candidate; the first (calibration) is not timed
    PlanSpace space;
};

// Every candidate of the space, in a fixed order (variant-major).
std::vector<PlanCase> plan_cases(const PlanRequest& request);
// Runs one candidate on world = cluster.world_size() emulated GPUs; never throws for a candidate
// that fails (out of memory, a bad shape): its error is recorded.
void run_plan_case(const PlanRequest& request, PlanCase& c);
// Sorted by tokens/s, best first; failed candidates last.
void rank_plan(std::vector<PlanCase>& cases);
// The scmoe-train command that runs `c` on the real cluster (mpirun, one process per GPU).
std::string train_command(const PlanRequest& request, const PlanCase& c);

}  // namespace scmoe::launch
