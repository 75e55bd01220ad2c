// Helpers for the LM and trainer tests: small model shapes that run in well under a second per
// step on the CPU, and in-process ranks (threads with the trainer's communicator groups).
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "kernels/error.h"
#include "launch/train_comms.h"
#include "models/lm_config.h"
#include "models/trainer.h"

namespace scmoe::testing {

// 2 blocks (a [dense, MoE] pair), hidden 16, seq 8, 4 experts.
inline models::LmConfig small_lm(const std::string& variant = "scmoe-pos2") {
    models::LmConfig c;
    c.layers = 2;
    c.variant = variant;
    c.backbone.hidden = 16;
    c.backbone.heads = 2;
    c.backbone.seq_len = 8;
    c.backbone.ffn = 32;
    c.backbone.activation = Activation::kGeLU;
    c.moe.num_experts = 4;
    c.moe.ffn = 16;
    c.moe.activation = Activation::kGeLU;
    return c;
}

inline models::TrainConfig small_training(std::int64_t steps) {
    models::TrainConfig t;
    t.model = small_lm();
    t.model.layers = 4;
    t.model.backbone.hidden = 32;
    t.model.backbone.heads = 4;
    t.model.backbone.seq_len = 16;
    t.batch = 4;
    t.steps = steps;
    t.adamw.schedule.peak_lr = 3e-3f;
    t.adamw.schedule.min_lr = 3e-4f;
    t.adamw.schedule.warmup_steps = 2;
    t.seed = 7;
    return t;
}

// Runs fn(rank, comms) on `world` threads with the trainer's groups for expert-parallel size ep
// (launch::run_local_ranks: the first rank's error is rethrown as "rank r: ...").
inline void run_train_ranks(int world, int ep, const std::function<void(int, const models::TrainComms&)>& fn) {
    launch::LocalTrainGroups groups(world, ep, std::nullopt);
    launch::run_local_ranks(groups, world, [&](int rank, const launch::RankComms& comms) { fn(rank, comms.comms()); });
}

}  // namespace scmoe::testing
