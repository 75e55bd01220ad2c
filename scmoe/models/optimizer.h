// The optimizer: AdamW with f32 master weights over one flat parameter array (a ParamSet), a
// warmup + cosine learning-rate schedule, and the global gradient norm for clipping.
//
// The training step is:
//   norm  = global_grad_norm({{grads, n}, ...}, device, stream)   // one host sync
//   scale = clip_scale(norm, max_norm)
//   adamw.step(grads, scale, stream)                             // lr from the schedule
// Per-element arithmetic lives in scmoe/kernels/adamw.h (CPU and CUDA give the same bits).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "scmoe/kernels/device.h"
#include "scmoe/kernels/dtype.h"
#include "scmoe/moe/backbone.h"

namespace scmoe::models {

// Learning rate by step: linear warmup from 0 (at step 0) to peak_lr (at step warmup_steps), then a
// half cosine from peak_lr down to min_lr (at step total_steps), then min_lr. Steps are the 1-based
// AdamW step numbers, so the first step taken already has lr(1) = peak_lr / warmup_steps > 0.
// A run shorter than its warmup (total_steps < warmup_steps) ends inside it: the lr rises every step
// and its last step has peak_lr * total_steps / warmup_steps.
struct LrSchedule {
    float peak_lr = 3e-4f;          // finite, >= 0
    float min_lr = 0.0f;            // in [0, peak_lr]
    std::int64_t warmup_steps = 0;  // >= 0; 0: start at peak_lr
    std::int64_t total_steps = 1;   // >= 1

    // Pure function of step (>= 0); throws scmoe::Error for an invalid schedule or a negative step.
    float lr(std::int64_t step) const;
    void validate() const;
};

struct AdamWConfig {
    LrSchedule schedule;
    float beta1 = 0.9f;         // in [0, 1)
    float beta2 = 0.95f;        // in [0, 1)
    float eps = 1e-8f;          // > 0
    float weight_decay = 0.0f;  // decoupled, >= 0
};

// AdamW over `numel` parameters held by the caller in the compute dtype (f32 on CPU, bf16 on CUDA).
// Owns the f32 master weights and the two f32 moments (device memory); after each step the params
// are overwritten with the master rounded to their dtype. Not copyable (owns device memory).
class AdamW {
public:
    // Enqueues on `stream`: master = params widened to f32, m = v = 0. `params` stays borrowed for
    // the optimizer's lifetime ([numel] in param_dtype, f32 or bf16, memory of `device`).
    AdamW(Device& device, void* params, DType param_dtype, std::int64_t numel, const AdamWConfig& config,
          Stream& stream);
    // The same over a ParamSet's flat array (dtype from its tensors; f32 when it has none).
    AdamW(Device& device, const ParamSet& params, const AdamWConfig& config, Stream& stream);

    // Takes step steps_taken() + 1 with lr = config.schedule.lr(that step): master, m and v updated,
    // params rewritten. grads: [numel] f32 memory of the device; grad_scale multiplies them first
    // (clip_scale's result). Returns the lr used. Stream-ordered; no host sync.
    float step(const float* grads, float grad_scale, Stream& stream);

    // Rewrites params from master (after restoring master from a checkpoint).
    void write_params(Stream& stream);

    std::int64_t numel() const { return numel_; }
    const AdamWConfig& config() const { return config_; }
    // Steps taken so far (the bias-correction counter); set it when restoring a checkpoint.
    std::int64_t steps_taken() const { return steps_taken_; }
    void set_steps_taken(std::int64_t steps);

    // The state a checkpoint saves and restores: [numel] f32 each, memory of the device.
    float* master() const { return master_.as<float>(); }
    float* m() const { return m_.as<float>(); }
    float* v() const { return v_.as<float>(); }
    void* params() const { return params_; }
    DType param_dtype() const { return param_dtype_; }

private:
    AdamWConfig config_;
    void* params_ = nullptr;
    DType param_dtype_ = DType::kF32;
    std::int64_t numel_ = 0;
    std::int64_t steps_taken_ = 0;
    DeviceBuffer master_, m_, v_;
};

// The factor gradients are multiplied by so their global L2 norm is at most max_norm:
// min(1, max_norm / global_norm). max_norm <= 0 disables clipping (1). Throws scmoe::Error for a
// negative or non-finite global_norm (an overflowed gradient must not reach the weights).
float clip_scale(float global_norm, float max_norm);

// sqrt(sum over every array of sum_i g[i]^2): each array's sum of squares on the device
// (kernels' sum_of_squares, deterministic), then summed in order in double on the host. Synchronizes
// `stream`. grads: (pointer to [n] f32 memory of the device, n >= 0) pairs.
float global_grad_norm(const std::vector<std::pair<const float*, std::int64_t>>& grads, Device& device,
                       Stream& stream);

}  // namespace scmoe::models
