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

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "scmoe/kernels/device.h"
#include "scmoe/models/lm.h"

namespace scmoe {
class Communicator;
class Tracer;
}  // namespace scmoe

namespace scmoe::models {

// Every rank's `mine` (up to 4095 bytes), in rank order: an all-gather over `world` (null or one
// rank: just `mine`) through `stream`, which is synchronized. For agreeing on causes and names:
// a rank that failed says why, and every rank can name it.
std::vector<std::string> gather_strings(Communicator* world, const std::string& mine, Device& device, Stream& stream);

// Throws scmoe::Error on every rank unless every rank of `world` holds the same `fields` (name,
// value; at most about 4 KB in all): "<what>: the ranks disagree: rank 2 has seed 99 (rank 0: 7)",
// each differing rank and field named. A collective: every rank of `world` must call it. For
// settings that must match across ranks before any collective depends on them.
void check_same_on_every_rank(Communicator* world, const std::vector<std::pair<std::string, std::string>>& fields,
                              const std::string& what, Device& device, Stream& stream);

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

// Sums the gradients of `model` as above (in place; the 1/world is left to the optimizer's
// grad_scale) and computes the global gradient norm of the result.
//
// The all-reduces are grouped by backward stage (LanguageModel::GradsReadyFn): per stage, runs of
// adjacent tensors of one kind (dense over world, expert over expert_dp). Two ways to issue them,
// with the same calls (buffers, counts, communicators) and so bitwise the same sums:
//   overlapped  pass grads_ready() to forward_backward: each stage's all-reduces start on the
//               reducer's own stream as soon as that stage's gradients are final, while the rest of
//               the backward runs; finish() makes the model's stream wait for them.
//   after       reduce(): every stage's all-reduces on the model's stream once the backward is done.
// Overlapped, the world communicator works on the reducer's stream while the expert-parallel one
// works on the MoE stream: the two must be distinct communicators (they are in TrainComms), and
// under MPI the library must allow calls from several threads (MPI_THREAD_MULTIPLE). On NCCL the two
// communicators' kernels run at once; every rank issues them in the same order (the order of the
// plan), which NCCL requires of concurrent communicators (not yet run on a GPU).
//
// `wire` is the dtype the gradients travel in: kF32 (the default: the f32 gradients as they are) or
// kBF16 (half the bytes, as Megatron's --grad-reduce-in-bf16 and fairseq's --fp16 gradients): each
// run is converted to bf16 in a staging buffer, summed there, and converted back, so each rank's
// gradient and the sum are rounded to bf16. The same calls either way of issuing, so still bitwise
// the same sums overlapped or after.
class GradientReducer {
  public:
    GradientReducer(LanguageModel& model, const ParallelLayout& layout, TrainComms comms, Device& device,
                    DType wire = DType::kF32);
    ~GradientReducer();
    GradientReducer(const GradientReducer&) = delete;
    GradientReducer& operator=(const GradientReducer&) = delete;

    // For LanguageModel::forward_backward (one backward per call): starts each stage's all-reduces
    // on the reducer's stream after the stage's gradients are final. Valid while the reducer lives;
    // trace (optional) shows them on a "grad_reduce" lane.
    LanguageModel::GradsReadyFn grads_ready(Tracer* trace = nullptr);
    // After an overlapped forward_backward: the model's stream waits for every stage's all-reduces.
    // Throws if a stage was not reduced exactly once.
    void finish();
    // The same all-reduces, enqueued on the model's stream after the backward (no overlap); trace
    // (optional) shows them on the "backbone" lane.
    void reduce(Tracer* trace = nullptr);
    // L2 norm of the reduced (summed, not yet divided) gradients over the whole model, every tensor
    // counted once: dense tensors from this rank, expert tensors summed over the ep group.
    // Synchronizes; the same value on every rank.
    float global_norm();

  private:
    struct Run {
        float* grads;
        std::int64_t count;
        bool expert;
        int stage;
        Communicator* comm;  // what it is summed over (expert_dp or world); nullptr: nothing to send
    };
    // Enqueues stage's all-reduces on s, as a traced op on `lane` when there is a trace.
    void reduce_stage(int stage, Stream& s, Tracer* trace, const char* lane);

    LanguageModel& model_;
    ParallelLayout layout_;
    TrainComms comms_;
    Device& device_;
    std::vector<Run> runs_;
    DType wire_;
    DeviceBuffer staging_;  // wire kBF16: the largest sent run in bf16 (runs are summed one at a time)
    DeviceBuffer scratch_;  // sum_of_squares scratch + one f32 per run
    std::unique_ptr<Stream> stream_;
    std::vector<std::unique_ptr<Event>> stage_ready_;
    std::unique_ptr<Event> done_;
    std::vector<int> issued_;  // per stage, since the last finish()
};

}  // namespace scmoe::models
