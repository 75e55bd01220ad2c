// Helpers shared by the CPU tests: the CPU backend with a stream, deterministic random fills,
// bitwise comparison and a harness that runs an MoeLayer on the CPU backend with host-visible buffers.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "scmoe/kernels/device.h"
#include "scmoe/kernels/error.h"
#include "scmoe/kernels/math.h"
#include "scmoe/moe/moe_layer.h"
#include "scmoe/moe/params.h"

namespace scmoe::testing {

// A name gtest accepts for a parameterized case: "scmoe-pos2" -> "scmoe_pos2".
inline std::string gtest_name(std::string s) {
    std::replace(s.begin(), s.end(), '-', '_');
    return s;
}

// An element count or index as a std::vector subscript.
inline std::size_t sz(std::int64_t n) { return static_cast<std::size_t>(n); }

// The values bf16 storage holds: what a CPU f32 reference of a bf16 run must see.
inline std::vector<float> round_bf16(std::vector<float> v) {
    for (float& x : v) x = math::round_to_bf16(x);
    return v;
}

// ||got - want||_2 / ||want||_2 (want's norm taken as at least 1e-12), in double; sizes must match.
inline double relative_l2(const std::vector<float>& got, const std::vector<float>& want) {
    double diff = 0.0, ref = 0.0;
    for (std::size_t i = 0; i < got.size(); ++i) {
        const double d = static_cast<double>(got[i]) - want[i];
        diff += d * d;
        ref += static_cast<double>(want[i]) * want[i];
    }
    return std::sqrt(diff) / std::max(std::sqrt(ref), 1e-12);
}

inline void fill_uniform(float* p, std::int64_t n, float scale, std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> dist(-scale, scale);
    for (std::int64_t i = 0; i < n; ++i) p[i] = dist(rng);
}

// n floats uniform in [-scale, scale): the values fill_uniform writes for the same seed.
inline std::vector<float> random_floats(std::int64_t n, std::uint64_t seed, float scale = 1.0f) {
    std::vector<float> v(sz(n));
    fill_uniform(v.data(), n, scale, seed);
    return v;
}

// n token ids (or targets) uniform in [0, vocab).
inline std::vector<std::int32_t> random_ids(std::int64_t n, std::int64_t vocab, std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<std::int32_t> dist(0, static_cast<std::int32_t>(vocab - 1));
    std::vector<std::int32_t> v(sz(n));
    for (auto& x : v) x = dist(rng);
    return v;
}

// Same size and the same bits in every element (a NaN equals itself, -0 differs from +0).
inline bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Issue 28: an equivalence test's candidate (and reference) run on outputs and gradients filled
// with NaN, so whatever a run leaves unwritten shows instead of passing as an earlier run's value.
inline constexpr float kUnwritten = std::numeric_limits<float>::quiet_NaN();
inline void fill_nan(std::vector<float>& v) { std::fill(v.begin(), v.end(), kUnwritten); }
inline void fill_nan(const MoeParamStore& store) {
    auto* p = static_cast<float*>(store.data());
    std::fill(p, p + store.numel(), kUnwritten);
}
// The index of the first NaN in v, or -1.
inline std::int64_t first_nan(const std::vector<float>& v) {
    for (std::size_t i = 0; i < v.size(); ++i)
        if (v[i] != v[i]) return static_cast<std::int64_t>(i);
    return -1;
}

// Central differences of loss() with respect to every element of v (restored after each).
template <class Loss>
std::vector<double> finite_differences(std::vector<float>& v, float step, Loss&& loss) {
    std::vector<double> fd(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) {
        const float saved = v[i];
        v[i] = saved + step;
        const double up = loss();
        v[i] = saved - step;
        const double down = loss();
        v[i] = saved;
        fd[i] = (up - down) / (2.0 * static_cast<double>(step));
    }
    return fd;
}

// <a, b> accumulated in double: a scalar loss whose gradient with respect to a is b.
inline double dot(const std::vector<float>& a, const std::vector<float>& b) {
    double s = 0.0;
    for (std::size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * b[i];
    return s;
}

// Largest |analytic - fd| / (atol + rtol * |fd|) over all elements: > 1 means the check fails.
inline double worst_violation(const std::vector<float>& analytic, const std::vector<double>& fd, double atol,
                              double rtol) {
    double worst = 0.0;
    for (std::size_t i = 0; i < fd.size(); ++i)
        worst = std::max(worst, std::abs(analytic[i] - fd[i]) / (atol + rtol * std::abs(fd[i])));
    return worst;
}

inline Tensor host_tensor(std::vector<float>& v, std::int64_t rows, std::int64_t cols) {
    return Tensor(v.data(), DType::kF32, {rows, cols});
}

// The CPU backend and one stream on it.
struct Cpu {
    std::unique_ptr<Device> device = make_device("cpu");
    std::unique_ptr<Stream> stream = device->create_stream();
};

// One MoE layer on the CPU backend with its parameters, gradients and I/O in host memory.
struct CpuLayerHarness : Cpu {
    MoeConfig config;
    std::int64_t tokens;
    MoeLayer layer;
    MoeParamStore params, grads;
    std::vector<float> x, s, y, grad_y, grad_x, grad_s;
    bool separate_shortcut;

    CpuLayerHarness(const MoeConfig& c, std::int64_t t, bool shortcut, std::uint64_t seed = 1)
        : config(c),
          tokens(t),
          layer(c, *device, t),
          params(*device, c, DType::kF32),
          grads(*device, c, DType::kF32),
          x(static_cast<std::size_t>(t * c.hidden)),
          s(x.size()),
          y(x.size()),
          grad_y(x.size()),
          grad_x(x.size()),
          grad_s(x.size()),
          separate_shortcut(shortcut) {
        fill_uniform(static_cast<float*>(params.data()), params.numel(), 0.5f, seed);
        fill_uniform(x.data(), static_cast<std::int64_t>(x.size()), 1.0f, seed + 1);
        fill_uniform(s.data(), static_cast<std::int64_t>(s.size()), 1.0f, seed + 2);
        fill_uniform(grad_y.data(), static_cast<std::int64_t>(grad_y.size()), 1.0f, seed + 3);
    }

    // Work still queued on the stream reads the buffers below: drain it before they go.
    ~CpuLayerHarness() {
        try {
            stream->synchronize();
        } catch (const std::exception&) {
        }
    }
    CpuLayerHarness(const CpuLayerHarness&) = delete;
    CpuLayerHarness& operator=(const CpuLayerHarness&) = delete;

    Tensor xt() { return host_tensor(x, tokens, config.hidden); }
    Tensor st() { return separate_shortcut ? host_tensor(s, tokens, config.hidden) : Tensor(); }

    void forward() {
        layer.forward(xt(), st(), params.view(), host_tensor(y, tokens, config.hidden), *stream);
        stream->synchronize();
    }
    void backward() {
        layer.backward(host_tensor(grad_y, tokens, config.hidden), params.view(), grads.view(),
                       host_tensor(grad_x, tokens, config.hidden),
                       separate_shortcut ? host_tensor(grad_s, tokens, config.hidden) : Tensor(), *stream);
        stream->synchronize();
    }
    // Total loss whose gradient backward() computes with grad_y as the upstream gradient:
    // <y, grad_y> + aux_coef * aux + z_coef * z, in double.
    double loss() {
        forward();
        MoeStats st = layer.stats(*stream);
        double l = 0.0;
        for (std::size_t i = 0; i < y.size(); ++i) l += static_cast<double>(y[i]) * grad_y[i];
        return l + static_cast<double>(config.aux_loss_coef) * st.aux_loss +
               static_cast<double>(config.z_loss_coef) * st.z_loss;
    }
};

}  // namespace scmoe::testing
