// What a training configuration needs in memory, estimated from its shapes before anything is
// allocated, so that a configuration far beyond the machine is refused with the numbers
// (scmoe-train: "needs N GiB, this machine has M GiB available") instead of failing deep in the
// trainer with a bare std::bad_alloc, or after filling the memory.
//
// A lower bound: it counts what a step must hold (each parameter, its gradient and AdamW's two
// moments; the activations the backward reads; the token batches) and leaves out workspaces,
// allocator slack and the runtime. Every quantity is a double: shapes from a command line may be
// far beyond 2^64 bytes.
#pragma once

#include <string>

#include "scmoe/models/trainer.h"

namespace scmoe::models {

struct TrainMemoryEstimate {
    double params = 0;            // this rank's parameters (its experts only)
    double param_bytes = 0;       // parameters, gradients and optimizer state (forward only: the parameters)
    double activation_bytes = 0;  // what one step keeps for its backward, at least (forward only: one layer's)
    double batch_bytes = 0;       // a step's input and target tokens on the host (int32 each)
    double total_bytes() const { return param_bytes + activation_bytes + batch_bytes; }
    // "1.2e12 parameters on each rank x 16 B (weights, gradients, AdamW moments) = 17.5 TiB; activations
    // >= 3.1 GiB; token batches 4 KiB"
    std::string describe() const;
};

// For one rank of an expert-parallel group of `ep` ranks (its share of the experts). `training`:
// false for a forward-only run (evaluation). Throws nothing for any shape (validated or not).
TrainMemoryEstimate estimate_train_memory(const TrainConfig& config, int ep, bool training = true);

// `bytes` as "12.0 GiB", "512 MiB", "3.1 TiB".
std::string format_bytes(double bytes);

}  // namespace scmoe::models
