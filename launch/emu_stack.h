// The stack an emulated run is for (--stack scmoe|paper|paper-swin|FILE.json of scmoe-train, scmoe-bench and
// scmoe-plan; scmoe/kernels/emu/stack.h): a built-in name or a stack JSON, read strictly.
//
// A stack JSON: {"base": "scmoe"|"paper"|"paper-swin" (optional; default scmoe), "name": string,
// "description": string, "attention": "fused"|"unfused", "attention_dropout": bool, "attention_bias":
// bool, "attention_softmax_f32": bool, "attention_scale_scores": bool, "attention_mask_add": bool,
// "attention_softmax_cast_in": bool, "norm_f32": bool, "framework_us": number,
// "all_to_all_efficiency": number, "tutel_dispatch": bool, "activation_f32": bool, "expert_activation":
// bool, "loss_f32": bool, "fairseq_optimizer": bool, "small_gemm": [[size, fraction], ...],
// "grad_reduce": "overlapped"|"after_backward", "grad_reduce_dtype": "f32"|"bf16", "sources": [string, ...]};
// every field optional, overriding the base's. An unknown key, a wrong type or a value out of range
// throws scmoe::Error naming the field.
#pragma once

#include <string>

#include "scmoe/comm/topology.h"
#include "scmoe/kernels/emu/stack.h"
#include "scmoe/models/trainer.h"

namespace scmoe::launch {

emu::Stack load_stack(const std::string& name_or_file);
// The stack's gradient all-reduce (emu::Stack::grad_reduce, grad_reduce_dtype) into a training
// config: what an emulated run of scmoe-train (unless its flags say otherwise) and scmoe-plan use.
void apply_grad_reduce(const emu::Stack& stack, models::TrainConfig& config);
// The cluster (a preset, or one with its overrides applied) with the stack's all-to-all factor
// (Topology::all_to_all_efficiency).
Topology stack_topology(Topology cluster, const emu::Stack& stack);
Topology stack_topology(const std::string& cluster, const emu::Stack& stack);
// The topology an emulated run uses: the cluster with the all-to-all factor of the stack that
// name_or_file names (load_stack; throws as it does).
Topology emulated_topology(Topology cluster, const std::string& stack_name_or_file);

}  // namespace scmoe::launch
