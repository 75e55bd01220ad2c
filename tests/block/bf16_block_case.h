// The cases of the GPU block test (tests/gpu/gpu_block_test.cpp: the bf16 CUDA stack against the
// CPU f32 stack) and the setup that makes its CPU reference well-conditioned, shared with the CPU
// test that proves it is (tests/block/block_bf16_conditioning_test.cpp).
//
// Why a setup: bf16 rounds every stored value, so the GPU's router logits differ from the CPU's by
// rounding noise. With random parameters, some token of the ~100 routing decisions a stack makes
// has its top-k choices within that noise of a tie (the GPU run of 2026-11-27 flipped one in
// every-block-pos1-gqa; on the CPU, parameter changes of bf16's half-ulp moved that case's output
// by 28%), and a token sent to another expert moves a whole row and its expert's gradients far
// past any bf16 tolerance. decisive_routing() gives every token a routing preference that no
// rounding can reorder, so the comparison measures the arithmetic, and routing is compared exactly:
//   - the input's first E features carry, per token, a random order of the experts with values
//     a, a/2, a/4, ..., 0 (each at least twice the next, so the norm weights' +-20% cannot swap two);
//   - no sublayer writes those features (their columns of every output projection are zero: the
//     attention's wo, the FFN's and the experts' w2), so every block's residual still holds them;
//   - every router reads mainly them (gate_w is the identity on them, its other rows scaled down);
//   - the experts' weights are scaled to about 1/sqrt(fan in), as the backbone's, so the MoE
//     branches do not swamp the rest of the residual stream.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "block_test_util.h"
#include "test_util.h"

