// Private: the buffers an MoeLayer carves out of its workspace. One function lays them out for
// both the sizing pass and the real pass, so the two can never disagree.
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels/layout.h"
#include "kernels/workspace.h"
#include "moe/moe_layer.h"

namespace scmoe {

struct MoeLayer::Buffers {
    // Router and layout.
    float* logits = nullptr;            // [T, E] f32
    float* probs = nullptr;             // [T, E] f32
    float* logsumexp = nullptr;         // [T]
    std::int32_t* expert_index = nullptr;   // [T, k]
    float* gate_weight = nullptr;       // [T, k]
    float* expert_fraction = nullptr;   // [E]
    float* losses = nullptr;            // [2]
    std::int32_t* expert_counts = nullptr;  // [E]
    std::int32_t* group_offsets = nullptr;  // [E + 1]
    std::int32_t* slot_of_choice = nullptr; // [T, k]
    std::int32_t* choice_of_row = nullptr;  // [R]
    std::int32_t* dropped = nullptr;        // [1]
    std::int64_t* nonfinite = nullptr;      // [3 checks x {count, first index}]
    // Routed experts, dtype.
    void* xp = nullptr;    // [R, H]
    void* h = nullptr;     // [R, I]
    void* act = nullptr;   // [R, F]
    void* yp = nullptr;    // [R, H]
    void* grad_yp = nullptr;   // [R, H]
    void* grad_act = nullptr;  // [R, F]
    void* grad_h = nullptr;    // [R, I]
    void* grad_xp = nullptr;   // [R, H]
    float* grad_gate_weight = nullptr;  // [T, k]
    void* grad_logits = nullptr;        // [T, E] dtype
    // Shared expert and CG-1, dtype.
    void* shared_h = nullptr;        // [T, Is]
    void* shared_act = nullptr;      // [T, Fs]
    void* shared_out = nullptr;      // [T, H]
    float* cg_logit = nullptr;       // [T] f32
    void* grad_shared_out = nullptr; // [T, H]
    void* grad_shared_act = nullptr; // [T, Fs]
    void* grad_shared_h = nullptr;   // [T, Is]
    void* grad_cg_logit = nullptr;   // [T] dtype

    static constexpr std::size_t kStatsOffset = 64;  // in host scratch, after the non-finite counts
    static std::size_t host_scratch_bytes(const MoeConfig& c) { return kStatsOffset + 16 + 4 * c.num_experts; }

    // The largest permuted-row count any token count up to max_tokens can need.
    static std::int64_t max_rows(const MoeConfig& c, std::int64_t max_tokens) {
        const std::int64_t cap = c.dispatch == DispatchMode::kCapacity
                                     ? expert_capacity(max_tokens, c.num_experts, c.top_k, c.capacity_factor)
                                     : 0;
        return std::max<std::int64_t>(permuted_rows(max_tokens, c.num_experts, c.top_k, cap), 1);
    }

    void carve(WorkspaceCarver& w, const MoeConfig& c, std::int64_t T) {
        const std::int64_t E = c.num_experts, K = c.top_k, H = c.hidden, F = c.ffn, I = c.expert_inner_width();
        const std::int64_t R = max_rows(c, T);
        const std::size_t ds = dtype_size(c.dtype);
        auto take = [&](std::int64_t n) { return w.take_bytes(static_cast<std::size_t>(n) * ds); };
        logits = w.take<float>(T * E);
        probs = w.take<float>(T * E);
        logsumexp = w.take<float>(T);
        expert_index = w.take<std::int32_t>(T * K);
        gate_weight = w.take<float>(T * K);
        expert_fraction = w.take<float>(E);
        losses = w.take<float>(2);
        expert_counts = w.take<std::int32_t>(E);
        group_offsets = w.take<std::int32_t>(E + 1);
        slot_of_choice = w.take<std::int32_t>(T * K);
        choice_of_row = w.take<std::int32_t>(R);
        dropped = w.take<std::int32_t>(1);
        nonfinite = w.take<std::int64_t>(6);
        xp = take(R * H);
        h = take(R * I);
        act = take(R * F);
        yp = take(R * H);
        grad_yp = take(R * H);
        grad_act = take(R * F);
        grad_h = take(R * I);
        grad_xp = take(R * H);
        grad_gate_weight = w.take<float>(T * K);
        grad_logits = take(T * E);
        if (c.shared_expert) {
            const std::int64_t Fs = c.shared_ffn_width(), Is = activation_input_width(c.activation, Fs);
            shared_h = take(T * Is);
            shared_act = take(T * Fs);
            shared_out = take(T * H);
            grad_shared_out = take(T * H);
            grad_shared_act = take(T * Fs);
            grad_shared_h = take(T * Is);
            if (c.coefficient_gate) {
                cg_logit = w.take<float>(T);
                grad_cg_logit = take(T);
            }
        }
    }
};

}  // namespace scmoe
