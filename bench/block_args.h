// scmoe-bench block's command line: the variants, ranks, shapes, schedule and emulated-cluster flags,
// parsed and checked (UsageError), and echoed into the JSON report.
#pragma once

#include <cstdint>
#include <cxxopts.hpp>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "scmoe/comm/emulated_link.h"
#include "common.h"
#include "launch/emu_choice.h"
#include "scmoe/comm/topology.h"
#include "scmoe/kernels/activation.h"
#include "scmoe/moe/config.h"
#include "scmoe/moe/layer_scheduler.h"

namespace scmoe::bench {

struct BlockArgs {
    std::vector<std::string> variants;
    int ranks = 1;
    bool mpi = false;
    std::optional<LinkModel> link;
    double comm_share = 0;  // 0 = off
    std::vector<std::int64_t> tokens;  // per rank per step: --tokens, or the -b/-e/-f sweep (one row set each)
    std::int64_t hidden = 0, ffn = 0, heads = 0, kv_heads = 0, seq = 0;  // kv_heads: = heads without GQA
    int experts = 0, blocks = 4;
    bool bidirectional = false;  // --bidirectional: attention without the causal mask (BackboneShape::causal)
    bool train = true;
    bool coefficient_gate = true;
    DispatchMode dispatch = DispatchMode::kCapacity;
    Activation activation = Activation::kSwiGLU;
    float capacity_factor = 1.25f;
    int chunks = 0;  // chunked a2a/expert pipeline: 0 = auto, N = forced
    int comm_sms = -1;  // SMs the backbone leaves free beside an exchange (LayerScheduler): -1 = auto
    IssueOrder issue_order = IssueOrder::kBackboneAhead;  // how the passes issue their ops (review L1)
    std::string trace;
    launch::ClusterFlags cluster_flags;  // emu: --cluster and its overrides (launch/cli_options.h)
    std::string cluster;                 // emu: the resolved cluster's name
    Topology topology;                   // emu: the resolved cluster
    std::vector<std::string> cluster_notes;  // emu: "assumed: ..." lines and how the cluster was chosen
    std::string preset;   // --preset (block_presets.h), empty without
    std::vector<std::string> preset_notes;  // its assumptions and omissions, for the report
};

cxxopts::Options block_options();
BlockArgs read_block_args(const cxxopts::ParseResult& r);
// Emulated runs: the cluster (from --cluster or the GPU), checked against the other flags.
void resolve_emu_cluster(const CommonArgs& common, BlockArgs& a);
nlohmann::ordered_json block_args_json(const CommonArgs& common, const BlockArgs& a);

}  // namespace scmoe::bench
