// Helpers for the BlockStack tests: a small CPU configuration per variant, parameters generated
// from seeds (the full expert set, sliced for an expert-parallel rank), and one forward/backward
// whose results land in host vectors.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "scmoe/comm/communicator.h"
#include "ep_reference.h"
#include "scmoe/moe/block_stack.h"

namespace scmoe::testing {

inline BackboneShape small_backbone() {
    BackboneShape s;
    s.hidden = 16;
    s.heads = 2;
    s.seq_len = 4;
    s.ffn = 12;
    return s;
}

inline MoeConfig small_moe(DispatchMode dispatch = DispatchMode::kCapacity) {
    MoeConfig m;
    m.hidden = 16;
    m.ffn = 12;
    m.num_experts = 4;
    m.dispatch = dispatch;
    m.capacity_factor = 1.5f;
    m.aux_loss_coef = 0.1f;
    m.z_loss_coef = 0.05f;
    return m;
}

inline BlockStackConfig small_variant(const std::string& variant, DispatchMode dispatch = DispatchMode::kCapacity,
                                      bool cg = true) {
    return block_variant(variant, small_backbone(), small_moe(dispatch), cg, 3);
}

// Deterministic parameters: norm weights near 1, matrices uniform in +-1/sqrt(fan in), experts from
// the full set (seeded) sliced for this rank.
inline void init_params(BlockStack& stack, std::uint64_t seed, int ep = 1, int ep_rank = 0) {
    const ParamSet& p = stack.backbone_params();
    for (std::size_t i = 0; i < p.specs().size(); ++i) {
        const ParamSpec& s = p.specs()[i];
        auto* data = static_cast<float*>(p[i].data);
        const bool norm = s.shape.size() == 1;
        fill_uniform(data, s.numel(), norm ? 0.2f : 1.0f / std::sqrt(static_cast<float>(s.shape[0])), seed + 17 * i);
        if (norm)
            for (std::int64_t j = 0; j < s.numel(); ++j) data[j] += 1.0f;
    }
    const MoeConfig& mc = stack.config().moe;
    for (std::size_t m = 0; m < stack.moe_params().size(); ++m) {
        auto device = make_device("cpu");
        MoeParamStore full(*device, mc, DType::kF32);
        fill_uniform(static_cast<float*>(full.data()), full.numel(), 0.5f, seed + 1000 + m);
        slice_params(mc, ep, ep_rank, {static_cast<const float*>(full.data())},
                     static_cast<float*>(stack.moe_params()[m]->data()));
    }
}

struct StackResult {
    std::vector<float> out, grad_in, backbone_grads;
    std::vector<std::vector<float>> moe_grads;
    double router_loss = 0;
};

inline std::vector<float> make_input(std::int64_t tokens, std::int64_t hidden, std::uint64_t seed) {
    std::vector<float> v(static_cast<std::size_t>(tokens * hidden));
    fill_uniform(v.data(), static_cast<std::int64_t>(v.size()), 1.0f, seed);
    return v;
}

// Fills every parameter gradient of `stack` with NaN: a gradient a backward leaves unwritten shows.
inline void poison_grads(BlockStack& stack) {
    constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
    auto* g = static_cast<float*>(stack.backbone_grads().data());
    std::fill(g, g + stack.backbone_grads().numel(), kNaN);
    for (const auto& m : stack.moe_grads()) {
        auto* mg = static_cast<float*>(m->data());
        std::fill(mg, mg + m->numel(), kNaN);
    }
}

// One forward + backward; returns every result as host copies. The output, the input gradient and
// every parameter gradient start as NaN (issue 28): whatever the passes leave unwritten stays NaN,
// so it cannot pass as a value an earlier run left there. Run each candidate of an equivalence test
// on a stack of its own and check the reference with unwritten().
inline StackResult run_stack(BlockStack& stack, std::vector<float> x, std::vector<float> gy, bool overlap,
                             bool calibrate = false) {
    constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
    const std::int64_t H = stack.config().backbone.hidden, T = static_cast<std::int64_t>(x.size()) / H;
    StackResult r;
    r.out.assign(x.size(), kNaN);
    r.grad_in.assign(x.size(), kNaN);
    if (calibrate) stack.calibrate(host_tensor(x, T, H), host_tensor(gy, T, H), 1);
    poison_grads(stack);
    stack.forward(host_tensor(x, T, H), host_tensor(r.out, T, H), overlap);
    stack.backward(host_tensor(gy, T, H), host_tensor(r.grad_in, T, H), overlap);
    stack.synchronize();
    r.router_loss = stack.router_loss();
    const auto* g = static_cast<const float*>(stack.backbone_grads().data());
    r.backbone_grads.assign(g, g + stack.backbone_grads().numel());
    for (const auto& m : stack.moe_grads()) {
        const auto* mg = static_cast<const float*>(m->data());
        r.moe_grads.emplace_back(mg, mg + m->numel());
    }
    return r;
}

// "" when every output and gradient of `r` was written (none is NaN), else the first NaN: a
// reference must pass this before a candidate's equality to it means anything.
inline std::string unwritten(const StackResult& r) {
    auto first_nan = [](const std::vector<float>& v, const std::string& what) -> std::string {
        for (std::size_t i = 0; i < v.size(); ++i)
            if (std::isnan(v[i])) return what + "[" + std::to_string(i) + "] unwritten (NaN)";
        return "";
    };
    std::string e = first_nan(r.out, "output");
    if (e.empty()) e = first_nan(r.grad_in, "grad_input");
    if (e.empty()) e = first_nan(r.backbone_grads, "backbone grads");
    for (std::size_t m = 0; e.empty() && m < r.moe_grads.size(); ++m)
        e = first_nan(r.moe_grads[m], "moe grads " + std::to_string(m));
    return e;
}

// The first difference between two results' outputs and gradients: `first(got, want)` gives the
// index of a vector's first differing element, or -1; "" when none differs.
template <class First>
std::string first_difference(const StackResult& a, const StackResult& b, First first) {
    auto cmp = [&](const std::vector<float>& x, const std::vector<float>& y, const std::string& what) -> std::string {
        if (x.size() != y.size()) return what + ": sizes differ";
        const std::ptrdiff_t i = first(x, y);
        if (i < 0) return "";
        const auto u = static_cast<std::size_t>(i);
        return what + "[" + std::to_string(i) + "]: " + std::to_string(x[u]) + " vs " + std::to_string(y[u]);
    };
    std::string e = cmp(a.out, b.out, "output");
    if (e.empty()) e = cmp(a.grad_in, b.grad_in, "grad_input");
    if (e.empty()) e = cmp(a.backbone_grads, b.backbone_grads, "backbone grads");
    for (std::size_t m = 0; e.empty() && m < a.moe_grads.size(); ++m)
        e = cmp(a.moe_grads[m], b.moe_grads[m], "moe grads " + std::to_string(m));
    return e;
}

// Bitwise equality of two results; "" or the first difference.
inline std::string bitwise_diff(const StackResult& a, const StackResult& b) {
    return first_difference(a, b, [](const std::vector<float>& x, const std::vector<float>& y) -> std::ptrdiff_t {
        for (std::size_t i = 0; i < x.size(); ++i)
            if (std::memcmp(&x[i], &y[i], sizeof(float)) != 0) return static_cast<std::ptrdiff_t>(i);
        return -1;
    });
}

// Equality within `tol` of each vector's largest |value| in `b` (results that sum in another order,
// such as the chunked pipeline's row slices); "" or the first difference.
inline std::string close_diff(const StackResult& a, const StackResult& b, float tol) {
    return first_difference(a, b, [tol](const std::vector<float>& x, const std::vector<float>& y) -> std::ptrdiff_t {
        float largest = 0;
        for (float v : y) largest = std::max(largest, std::abs(v));
        for (std::size_t i = 0; i < x.size(); ++i)
            if (!(std::abs(x[i] - y[i]) <= tol * largest)) return static_cast<std::ptrdiff_t>(i);
        return -1;
    });
}

}  // namespace scmoe::testing
