// Helpers for the LM and trainer tests: small model shapes that run in well under a second per
// step on the CPU, and in-process ranks (threads with the trainer's communicator groups).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "scmoe/kernels/error.h"
#include "launch/train_comms.h"
#include "scmoe/models/lm_config.h"
#include "scmoe/models/trainer.h"

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

// The decoding tests' model: 4 blocks, hidden 32, 4 heads (kv_heads K/V heads; 0 = heads), seq 32,
// 4 experts of ffn 24, GELU. Dropless by default: the full forward it is compared with drops
// nothing either.
inline models::LmConfig decode_lm(const std::string& variant, std::int64_t kv_heads = 0,
                                  DispatchMode dispatch = DispatchMode::kDropless) {
    models::LmConfig c;
    c.layers = 4;
    c.variant = variant;
    c.backbone.hidden = 32;
    c.backbone.heads = 4;
    c.backbone.kv_heads = kv_heads;
    c.backbone.seq_len = 32;
    c.backbone.ffn = 48;
    c.backbone.activation = Activation::kGeLU;
    c.moe.num_experts = 4;
    c.moe.ffn = 24;
    c.moe.activation = Activation::kGeLU;
    c.moe.dispatch = dispatch;
    return c;
}

// n byte tokens, uniform, from `seed`.
inline std::vector<std::int32_t> random_tokens(std::int64_t n, std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<std::int32_t> v(static_cast<std::size_t>(n));
    for (auto& t : v) t = static_cast<std::int32_t>(rng() % 256);
    return v;
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

// A new empty folder in the temp directory, unique to this process.
inline std::filesystem::path fresh_dir(const std::string& name) {
    namespace fs = std::filesystem;
    const fs::path p = fs::temp_directory_path() / ("scmoe_trainer_test_" + name + "_" + std::to_string(getpid()));
    fs::remove_all(p);
    fs::create_directories(p);
    return p;
}

// Every parameter of the rank (f32 on the CPU backend), group after group.
inline std::vector<float> all_params(models::Trainer& t) {
    std::vector<float> out;
    t.model().blocks().synchronize();
    for (const models::ParamGroup& g : t.model().param_groups()) {
        const auto* p = static_cast<const float*>(g.params);
        out.insert(out.end(), p, p + g.numel);
    }
    return out;
}

// Per rank: the losses of each step and the final parameters.
struct RankRun {
    std::vector<double> losses;
    std::vector<float> params;
};

// `b` continues `a` from step `first` on (0: both are whole runs): on every rank the same losses from
// that step on and bitwise the same final parameters.
inline void expect_bitwise_same_runs(const std::vector<RankRun>& a, const std::vector<RankRun>& b, std::size_t first = 0) {
    ASSERT_EQ(a.size(), b.size());
    for (std::size_t r = 0; r < a.size(); ++r) {
        ASSERT_EQ(b[r].losses.size() + first, a[r].losses.size()) << "rank " << r;
        for (std::size_t s = first; s < a[r].losses.size(); ++s)
            EXPECT_EQ(a[r].losses[s], b[r].losses[s - first]) << "rank " << r << " step " << s + 1;
        ASSERT_EQ(a[r].params.size(), b[r].params.size()) << "rank " << r;
        EXPECT_EQ(0, std::memcmp(a[r].params.data(), b[r].params.data(), a[r].params.size() * sizeof(float)))
            << "rank " << r;
    }
}

// A parameter group's values with enough spread that a model's logits depend visibly on every
// input (init_params' small weights give near-uniform logits): uniform in [-0.35, 0.35], drawn per
// tensor (and per expert, by its global index, so every rank draws the same values for an expert).
inline std::vector<float> spread_values(const models::ParamGroup& g, std::uint64_t seed) {
    std::vector<float> host(static_cast<std::size_t>(g.numel));
    for (const models::NamedTensor& t : g.tensors) {
        const std::int64_t parts = t.expert ? t.shape[0] : 1, per = t.numel() / parts;
        for (std::int64_t e = 0; e < parts; ++e) {
            std::mt19937_64 rng(seed * 7919 + std::hash<std::string>{}(t.name) +
                                static_cast<std::uint64_t>(t.expert ? t.first_expert + e : 0));
            std::uniform_real_distribution<float> u(-0.35f, 0.35f);
            for (std::int64_t i = 0; i < per; ++i) host[static_cast<std::size_t>(t.offset + e * per + i)] = u(rng);
        }
    }
    return host;
}

}  // namespace scmoe::testing
