// What the single-rank and the expert-parallel layer benchmarks share: the flags, the config and
// parameter set-up, and one forward+backward split into stages with events between them.
#pragma once

#include <cstdint>
#include <cxxopts.hpp>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "scmoe/comm/emulated_link.h"
#include "common.h"
#include "scmoe/kernels/device.h"
#include "scmoe/moe/config.h"
#include "scmoe/moe/moe_layer.h"
#include "scmoe/moe/params.h"

namespace scmoe::bench {

struct LayerBenchArgs {
    std::vector<std::int64_t> tokens;  // per rank
    std::int64_t hidden = 0, ffn = 0, shared_ffn = 0;
    int experts = 0, top_k = 0;
    std::vector<DispatchMode> dispatch;
    float capacity_factor = 1.25f;
    Activation activation = Activation::kSwiGLU;
    bool shared_expert = false, cg = false, check_finite = true;
    bool provider_given = false;  // else the layer's default: SCMOE_GROUPED_GEMM_PROVIDER or auto
    GroupedGemmProvider provider = GroupedGemmProvider::kAuto;
    std::string provider_name;
    std::uint64_t seed = 0;
    int ep = 1;                     // expert-parallel ranks (the world size under mpirun)
    bool mpi = false;               // one MpiCommunicator rank per process (under mpirun)
    std::optional<LinkModel> link;  // EmulatedLink around each rank's communicator
};

cxxopts::Options layer_options();
// Throws UsageError on a bad value or combination.
LayerBenchArgs read_layer_args(const cxxopts::ParseResult& result);
// Throws UsageError when the config is invalid.
MoeConfig make_config(const LayerBenchArgs& args, DispatchMode dispatch, DType dtype);
// Every argument, resolved, for the JSON report.
nlohmann::ordered_json layer_args_json(const CommonArgs& common, const LayerBenchArgs& args, DType dtype);

// Fills a parameter set (all E experts, or one ep rank's share): uniform in [-1, 1) / sqrt(fan_in),
// fan_in = the second-to-last dimension ([.., in, out] weights), one seed per parameter.
void init_params(Device& device, Stream& stream, const MoeConfig& config, const MoeParams& params, std::uint64_t seed);

// Elements of esize bytes that differ bitwise between a and b (same size).
std::int64_t count_bit_mismatches(const std::vector<std::uint8_t>& a, const std::vector<std::uint8_t>& b,
                                  std::size_t esize);

// Where the layer's grouped GEMM provider came from, for the config line.
std::string provider_source(const LayerBenchArgs& args);
std::string fixed(double value, int precision);

// The stages of one forward+backward in table-column order. LayerPass::run gives the execution
// order, which is MoeLayer's (the shared expert's backward runs before permute_backward).
enum Stage {
    kRoute,
    kPermute,
    kDispatch,
    kExperts,
    kCollect,
    kCombine,
    kShared,
    kCombineBwd,
    kCollectBwd,
    kExpertsBwd,
    kDispatchBwd,
    kPermuteBwd,
    kRouteBwd,
    kSharedBwd,
    kNumStages
};
extern const char* const kStageKey[kNumStages];     // JSON keys: "route_us", ...
extern const char* const kStageHeader[kNumStages];  // table headers: "route", ...
// The all-to-all stages: dispatch and collect and their backward mirrors.
inline bool is_a2a_stage(int stage) {
    return stage == kDispatch || stage == kCollect || stage == kCollectBwd || stage == kDispatchBwd;
}

// What one forward+backward does, stage by stage, as MoeLayer::forward/backward do it.
struct LayerPass {
    MoeLayer& layer;
    const MoeParams& params;
    const MoeGrads& grads;
    Tensor x, y, grad_y, grad_x;
    bool shared;
    bool exchange;  // the layer is expert-parallel: dispatch/collect stages (no-ops on one rank)

    // Calls `mark(stage)` before each stage and `mark(kNumStages)` after the last.
    template <class Mark>
    void run(Stream& s, Mark&& mark) {
        mark(kRoute);
        layer.route(x, params, s);
        mark(kPermute);
        layer.permute(s);
        if (exchange) {
            mark(kDispatch);
            layer.dispatch(s);
        }
        mark(kExperts);
        layer.experts(params, s);
        if (exchange) {
            mark(kCollect);
            layer.collect(s);
        }
        mark(kCombine);
        layer.combine(y, s);
        if (shared) {
            mark(kShared);
            layer.shared_expert(x, params, y, s);
        }
        mark(kCombineBwd);
        layer.combine_backward(grad_y, s);
        if (exchange) {
            mark(kCollectBwd);
            layer.collect_backward(s);
        }
        mark(kExpertsBwd);
        layer.experts_backward(params, grads, s);
        if (exchange) {
            mark(kDispatchBwd);
            layer.dispatch_backward(s);
        }
        if (shared) {
            mark(kSharedBwd);
            layer.shared_expert_backward(grad_y, params, grads, grad_x, false, s);
        }
        mark(kPermuteBwd);
        layer.permute_backward(grad_x, shared, s);  // adds to the shared expert's part when there is one
        mark(kRouteBwd);
        layer.route_backward(params, grads, grad_x, s);
        mark(kNumStages);
    }
};

// Mean time of each stage (us, indexed by Stage; 0 for stages that did not run) over `iters`
// passes; events are recorded between the stages and read only after the last pass, so the loop
// never waits on the host.
std::vector<double> stage_times_us(Device& device, Stream& stream, LayerPass& pass, int iters);

// The FLOPs of the routed experts' GEMMs in one forward of a single-rank layer (2 per multiply-add):
// capacity mode computes capacity rows per expert, dropless the rows routed; the backward does twice
// this (data and weight gradients). With the stage times they give the TFLOP/s the layer's grouped
// GEMMs reach, which launch/make_profile.py turns into an emulated device's GEMM rate.
double expert_forward_flops(const MoeConfig& config, const MoeStats& stats);
// The same for the dense shared expert on `tokens` rows (0 without one).
double shared_forward_flops(const MoeConfig& config, std::int64_t tokens);

// The expert-parallel benchmark (layer_ep_bench.cpp): args.ep in-process ranks, or one rank per
// process under mpirun (args.mpi). CPU backend only.
int run_layer_ep_bench(CommonArgs common, const LayerBenchArgs& args, const std::string& command);

}  // namespace scmoe::bench
