// The gradient reduction of one MoE layer in data x expert parallel training, for trainers that
// embed MoeLayer (scmoe::models::GradientReducer does the same for the whole language model).
//
// world = dp x ep ranks; each ep-rank group holds one replica of the model, its experts split over
// the group; the ranks with the same ep rank hold the same experts. After every rank's backward:
//   gate_w, shared_w1, shared_w2, cg_w  (GradGroup::kDataParallel)   sum over all world ranks
//   expert_w1, expert_w2              (GradGroup::kExpertReplicas)  sum over the dp ranks holding
//                                                                   the same experts
// (moe_param_specs says which is which). An expert's gradient on a rank already sums what every
// rank of its ep group routed to it, so summing it over the whole world would count it ep times.
// Dividing by the tokens (a mean loss) is left to the caller: scale the loss or the optimizer step.
#pragma once

#include "scmoe/kernels/device.h"
#include "scmoe/moe/config.h"
#include "scmoe/moe/params.h"

namespace scmoe {

class Communicator;

// Sums `grads` (f32, the layer's MoeGrads for one of ep_size expert-parallel ranks) in place:
// kDataParallel tensors over `data_parallel` (every rank of the world), kExpertReplicas tensors over
// `expert_replicas` (the dp ranks with this rank's ep rank). A null communicator, or one of size 1,
// stands for a group of one rank (nothing to sum). Tensors adjacent in memory with the same group
// go in one all-reduce. A collective: every rank calls it, in the same order, with the same config.
// Throws scmoe::Error, before anything is enqueued, on gradients that do not match the config and
// on groups whose sizes do not fit (data_parallel size != ep_size x expert_replicas size).
void all_reduce_moe_grads(const MoeConfig& config, const MoeGrads& grads, int ep_size, Communicator* data_parallel,
                          Communicator* expert_replicas, Stream& stream);

}  // namespace scmoe
