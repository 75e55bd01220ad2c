// The language model's shape: a decoder-only transformer over byte tokens whose blocks come from
// moe/ (BlockStack), with presets and a JSON form that checkpoints store and compare.
//
//   tokens -> token embedding + learned positions -> blocks -> RMSNorm -> tied LM head -> softmax CE
//
// The blocks follow a block_variant() name: the paper's pair variants ("top2", "scmoe-pos2", ...)
// tile their [dense, MoE] pair over `layers` (an MoE in every 2nd block), the every-block layouts
// ("every-block-pos1", "every-block-top2", "every-block-shared") put an MoE in every block.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "scmoe/moe/backbone.h"
#include "scmoe/moe/block_stack.h"
#include "scmoe/moe/config.h"

namespace scmoe::models {

struct LmConfig {
    std::int64_t vocab = 256;            // byte tokens
    std::int64_t layers = 4;             // transformer blocks, 1 .. 65,536; even for the pair variants
    std::string variant = "scmoe-pos2";  // a block_variant() name
    bool coefficient_gate = true;        // CG-1 on the shared expert (false: direct add)
    BackboneShape backbone;              // hidden, heads, seq_len, dense ffn, activation, dtype
    MoeConfig moe;                       // experts, expert ffn, dispatch, capacity, aux/z-loss weights;
                                         // top_k / shared_expert come from the variant

    // Throws scmoe::Error naming the field.
    void validate() const;
    // The blocks' configuration (validated).
    BlockStackConfig block_stack() const;
    // Every field, as a JSON object text (stable key order); from_json() reads it back exactly.
    std::string to_json() const;
    static LmConfig from_json(const std::string& text);
    // One line for logs: "variant=scmoe-pos2 layers=4 hidden=128 ...".
    std::string describe() const;
};

// "tiny": 4 layers, hidden 128, 4 heads, seq 64, ffn 256, 8 experts of ffn 256 (minutes on 2 CPU cores).
// "gpt2-moe-small": 12 layers, hidden 768, 12 heads, seq 1024, ffn 3072, 8 experts of ffn 3072 (the paper's).
// "gpt2-moe-medium": 24 layers, hidden 1024, 16 heads, seq 2048, ffn 4096, 8 experts of ffn 4096 (the paper's;
//     its Table 8 says 16 experts: --experts 16).
// "gpt3-moe-xl": 24 layers, hidden 2048, 32 heads, seq 2048, ffn 8192, 8 experts of ffn 8192, GELU,
//     vocab 50257, capacity factor 2.0 (the paper's Table 8 / Table 4 model).
// "llama2-moe": 24 layers, hidden 2048, 16 heads with 4 KV heads (GQA), seq 2048, SwiGLU of width 5632
//     (an assumption: LLaMA's rule), 8 experts in every block (every-block-pos1), vocab 32000, capacity 2.0.
// Sources and derivations: lm_config.cpp. The dtype is left f32; the trainer sets the backend's
// compute dtype. The GPT presets use GELU, llama2-moe SwiGLU (backbone and experts).
LmConfig lm_preset(const std::string& name);
std::vector<std::string> lm_preset_names();

}  // namespace scmoe::models