namespace scmoe::testing {

// Tokens and hidden size of every case; a variant name ending in "-gqa" runs that variant with
// grouped-query attention (4 heads on 2 K/V heads, as the llama2-moe preset's 16 on 4). Every case
// has SwiGLU (BackboneShape's and MoeConfig's default) and dropless dispatch.
constexpr std::int64_t kBf16CaseTokens = 32, kBf16CaseHidden = 64;
inline const std::vector<std::string>& bf16_block_cases() {
    static const std::vector<std::string> cases{
        "top2", "scmoe-pos2",       "scmoe-pos3",         "every-block-pos1",
        "top3", "every-block-top2", "every-block-shared", "every-block-pos1-gqa"};
    return cases;
}

// The GPU test's tolerances (relative L2 over a whole tensor): many bf16 roundings in a row.
constexpr double kBf16OutputTol = 5e-2, kBf16GradTol = 1e-1;

inline BlockStackConfig bf16_case_config(std::string variant, DType dtype) {
    const std::string gqa_suffix = "-gqa";
    const bool gqa = variant.size() > gqa_suffix.size() && variant.ends_with(gqa_suffix);
    if (gqa) variant.resize(variant.size() - gqa_suffix.size());
    BackboneShape s;
    s.hidden = kBf16CaseHidden;
    s.heads = 4;
    s.kv_heads = gqa ? 2 : 0;
    s.seq_len = 16;
    s.ffn = 96;
    s.dtype = dtype;
    MoeConfig m = small_moe(DispatchMode::kDropless);
    m.hidden = kBf16CaseHidden;
    m.ffn = 96;
    m.dtype = dtype;
    return block_variant(variant, s, m, true, 3);
}

// Rounds every parameter of a CPU stack to bf16 in place; returns them, one flat vector per store
// (the backbone's, then each MoE layer's).
inline std::vector<std::vector<float>> round_params_bf16(BlockStack& cpu) {
    std::vector<std::vector<float>> out;
    auto take = [&](void* data, std::int64_t n) {
        auto* p = static_cast<float*>(data);
        std::vector<float> v = round_bf16(std::vector<float>(p, p + n));
        std::copy(v.begin(), v.end(), p);
        out.push_back(std::move(v));
    };
    take(cpu.backbone_params().data(), cpu.backbone_params().numel());
    for (const auto& m : cpu.moe_params()) take(m->data(), m->numel());
    return out;
}

// The setup described at the top, on a CPU f32 stack after init_params and on its input x
// [tokens, hidden] (changed in place).
inline void decisive_routing(BlockStack& stack, std::vector<float>& x) {
    const std::int64_t H = stack.config().backbone.hidden, E = stack.config().moe.num_experts;
    const std::int64_t T = static_cast<std::int64_t>(x.size()) / H;
    auto zero_routing_columns = [&](float* w, std::int64_t numel) {  // w [rows, H]
        for (std::int64_t r = 0; r < numel / H; ++r)
            for (std::int64_t e = 0; e < E; ++e) w[r * H + e] = 0.0f;
    };
    const ParamSet& bp = stack.backbone_params();
    for (std::size_t i = 0; i < bp.specs().size(); ++i) {
        const ParamSpec& s = bp.specs()[i];
        if (s.name.ends_with(".wo") || s.name.ends_with(".w2"))
            zero_routing_columns(static_cast<float*>(bp[i].data), s.numel());
    }
    const float expert_scale = 0.25f;  // init_params' +-0.5 to +-0.125 = 1/sqrt(hidden)
    for (const auto& store : stack.moe_params()) {
        auto* p = static_cast<float*>(store->data());
        std::int64_t offset = 0;
        for (const ParamSpec& s : moe_param_specs(stack.config().moe)) {
            float* w = p + offset;
            offset += s.numel();
            if (s.numel() == 0) continue;
            if (s.name == "gate_w") {  // [H, E]
                for (std::int64_t h = 0; h < H; ++h)
                    for (std::int64_t e = 0; e < E; ++e)
                        w[h * E + e] = h < E ? (h == e ? 1.0f : 0.0f) : 0.05f * w[h * E + e];
                continue;
            }
            for (std::int64_t j = 0; j < s.numel(); ++j) w[j] *= expert_scale;
            if (s.name == "expert_w2" || s.name == "shared_w2") zero_routing_columns(w, s.numel());
        }
    }
    std::mt19937 rng(99);
    std::vector<std::int64_t> order(static_cast<std::size_t>(E));
    for (std::int64_t t = 0; t < T; ++t) {
        std::iota(order.begin(), order.end(), 0);
        std::shuffle(order.begin(), order.end(), rng);
        for (std::int64_t j = 0; j < E; ++j)
            x[static_cast<std::size_t>(t * H + order[static_cast<std::size_t>(j)])] =
                j == E - 1 ? 0.0f : std::ldexp(1.0f, static_cast<int>(E - 2 - j));
    }
}

// The CPU f32 reference of a case: parameters from init_params(seed 5) and decisive_routing,
// rounded to bf16, as are the input and the output gradient.
struct Bf16Case {
    BlockStack stack;
    std::vector<std::vector<float>> params;  // the bf16-valued parameters, per store
    std::vector<float> x, gy;
    Bf16Case(const std::string& variant, Device& cpu)
        : stack(bf16_case_config(variant, DType::kF32), cpu, kBf16CaseTokens) {
        init_params(stack, 5);
        x = make_input(kBf16CaseTokens, kBf16CaseHidden, 1);
        decisive_routing(stack, x);
        params = round_params_bf16(stack);
        x = round_bf16(x);
        gy = round_bf16(make_input(kBf16CaseTokens, kBf16CaseHidden, 2));
    }
};

// Each MoE layer's expert choices of the last forward, [tokens * top_k] per layer.
inline std::vector<std::vector<std::int32_t>> expert_choices(BlockStack& stack) {
    std::vector<std::vector<std::int32_t>> out;
    for (MoeLayer* layer : stack.moe_layers()) out.push_back(layer->routing(stack.stream()).expert_index);
    return out;
}

// "" when both runs chose the same experts for every token of every MoE layer, else the first
// difference.
inline std::string routing_diff(const std::vector<std::vector<std::int32_t>>& got,
                                const std::vector<std::vector<std::int32_t>>& want, int top_k) {
    if (got.size() != want.size()) return "different numbers of MoE layers";
    for (std::size_t l = 0; l < got.size(); ++l) {
        if (got[l].size() != want[l].size()) return "MoE layer " + std::to_string(l) + ": different token counts";
        for (std::size_t i = 0; i < got[l].size(); ++i)
            if (got[l][i] != want[l][i])
                return "MoE layer " + std::to_string(l) + ", token " + std::to_string(i / top_k) + ", choice " +
                       std::to_string(i % top_k) + ": expert " + std::to_string(got[l][i]) + " vs " +
                       std::to_string(want[l][i]);
    }
    return "";
}

}  // namespace scmoe::testing
