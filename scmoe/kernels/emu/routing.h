// The emulated router: expert choices drawn from a seeded synthetic distribution instead of
// computed from logits (an emulated GPU computes no payload). The choices are real data: layout,
// counts and regroup run on them for real, so all-to-all sizes, capacity drops and grouped-GEMM row
// counts are those the real layer would produce under that load.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace scmoe::emu {

struct RoutingModel {
    enum class Kind { kBalanced, kZipf, kCounts };
    Kind kind = Kind::kBalanced;  // kBalanced: every expert equally likely
    double zipf_s = 1.0;          // kZipf: P(expert e) ~ 1 / (e + 1)^s
    std::vector<double> counts;   // kCounts: relative load per expert (e.g. recorded from a real run)
    std::uint64_t seed = 0;
};
// Parses "balanced", "zipf:S" (e.g. zipf:1.2) or "counts:c0,c1,..."; throws Error otherwise.
RoutingModel parse_routing_model(const std::string& text);
std::string describe(const RoutingModel& model);

// Draws top_k distinct experts per token: the first from the model's weights, each next one from
// the weights of the experts not chosen yet (renormalised). With kCounts the weights are the counts
// (cycled when there are more experts than counts). Deterministic in (model.seed, key).
//   expert_index: [tokens, top_k] out; expert_fraction: [experts] out, share of the T*k choices.
void draw_choices(const RoutingModel& model, std::uint64_t key, std::int64_t tokens, int num_experts, int top_k,
                  std::int32_t* expert_index, float* expert_fraction);

}  // namespace scmoe::emu
