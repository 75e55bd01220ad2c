// MoeLayer: one mixture-of-experts layer on one rank, forward and backward, split into the stages
// the layer scheduler interleaves with backbone compute.
//
//   y = sum_j G(s)_j * E_j(s)                     routed experts on the shortcut s (s = x when absent)
//     + [sigmoid(w_cg . x) *] SE(x)               shared expert on x (optional, CG-1 optional)
//
// Forward stages, in order:  route(s) -> permute() -> experts() -> combine(y) ; shared_expert(x, y)
// Backward stages, in order: combine_backward(dy) -> experts_backward() -> permute_backward()
//                            -> route_backward() ; shared_expert_backward(dy)
// Every stage is stream-ordered on the stream passed last; stages of one pass may run on
// different streams if the caller orders them with events. The layer keeps the activations
// backward needs in its workspace and keeps pointers to x and s: they must stay valid and
// unchanged until backward has been enqueued. One forward/backward in flight per layer object.
//
// Memory: the workspace is sized once for max_tokens (workspace_bytes) and allocated at
// construction (or supplied by the caller); forward and backward allocate nothing.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/device.h"
#include "kernels/grouped_gemm.h"
#include "kernels/tensor.h"
#include "moe/config.h"
#include "moe/params.h"

namespace scmoe {

struct MoeStats {
    std::int64_t tokens = 0;
    std::int64_t capacity = 0;                // rows per expert in capacity mode, 0 dropless
    std::int64_t dropped_tokens = 0;          // token-to-expert assignments dropped for capacity
    float aux_loss = 0.0f;                    // load-balancing loss (before aux_loss_coef)
    float z_loss = 0.0f;                      // router z-loss (before z_loss_coef)
    std::vector<std::int32_t> expert_counts;  // assignments routed to each expert, before capacity
};

// Where every assignment of the last forward went (host copies), for inspection and tests.
struct MoeRouting {
    std::vector<std::int32_t> expert_index;    // [tokens * top_k]
    std::vector<float> gate_weight;            // [tokens * top_k]
    std::vector<std::int32_t> slot_of_choice;  // [tokens * top_k] row in the permuted buffer, -1 dropped
    std::vector<std::int32_t> group_offsets;   // [experts + 1]
};

class MoeLayer {
public:
    // Allocates the workspace on `device` once.
    MoeLayer(const MoeConfig& config, Device& device, std::int64_t max_tokens);
    // Uses caller-provided device memory of at least workspace_bytes(config, max_tokens) bytes.
    MoeLayer(const MoeConfig& config, Device& device, std::int64_t max_tokens, void* workspace, std::size_t bytes);
    ~MoeLayer();
    MoeLayer(const MoeLayer&) = delete;
    MoeLayer& operator=(const MoeLayer&) = delete;

    static std::size_t workspace_bytes(const MoeConfig& config, std::int64_t max_tokens);

    const MoeConfig& config() const { return config_; }
    std::int64_t max_tokens() const { return max_tokens_; }
    // Default: kAuto, or the provider named by the environment variable SCMOE_GROUPED_GEMM_PROVIDER.
    void set_grouped_gemm_provider(GroupedGemmProvider p) { provider_ = p; }
    GroupedGemmProvider grouped_gemm_provider() const { return provider_; }
    // Training mode adds gate noise (noise_std > 0); eval mode does not. Default: training.
    void set_training(bool training) { training_ = training; }

    // ---- forward ----
    // x, shortcut, y: [tokens, hidden] in config.dtype; shortcut may be an undefined Tensor (= x).
    void forward(const Tensor& x, const Tensor& shortcut, const MoeParams& params, Tensor y, Stream& stream);

    void route(const Tensor& shortcut, const MoeParams& params, Stream& stream);  // gate GEMM, router, layout
    void permute(Stream& stream);                                                 // gather into expert order
    void experts(const MoeParams& params, Stream& stream);                        // grouped expert FFN
    void combine(Tensor y, Stream& stream);                                       // y = weighted sum (overwrites)
    void shared_expert(const Tensor& x, const MoeParams& params, Tensor y, Stream& stream);  // y += [c*] SE(x)

    // ---- backward ----
    // grad_y: [tokens, hidden]. Gradients are written (not accumulated) into grads (f32) and grad_x.
    // With a separate shortcut, its gradient goes to grad_shortcut (defined) and grad_x gets only
    // the shared-expert part (zeros without one); with no shortcut, grad_shortcut must be undefined.
    void backward(const Tensor& grad_y, const MoeParams& params, const MoeGrads& grads, Tensor grad_x,
                  Tensor grad_shortcut, Stream& stream);

    void combine_backward(const Tensor& grad_y, Stream& stream);
    void experts_backward(const MoeParams& params, const MoeGrads& grads, Stream& stream);
    // grad_s (+)= routed-path gradient (accumulate = add into existing contents).
    void permute_backward(Tensor grad_s, bool accumulate, Stream& stream);
    // grad_s += router-path gradient; grads.gate_w written.
    void route_backward(const MoeParams& params, const MoeGrads& grads, Tensor grad_s, Stream& stream);
    // grad_x (+)= shared-expert-path gradient; shared and CG-1 weight grads written.
    void shared_expert_backward(const Tensor& grad_y, const MoeParams& params, const MoeGrads& grads, Tensor grad_x,
                                bool accumulate, Stream& stream);

    // Copies routing statistics of the last forward to the host; synchronizes `stream`.
    MoeStats stats(Stream& stream);
    // Copies the routing of the last forward to the host; synchronizes `stream`.
    MoeRouting routing(Stream& stream);

private:
    struct Buffers;
    void carve(void* base);
    void check_finite(const Tensor& t, int slot, const char* what, Stream& stream);
    std::int64_t rows() const;

    MoeConfig config_;
    Device& device_;
    std::int64_t max_tokens_;
    std::unique_ptr<Buffers> buf_;
    DeviceBuffer owned_workspace_;
    void* host_scratch_ = nullptr;  // pinned: non-finite counts and stats
    GroupedGemmProvider provider_ = GroupedGemmProvider::kAuto;
    bool training_ = true;

    // State of the pass in flight.
    std::int64_t tokens_ = 0;
    std::int64_t capacity_ = 0;
    Tensor x_, shortcut_;
};

}  // namespace scmoe
