// MoeConfig: everything that fixes the shape and behaviour of one MoE layer.
#pragma once

#include <cstdint>
#include <string>

#include "scmoe/kernels/activation.h"
#include "scmoe/kernels/dtype.h"

namespace scmoe {

enum class DispatchMode {
    kCapacity,  // fixed slots per expert (capacity_factor); overflow dropped and counted; no host sync
    kDropless,  // every assignment kept; per-expert row counts vary
};

const char* dispatch_mode_name(DispatchMode m);
DispatchMode parse_dispatch_mode(const std::string& name);  // "capacity" | "dropless"
Activation parse_activation(const std::string& name);       // "swiglu" | "gelu"

struct MoeConfig {
    int version = 1;                  // layout version of this struct
    std::int64_t hidden = 0;          // model width H
    std::int64_t ffn = 0;             // expert FFN width F (SwiGLU experts hold W1 [H, 2F])
    int num_experts = 0;              // E routed experts
    int top_k = 2;                    // experts per token: 1 .. min(num_experts, kMaxTopK = 8)
    float capacity_factor = 1.25f;    // capacity mode: C = ceil(capacity_factor * T * k / E)
    DispatchMode dispatch = DispatchMode::kCapacity;
    Activation activation = Activation::kSwiGLU;
    DType dtype = DType::kF32;        // activations and weights: f32 (CPU) or bf16 (CUDA)
    bool shared_expert = false;       // dense expert on the current representation x
    std::int64_t shared_ffn = 0;      // its FFN width; 0 = ffn
    bool coefficient_gate = false;    // CG-1: the shared expert's output scaled by sigmoid(w_cg . x)
    float noise_std = 0.0f;           // noisy gate: logits += noise_std * N(0, 1) in training; 0 = off
    std::uint64_t noise_seed = 0x5c3e;
    float aux_loss_coef = 0.01f;      // load-balancing loss weight in the total loss
    float z_loss_coef = 0.001f;       // router z-loss weight in the total loss
    bool check_finite = true;         // NaN/Inf inputs: an error at the stream's next synchronize()
    // Dropless expert parallelism: a rank's experts receive at most
    // ceil(recv_limit_factor * max_tokens * top_k) rows per step (the balanced load is
    // max_tokens * top_k), which sizes the expert-side workspace; a step that routes more to one
    // rank fails with an error naming the rank and its experts' counts. 0 = no limit: room for
    // every assignment of every rank (ep * max_tokens * top_k rows). 0 or >= 1.
    float recv_limit_factor = 2.0f;

    // Throws scmoe::Error naming the offending field and its value.
    void validate() const;
    // Width of the experts' first GEMM output (2F for SwiGLU).
    std::int64_t expert_inner_width() const { return activation_input_width(activation, ffn); }
    std::int64_t shared_ffn_width() const { return shared_ffn ? shared_ffn : ffn; }
    // Stable across processes and builds: used to check that all ranks agree.
    std::uint64_t hash() const;
    // "hidden=1024 ffn=4096 experts=8 top_k=2 ..."
    std::string to_string() const;
};

}  // namespace scmoe
