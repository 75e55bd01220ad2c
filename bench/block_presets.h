// scmoe-bench block --preset: named block shapes from the ScMoE paper's measurements, so a block
// comparison runs the shape the paper measured (docs/scmoe-paper-setup.md, Sec. 2.2). A flag given on
// the command line overrides the preset's value of it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "scmoe/kernels/activation.h"

namespace scmoe::bench {

struct BlockPreset {
    std::string name;
    std::int64_t hidden = 0, ffn = 0, heads = 0, kv_heads = 0, seq = 0;
    Activation activation = Activation::kGeLU;
    float capacity_factor = 0;
    int experts = 0;            // on one node (ranks <= 8)
    int experts_two_nodes = 0;  // with more than 8 ranks (the paper's 2 x 8 GPUs: one expert per GPU)
    std::int64_t tokens_per_rank = 0;
    bool causal = true;              // false: bidirectional attention (--bidirectional)
    std::vector<std::string> notes;  // the assumptions and omissions, printed with the report
};

// "swinv2-moe-s-stage1" .. "swinv2-moe-s-stage4" (SwinV2-MoE-S stage by stage; stage 3 the paper's
// Fig. 1/8 block); throws scmoe::Error naming the known presets otherwise.
const BlockPreset& block_preset(const std::string& name);
std::vector<std::string> block_preset_names();
// The preset's expert count for `ranks` in-process ranks.
int block_preset_experts(const BlockPreset& preset, int ranks);

}  // namespace scmoe::bench
