// Helpers for the GPU tests: a CPU and a CUDA backend side by side, uploads that round to bf16 on
// the host, downloads that widen back to f32, and comparison helpers with the tolerance in the call.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gpu_presence.h"
#include "test_util.h"
#include "scmoe/kernels/attention.h"
#include "scmoe/kernels/device.h"
#include "scmoe/kernels/math.h"

// Every GPU test starts with this: without a GPU it reports a skip; with a GPU that CUDA cannot use
// (nvidia-smi lists one, CUDA answers with none) it fails with CUDA's reason (review L3).
#define SCMOE_REQUIRE_GPU()                                                                                 \
    do {                                                                                                    \
        if (::scmoe::cuda_device_available()) break;                                                        \
        if (::scmoe::testing::gpu_test_action(false, ::scmoe::testing::lists_gpu(                           \
                                                         ::scmoe::testing::nvidia_smi_list())) ==           \
            ::scmoe::testing::GpuTestAction::kFail)                                                         \
            FAIL() << "nvidia-smi lists a GPU, but CUDA cannot use it: " << ::scmoe::cuda_unavailable_reason(); \
        GTEST_SKIP() << "no CUDA device: GPU test skipped (" << ::scmoe::cuda_unavailable_reason() << ")";  \
    } while (0)

namespace scmoe::gpu_testing {

using F = std::vector<float>;
using I = std::vector<std::int32_t>;

inline F random_uniform(std::int64_t n, float scale, std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> dist(-scale, scale);
    F v(static_cast<std::size_t>(n));
    for (float& x : v) x = dist(rng);
    return v;
}

using testing::round_bf16;

struct Backends {
    std::unique_ptr<Device> cpu = make_device("cpu");
    std::unique_ptr<Stream> cpu_stream = cpu->create_stream();
    std::unique_ptr<Device> gpu = make_device("cuda");
    std::unique_ptr<Stream> gpu_stream = gpu->create_stream();
};

// f32 host values -> device buffer in `dtype` (bf16: rounded to nearest even on the host).
inline DeviceBuffer upload(Backends& b, const F& host, DType dtype) {
    DeviceBuffer buf(*b.gpu, std::max<std::size_t>(host.size() * dtype_size(dtype), 1));
    if (host.empty()) return buf;
    if (dtype == DType::kBF16) {
        std::vector<std::uint16_t> bits(host.size());
        for (std::size_t i = 0; i < host.size(); ++i) bits[i] = math::f32_to_bf16_bits(host[i]);
        b.gpu_stream->copy(buf.data(), bits.data(), bits.size() * sizeof(std::uint16_t));
    } else {
        b.gpu_stream->copy(buf.data(), host.data(), host.size() * sizeof(float));
    }
    b.gpu_stream->synchronize();
    return buf;
}

inline DeviceBuffer upload_i32(Backends& b, const I& host) {
    DeviceBuffer buf(*b.gpu, std::max<std::size_t>(host.size() * sizeof(std::int32_t), 1));
    if (!host.empty()) b.gpu_stream->copy(buf.data(), host.data(), host.size() * sizeof(std::int32_t));
    b.gpu_stream->synchronize();
    return buf;
}

// Synchronizes the GPU stream, then copies n elements of `dtype` back and widens them to f32.
inline F download(Backends& b, const void* dev, std::int64_t n, DType dtype) {
    F out(static_cast<std::size_t>(n));
    b.gpu_stream->synchronize();
    if (n == 0) return out;
    if (dtype == DType::kBF16) {
        std::vector<std::uint16_t> bits(out.size());
        b.gpu_stream->copy(bits.data(), dev, bits.size() * sizeof(std::uint16_t));
        b.gpu_stream->synchronize();
        for (std::size_t i = 0; i < out.size(); ++i) out[i] = math::bf16_bits_to_f32(bits[i]);
    } else {
        b.gpu_stream->copy(out.data(), dev, out.size() * sizeof(float));
        b.gpu_stream->synchronize();
    }
    return out;
}

inline I download_i32(Backends& b, const void* dev, std::int64_t n) {
    I out(static_cast<std::size_t>(n));
    b.gpu_stream->synchronize();
    if (n > 0) b.gpu_stream->copy(out.data(), dev, out.size() * sizeof(std::int32_t));
    b.gpu_stream->synchronize();
    return out;
}

// |got - want| <= tol * max(1, |want|) for every element.
inline void expect_close(const F& got, const F& want, float tol, const char* what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    for (std::size_t i = 0; i < got.size(); ++i) {
        ASSERT_NEAR(got[i], want[i], tol * std::max(1.0f, std::abs(want[i])))
            << what << ": element " << i << " of " << got.size();
    }
}

// ||got - want||_2 <= tol * ||want||_2 (for results with many bf16 rounding stages).
inline void expect_rel_l2(const F& got, const F& want, double tol, const char* what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    EXPECT_LE(testing::relative_l2(got, want), tol) << what << ": relative L2 error";
}

inline void expect_bitwise_equal(const F& a, const F& b, const char* what) {
    ASSERT_EQ(a.size(), b.size()) << what;
    for (std::size_t i = 0; i < a.size(); ++i) {
        std::uint32_t ua, ub;
        std::memcpy(&ua, &a[i], 4);
        std::memcpy(&ub, &b[i], 4);
        ASSERT_EQ(ua, ub) << what << ": element " << i << " differs between runs (" << a[i] << " vs " << b[i] << ")";
    }
}

// Sets an environment variable for a scope (the previous value, or none, comes back after).
class ScopedEnv {
  public:
    ScopedEnv(const char* name, const char* value) : name_(name) {
        if (const char* old = std::getenv(name)) {
            old_ = old;
            had_ = true;
        }
        setenv(name, value, 1);
    }
    ~ScopedEnv() {
        if (had_)
            setenv(name_, old_.c_str(), 1);
        else
            unsetenv(name_);
    }
    ScopedEnv(const ScopedEnv&) = delete;
    ScopedEnv& operator=(const ScopedEnv&) = delete;

  private:
    const char* name_;
    std::string old_;
    bool had_ = false;
};

// One attention case of the GPU tests: shape, GQA (kv_heads), causal or bidirectional, and its args.
struct AttentionCase {
    std::int64_t batch, seq, heads, head_dim;
    std::int64_t kv_heads = 0;  // GQA: K/V heads; 0 = heads
    bool causal = true;         // false: bidirectional (the SDPA graph without its mask)
    std::int64_t qkv_size() const { return batch * seq * attention_qkv_width(heads, kv_heads, head_dim); }
    std::int64_t out_size() const { return batch * seq * heads * head_dim; }
    std::int64_t lse_size() const { return batch * heads * seq; }
    std::string name() const {
        return "batch=" + std::to_string(batch) + " seq=" + std::to_string(seq) + " heads=" + std::to_string(heads) +
               " head_dim=" + std::to_string(head_dim) + (kv_heads ? " kv_heads=" + std::to_string(kv_heads) : "") +
               (causal ? "" : " bidirectional");
    }
    AttentionArgs fwd(DType dt, const void* qkv, void* out, float* lse) const {
        AttentionArgs a{batch, seq, heads, head_dim, dt, qkv, out, lse, kv_heads};
        a.causal = causal;
        return a;
    }
    AttentionBackwardArgs bwd(DType dt, const void* qkv, const void* out, const float* lse, const void* go,
                              void* grad) const {
        AttentionBackwardArgs a{batch, seq, heads, head_dim, dt, qkv, out, lse, go, grad, kv_heads};
        a.causal = causal;
        return a;
    }
};

}  // namespace scmoe::gpu_testing
