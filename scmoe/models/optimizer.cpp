#include "scmoe/models/optimizer.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "scmoe/kernels/adamw.h"
#include "scmoe/kernels/elementwise.h"
#include "scmoe/kernels/error.h"

namespace scmoe::models {

void LrSchedule::validate() const {
    SCMOE_CHECK(std::isfinite(peak_lr) && peak_lr >= 0.0f, "LrSchedule: peak_lr must be finite and >= 0, got " << peak_lr);
    SCMOE_CHECK(min_lr >= 0.0f && min_lr <= peak_lr,
                "LrSchedule: min_lr must be in [0, peak_lr=" << peak_lr << "], got " << min_lr);
    SCMOE_CHECK(warmup_steps >= 0, "LrSchedule: warmup_steps must be >= 0, got " << warmup_steps);
    SCMOE_CHECK(total_steps >= 1, "LrSchedule: total_steps must be >= 1, got " << total_steps);
}

float LrSchedule::lr(std::int64_t step) const {
    validate();
    SCMOE_CHECK(step >= 0, "LrSchedule::lr: step must be >= 0, got " << step);
    const double peak = peak_lr, low = min_lr;
    if (step < warmup_steps) return static_cast<float>(peak * static_cast<double>(step) / static_cast<double>(warmup_steps));
    if (step >= total_steps) return min_lr;
    // warmup_steps <= step < total_steps, so the decay span is positive.
    const double progress =
        static_cast<double>(step - warmup_steps) / static_cast<double>(total_steps - warmup_steps);
    return static_cast<float>(low + 0.5 * (peak - low) * (1.0 + std::cos(std::numbers::pi * progress)));
}

namespace {

DeviceBuffer state_buffer(Device& device, std::int64_t numel) {
    return DeviceBuffer(device, std::max<std::size_t>(static_cast<std::size_t>(numel) * sizeof(float), 1));
}

DType param_set_dtype(const ParamSet& params) {
    return params.tensors().empty() ? DType::kF32 : params.tensors().front().dtype;
}

}  // namespace

AdamW::AdamW(Device& device, void* params, DType param_dtype, std::int64_t numel, const AdamWConfig& config,
             Stream& stream)
    : config_(config), params_(params), param_dtype_(param_dtype), numel_(numel) {
    SCMOE_CHECK(numel >= 0, "AdamW: numel must be >= 0, got " << numel);
    SCMOE_CHECK(numel == 0 || params, "AdamW: params must not be null when numel > 0");
    SCMOE_CHECK(param_dtype == DType::kF32 || param_dtype == DType::kBF16,
                "AdamW: params must be f32 or bf16, got " << dtype_name(param_dtype));
    config_.schedule.validate();
    // The remaining hyperparameters are checked by a dry run of the step's own argument check.
    AdamWArgs probe;
    probe.beta1 = config_.beta1;
    probe.beta2 = config_.beta2;
    probe.eps = config_.eps;
    probe.weight_decay = config_.weight_decay;
    check_adamw_args(probe);

    master_ = state_buffer(device, numel);
    m_ = state_buffer(device, numel);
    v_ = state_buffer(device, numel);
    if (numel == 0) return;
    convert(params, param_dtype, master_.data(), DType::kF32, numel, stream);
    const std::size_t bytes = static_cast<std::size_t>(numel) * sizeof(float);
    stream.fill_zero(m_.data(), bytes);
    stream.fill_zero(v_.data(), bytes);
}

AdamW::AdamW(Device& device, const ParamSet& params, const AdamWConfig& config, Stream& stream)
    : AdamW(device, params.data(), param_set_dtype(params), params.numel(), config, stream) {}

float AdamW::step(const float* grads, float grad_scale, Stream& stream) {
    const std::int64_t step_number = steps_taken_ + 1;
    AdamWArgs a;
    a.n = numel_;
    a.lr = config_.schedule.lr(step_number);
    a.beta1 = config_.beta1;
    a.beta2 = config_.beta2;
    a.eps = config_.eps;
    a.weight_decay = config_.weight_decay;
    a.step = step_number;
    a.grad_scale = grad_scale;
    a.grad = grads;
    a.master = master();
    a.m = m();
    a.v = v();
    a.param = params_;
    a.param_dtype = param_dtype_;
    adamw_step(a, stream);  // throws before enqueueing anything on a bad argument
    steps_taken_ = step_number;
    return a.lr;
}

void AdamW::write_params(Stream& stream) {
    if (numel_ > 0) convert(master(), DType::kF32, params_, param_dtype_, numel_, stream);
}

void AdamW::set_steps_taken(std::int64_t steps) {
    SCMOE_CHECK(steps >= 0, "AdamW::set_steps_taken: steps must be >= 0, got " << steps);
    steps_taken_ = steps;
}

float clip_scale(float global_norm, float max_norm) {
    SCMOE_CHECK(std::isfinite(global_norm) && global_norm >= 0.0f,
                "clip_scale: the global gradient norm must be finite and >= 0, got " << global_norm);
    if (!(max_norm > 0.0f) || global_norm <= max_norm) return 1.0f;
    return max_norm / global_norm;
}

float global_grad_norm(const std::vector<std::pair<const float*, std::int64_t>>& grads, Device& device,
                       Stream& stream) {
    if (grads.empty()) return 0.0f;
    // Every argument is checked before anything is enqueued: the buffers below must outlive the work.
    for (const auto& [ptr, n] : grads) {
        SCMOE_CHECK(n >= 0, "global_grad_norm: array sizes must be >= 0, got " << n);
        SCMOE_CHECK(n == 0 || ptr, "global_grad_norm: a gradient pointer is null with n=" << n);
    }
    DeviceBuffer scratch(device, sum_of_squares_scratch_bytes());
    DeviceBuffer sums(device, grads.size() * sizeof(float));
    for (std::size_t i = 0; i < grads.size(); ++i) {
        sum_of_squares(grads[i].first, grads[i].second, sums.as<float>() + i, scratch.data(), stream);
    }
    std::vector<float> host(grads.size());
    stream.copy(host.data(), sums.data(), host.size() * sizeof(float));
    stream.synchronize();
    double total = 0.0;
    for (float s : host) total += s;
    return static_cast<float>(std::sqrt(total));
}

}  // namespace scmoe::models
