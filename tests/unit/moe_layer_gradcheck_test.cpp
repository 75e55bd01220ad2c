// Finite-difference gradient checks of MoeLayer on the CPU backend (fp32).
//
// Loss L = <y, R> + aux_coef * aux + z_coef * z with a fixed random R (the upstream gradient).
// Each checked element is perturbed by +-eps and the central difference compared with the analytic
// gradient: |fd - analytic| <= kAbsTol + kRelTol * max(|fd|, |analytic|). fp32 forward passes limit
// the accuracy of the difference itself, hence eps = 5e-3 and the tolerances below.
// Top-k selection is piecewise constant: an element whose +-eps perturbation changes the routing is
// skipped (and counted; at least a third of every parameter's elements must be checked), since its finite difference spans a
// discontinuity.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "test_util.h"

namespace scmoe {
namespace {

constexpr float kEps = 5e-3f;
constexpr double kAbsTol = 2e-3;
constexpr double kRelTol = 2e-2;

struct GradCase {
    std::string name;
    int top_k;
    Activation activation;
    bool shared;
    bool cg;
    DispatchMode dispatch;
    float capacity_factor;  // small values force drops
    bool separate_shortcut;
    float noise_std;
};

std::string case_name(const ::testing::TestParamInfo<GradCase>& info) { return info.param.name; }

class MoeLayerGradCheck : public ::testing::TestWithParam<GradCase> {};

// The noisy gate draws fresh noise every training forward (MoeLayer::set_noise_key); a finite
// difference needs the same noise in every forward, so each forward here uses one fixed key.
void pin_noise(testing::CpuLayerHarness& h) { h.layer.set_noise_key(0, 0); }

double loss_with_pinned_noise(testing::CpuLayerHarness& h) {
    pin_noise(h);
    return h.loss();
}

// Routing fingerprint: expert and slot of every assignment after a forward.
std::vector<int> routing_of(testing::CpuLayerHarness& h) {
    MoeRouting r = h.layer.routing(*h.stream);
    std::vector<int> f(r.expert_index.begin(), r.expert_index.end());
    f.insert(f.end(), r.slot_of_choice.begin(), r.slot_of_choice.end());
    return f;
}

struct Checked {
    int checked = 0, skipped = 0, failed = 0;
    std::string first_failure;
};

// Checks d loss / d v[i] for every i against analytic[i]. `v` is the float the forward reads.
Checked check_elements(testing::CpuLayerHarness& h, float* v, const float* analytic, std::int64_t n,
                       const std::string& what) {
    Checked c;
    pin_noise(h);
    h.forward();
    const std::vector<int> base_routing = routing_of(h);
    for (std::int64_t i = 0; i < n; ++i) {
        const float saved = v[i];
        v[i] = saved + kEps;
        const double lp = loss_with_pinned_noise(h);
        const std::vector<int> rp = routing_of(h);
        v[i] = saved - kEps;
        const double lm = loss_with_pinned_noise(h);
        const std::vector<int> rm = routing_of(h);
        v[i] = saved;
        if (rp != base_routing || rm != base_routing) {
            ++c.skipped;
            continue;
        }
        const double fd = (lp - lm) / (2.0 * kEps);
        const double an = analytic[i];
        ++c.checked;
        if (std::abs(fd - an) > kAbsTol + kRelTol * std::max(std::abs(fd), std::abs(an))) {
            if (c.failed++ == 0)
                c.first_failure = what + "[" + std::to_string(i) + "]: finite difference " + std::to_string(fd) +
                                  " vs analytic " + std::to_string(an);
        }
    }
    return c;
}

TEST_P(MoeLayerGradCheck, MatchesFiniteDifferences) {
    const GradCase& gc = GetParam();
    MoeConfig c;
    c.hidden = 8;
    c.ffn = 6;
    c.num_experts = 4;
    c.top_k = gc.top_k;
    c.activation = gc.activation;
    c.shared_expert = gc.shared;
    c.shared_ffn = 5;
    c.coefficient_gate = gc.cg;
    c.dispatch = gc.dispatch;
    c.capacity_factor = gc.capacity_factor;
    c.noise_std = gc.noise_std;
    c.aux_loss_coef = 0.1f;  // large enough that a wrong aux gradient shows
    c.z_loss_coef = 0.05f;
    const std::int64_t tokens = 10;
    testing::CpuLayerHarness h(c, tokens, gc.separate_shortcut, 7);

    pin_noise(h);
    h.forward();
    if (gc.capacity_factor < 1.0f) {
        ASSERT_GT(h.layer.stats(*h.stream).dropped_tokens, 0) << "case meant to drop tokens drops none";
    }
    h.backward();
    const std::vector<float> grad_x = h.grad_x, grad_s = h.grad_s;
    const auto* grads = static_cast<const float*>(h.grads.data());
    std::vector<float> analytic(grads, grads + h.grads.numel());

    const auto specs = moe_param_specs(c);
    auto* params = static_cast<float*>(h.params.data());
    std::int64_t offset = 0;
    for (const ParamSpec& spec : specs) {
        if (spec.numel() == 0) continue;
        Checked r = check_elements(h, params + offset, analytic.data() + offset, spec.numel(), spec.name);
        EXPECT_EQ(r.failed, 0) << r.failed << " of " << r.checked << " elements wrong; first: " << r.first_failure;
        // One near-tied token flips for every perturbation of its two experts' gate columns, so up to
        // about half of gate_w can be skipped; everything else must mostly be checked.
        EXPECT_GE(r.checked, spec.numel() / 3) << spec.name << ": " << r.skipped << " routing flips of "
                                                << spec.numel() << " is too many for a fair check";
        offset += spec.numel();
    }
    Checked rx = check_elements(h, h.x.data(), grad_x.data(), static_cast<std::int64_t>(h.x.size()), "x");
    EXPECT_EQ(rx.failed, 0) << rx.first_failure;
    if (gc.separate_shortcut) {
        Checked rs = check_elements(h, h.s.data(), grad_s.data(), static_cast<std::int64_t>(h.s.size()), "shortcut");
        EXPECT_EQ(rs.failed, 0) << rs.first_failure;
    }
}

const auto kSwiGLU = Activation::kSwiGLU;
const auto kGeLU = Activation::kGeLU;
const auto kCap = DispatchMode::kCapacity;
const auto kDropless = DispatchMode::kDropless;

INSTANTIATE_TEST_SUITE_P(
    Cpu, MoeLayerGradCheck,
    ::testing::Values(GradCase{"top1_swiglu", 1, kSwiGLU, false, false, kCap, 4.0f, false, 0.0f},
                      GradCase{"top2_swiglu", 2, kSwiGLU, false, false, kCap, 4.0f, false, 0.0f},
                      GradCase{"top1_gelu", 1, kGeLU, false, false, kDropless, 1.0f, false, 0.0f},
                      GradCase{"top2_gelu", 2, kGeLU, false, false, kDropless, 1.0f, false, 0.0f},
                      GradCase{"top1_swiglu_shared", 1, kSwiGLU, true, false, kCap, 4.0f, false, 0.0f},
                      GradCase{"top2_gelu_shared", 2, kGeLU, true, false, kCap, 4.0f, false, 0.0f},
                      GradCase{"top1_swiglu_shared_cg", 1, kSwiGLU, true, true, kDropless, 1.0f, false, 0.0f},
                      GradCase{"top2_gelu_shared_cg", 2, kGeLU, true, true, kCap, 4.0f, false, 0.0f},
                      GradCase{"top2_swiglu_shared_cg_shortcut", 2, kSwiGLU, true, true, kCap, 4.0f, true, 0.0f},
                      GradCase{"top1_gelu_shortcut_no_shared", 1, kGeLU, false, false, kDropless, 1.0f, true, 0.0f},
                      GradCase{"top2_swiglu_capacity_drops", 2, kSwiGLU, true, false, kCap, 0.5f, false, 0.0f},
                      GradCase{"top1_gelu_capacity_drops_cg", 1, kGeLU, true, true, kCap, 0.5f, true, 0.0f},
                      GradCase{"top2_swiglu_noisy_gate", 2, kSwiGLU, false, false, kDropless, 1.0f, false, 0.5f},
                      // Top-3 (of 4 experts): three renormalised gate weights per token.
                      GradCase{"top3_swiglu", 3, kSwiGLU, false, false, kCap, 4.0f, false, 0.0f},
                      GradCase{"top3_gelu_dropless", 3, kGeLU, false, false, kDropless, 1.0f, false, 0.0f},
                      GradCase{"top3_swiglu_shared_cg_shortcut", 3, kSwiGLU, true, true, kCap, 4.0f, true, 0.0f},
                      GradCase{"top3_gelu_capacity_drops", 3, kGeLU, false, false, kCap, 0.5f, false, 0.0f},
                      GradCase{"top3_swiglu_capacity_1_25", 3, kSwiGLU, true, false, kCap, 1.25f, false, 0.0f},
                      GradCase{"top3_swiglu_noisy_gate", 3, kSwiGLU, false, false, kDropless, 1.0f, false, 0.5f}),
    case_name);

}  // namespace
}  // namespace scmoe
