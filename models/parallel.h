// Data x expert parallelism for training: which ranks share what, and the gradient reduction.
//
// world = dp * ep ranks. Ranks [g * ep, (g + 1) * ep) form expert-parallel group g (one replica of
// the model, its experts split over the group); ranks with the same rank % ep hold the same experts
// and form an expert-data-parallel group of dp ranks.
//
// Each rank computes gradients of the mean loss of its own tokens (grad_scale = 1 / its tokens).
// The gradient of the global mean loss is then
//   dense tensors:  (sum over all world ranks) / world
//   expert tensors: (sum over the dp replicas of the expert) / world
// (an expert's gradient on a rank already sums what every rank of its ep group sent it).
#pragma once

#include <string>
#include <vector>

#include "kernels/device.h"
#include "models/lm.h"

namespace scmoe {
class Communicator;
}

namespace scmoe::models {

struct ParallelLayout {
    int world = 1, rank = 0, ep = 1;
    // Throws scmoe::Error unless world > 0, 0 <= rank < world, ep > 0 and world % ep == 0.
    void validate() const;
    int dp() const { return world / ep; }
    int ep_group() const { return rank / ep; }  // which replica
    int ep_rank() const { return rank % ep; }   // which experts
    std::string describe() const;               // "rank 3 of 4: dp 2 x ep 2 (replica 1, experts slice 1)"
};

// The three groups a rank trains with. ep and expert_dp may be null when their size is 1; world may
// be null only when world size is 1. Borrowed: they must outlive their users.
struct TrainComms {
    Communicator* world = nullptr;
    Communicator* ep = nullptr;
    Communicator* expert_dp = nullptr;
};

// Sums the gradients of `model` as above (in place, on the model's stream; the 1/world is left to
// the optimizer's grad_scale) and computes the global gradient norm of the result.
class GradientReducer {
  public:
    GradientReducer(LanguageModel& model, const ParallelLayout& layout, TrainComms comms, Device& device);
    // Enqueues the all-reduces: runs of dense tensors over world, runs of expert tensors over expert_dp.
    void reduce();
    // L2 norm of the reduced (summed, not yet divided) gradients over the whole model, every tensor
    // counted once: dense tensors from this rank, expert tensors summed over the ep group.
    // Synchronizes; the same value on every rank.
    float global_norm();

  private:
    struct Run {
        float* grads;
        std::int64_t count;
        bool expert;
    };
    LanguageModel& model_;
    ParallelLayout layout_;
    TrainComms comms_;
    Device& device_;
    std::vector<Run> runs_;
    DeviceBuffer scratch_;  // sum_of_squares scratch + one f32 for the ep-group sum
};

}  // namespace scmoe::models
