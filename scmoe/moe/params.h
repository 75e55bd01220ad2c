// Parameters and gradients of one MoE layer, as views, plus an owning store for tests, benchmarks
// and trainers that do not bring their own memory.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "scmoe/kernels/device.h"
#include "scmoe/kernels/tensor.h"
#include "scmoe/moe/config.h"

namespace scmoe {

// Shapes (I = expert_inner_width(): 2F for SwiGLU, F for GELU; Is, Fs likewise for the shared expert):
//   gate_w    [H, E]       router
//   expert_w1 [El, H, I]   first expert GEMM of this rank's El = E / ep_size local experts
//   expert_w2 [El, F, H]   second expert GEMM
//   shared_w1 [H, Is]      shared expert (only with shared_expert)
//   shared_w2 [Fs, H]
//   cg_w      [H, 1]       CG-1 coefficient gate (only with coefficient_gate)
// Parameters are in config.dtype; gradients are always f32.
struct MoeParams {
    Tensor gate_w, expert_w1, expert_w2, shared_w1, shared_w2, cg_w;

    static constexpr int kCount = 6;
    Tensor* begin() { return &gate_w; }
    Tensor* end() { return &cg_w + 1; }
    const Tensor* begin() const { return &gate_w; }
    const Tensor* end() const { return &cg_w + 1; }
};
using MoeGrads = MoeParams;

// The group a parameter's gradient is summed over when several ranks train one model, data x
// expert parallel: world = dp x ep ranks, ep-rank groups of ep ranks each holding one replica of
// the model with its experts split over the group (all_reduce_moe_grads, scmoe/moe/grad_reduction.h).
enum class GradGroup {
    kDataParallel,    // replicated on every rank (gate_w, shared_w1/w2, cg_w): summed over all world ranks
    kExpertReplicas,  // this rank's slice of the experts (expert_w1/w2): summed over the dp ranks that
                      // hold the same slice (same ep rank), since the ep group already routed every
                      // token of the replica to its expert
};
const char* grad_group_name(GradGroup g);  // "data-parallel", "expert-replicas"

struct ParamSpec {
    std::string name;                 // "gate_w", ...
    std::vector<std::int64_t> shape;  // empty when the config does not use this parameter
    GradGroup reduce_over = GradGroup::kDataParallel;  // which ranks its gradient is summed over
    std::int64_t numel() const;
};

// The six parameters in MoeParams order for one of ep_size expert-parallel ranks; unused ones have
// an empty shape.
std::vector<ParamSpec> moe_param_specs(const MoeConfig& config, int ep_size = 1);

// Checks every used parameter's shape and dtype and that unused ones are undefined. Throws naming
// the parameter, e.g. "MoeParams.expert_w1: expected [8, 64, 256] f32, got [8, 64, 128] f32".
void check_moe_params(const MoeConfig& config, const MoeParams& params, DType dtype, const char* what,
                      int ep_size = 1);

// One allocation holding all parameters (or gradients) of a layer, in moe_param_specs order.
class MoeParamStore {
public:
    // The standard deviation init() draws with: the LanguageModel's weight init (scmoe/models/lm.h).
    static constexpr float kInitStd = 0.02f;

    // Allocates the store on `device` and zero-fills it there (a stream-ordered memset on a stream
    // of the device, synchronized before the constructor returns), so a fresh store reads zeros.
    MoeParamStore(Device& device, const MoeConfig& config, DType dtype, int ep_size = 1);
    const MoeParams& view() const { return view_; }
    void* data() const { return buffer_.data(); }
    std::int64_t numel() const { return numel_; }
    std::size_t bytes() const { return buffer_.bytes(); }

    // Fills every tensor with independent N(0, kInitStd^2) draws, keyed (KeyedNormal,
    // scmoe/moe/keyed_normal.h) by seed, the parameter's name ("gate_w", ...) and, for expert_w1/w2, the
    // global expert index: the same seed gives the same values on every backend and for every
    // expert-parallel size, ep_rank (in [0, ep_size)) picking this rank's experts [ep_rank * El,
    // (ep_rank + 1) * El). The values are uploaded in the store's dtype (bf16 rounded to nearest
    // even) through `stream`, which is synchronized before the call returns.
    void init(std::uint64_t seed, Stream& stream, int ep_rank = 0);

private:
    DeviceBuffer buffer_;
    MoeParams view_;
    std::int64_t numel_ = 0;
    DType dtype_;
    int ep_size_;
    std::vector<ParamSpec> specs_;
};

}  // namespace scmoe
