// The optimizer on the CPU backend: the AdamW op against a double-precision reference, the AdamW
// class, the LR schedule, clipping and the global gradient norm.
#include "scmoe/models/optimizer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numbers>
#include <vector>

#include "scmoe/kernels/adamw.h"
#include "scmoe/kernels/device.h"
#include "scmoe/kernels/error.h"
#include "scmoe/kernels/math.h"
#include "test_util.h"

namespace scmoe::models {
namespace {

using testing::Cpu;
using testing::random_floats;

// The AdamW update written out in double, independently of math::adamw_update.
struct ReferenceAdamW {
    double lr, beta1, beta2, eps, weight_decay;
    std::vector<double> w, m, v;
    void step(const std::vector<float>& grad, double grad_scale, std::int64_t t) {
        for (std::size_t i = 0; i < w.size(); ++i) {
            const double g = grad[i] * grad_scale;
            m[i] = beta1 * m[i] + (1.0 - beta1) * g;
            v[i] = beta2 * v[i] + (1.0 - beta2) * g * g;
            const double m_hat = m[i] / (1.0 - std::pow(beta1, static_cast<double>(t)));
            const double v_hat = v[i] / (1.0 - std::pow(beta2, static_cast<double>(t)));
            w[i] -= lr * (m_hat / (std::sqrt(v_hat) + eps) + weight_decay * w[i]);
        }
    }
};

AdamWArgs make_args(std::vector<float>& grad, std::vector<float>& master, std::vector<float>& m,
                    std::vector<float>& v) {
    AdamWArgs a;
    a.n = static_cast<std::int64_t>(master.size());
    a.lr = 0.01f;
    a.beta1 = 0.9f;
    a.beta2 = 0.95f;
    a.eps = 1e-8f;
    a.weight_decay = 0.1f;
    a.grad = grad.data();
    a.master = master.data();
    a.m = m.data();
    a.v = v.data();
    return a;
}

TEST(AdamWOp, FirstStepIsSignOfGradientPlusDecay) {
    // Step 1 from zero moments: m_hat = g and v_hat = g^2, so the update is g / (|g| + eps) + wd * w.
    Cpu cpu;
    std::vector<float> grad = {0.5f, -2.0f}, master = {1.0f, -3.0f}, m(2, 0.0f), v(2, 0.0f);
    AdamWArgs a = make_args(grad, master, m, v);
    a.lr = 0.1f;
    a.weight_decay = 0.1f;
    adamw_step(a, *cpu.stream);
    cpu.stream->synchronize();
    EXPECT_NEAR(master[0], 1.0f - 0.1f * (1.0f + 0.1f * 1.0f), 1e-6f);   // 0.89
    EXPECT_NEAR(master[1], -3.0f - 0.1f * (-1.0f + 0.1f * -3.0f), 1e-6f);  // -2.87
    EXPECT_NEAR(m[0], 0.05f, 1e-7f);
    EXPECT_NEAR(v[1], 0.05f * 4.0f, 1e-7f);
}

TEST(AdamWOp, ThreeStepsMatchDoubleReference) {
    Cpu cpu;
    std::vector<float> master = {1.0f, -0.5f, 0.25f, 3.0f, 0.0f}, m(5, 0.0f), v(5, 0.0f);
    ReferenceAdamW ref{0.01, 0.9, 0.95, 1e-8, 0.1, {}, std::vector<double>(5, 0.0), std::vector<double>(5, 0.0)};
    ref.w.assign(master.begin(), master.end());
    const std::vector<std::vector<float>> grads = {
        {0.1f, -0.2f, 0.3f, -4.0f, 0.0f}, {0.2f, 0.1f, -0.3f, 1.0f, 1e-3f}, {-0.05f, 0.4f, 0.0f, 2.0f, -1e-3f}};
    for (std::int64_t t = 1; t <= 3; ++t) {
        std::vector<float> g = grads[static_cast<std::size_t>(t - 1)];
        AdamWArgs a = make_args(g, master, m, v);
        a.step = t;
        adamw_step(a, *cpu.stream);
        cpu.stream->synchronize();
        ref.step(g, 1.0, t);
        for (std::size_t i = 0; i < master.size(); ++i) {
            EXPECT_NEAR(master[i], ref.w[i], 1e-6 * std::max(1.0, std::abs(ref.w[i]))) << "step " << t << " i " << i;
            EXPECT_NEAR(m[i], ref.m[i], 1e-6 * std::max(1e-3, std::abs(ref.m[i]))) << "step " << t << " i " << i;
            EXPECT_NEAR(v[i], ref.v[i], 1e-6 * std::max(1e-6, std::abs(ref.v[i]))) << "step " << t << " i " << i;
        }
    }
}

TEST(AdamWOp, GradScaleMultipliesTheGradient) {
    Cpu cpu;
    const std::vector<float> init = random_floats(64, 1);
    std::vector<float> g = random_floats(64, 2), g_half(64);
    for (std::size_t i = 0; i < g.size(); ++i) g_half[i] = g[i] * 0.5f;  // exact
    std::vector<float> w1 = init, m1(64, 0.0f), v1(64, 0.0f), w2 = init, m2(64, 0.0f), v2(64, 0.0f);
    for (std::int64_t t = 1; t <= 2; ++t) {
        AdamWArgs scaled = make_args(g, w1, m1, v1);
        scaled.step = t;
        scaled.grad_scale = 0.5f;
        adamw_step(scaled, *cpu.stream);
        AdamWArgs prescaled = make_args(g_half, w2, m2, v2);
        prescaled.step = t;
        adamw_step(prescaled, *cpu.stream);
    }
    cpu.stream->synchronize();
    EXPECT_EQ(0, std::memcmp(w1.data(), w2.data(), w1.size() * sizeof(float)));
    EXPECT_EQ(0, std::memcmp(v1.data(), v2.data(), v1.size() * sizeof(float)));
    // Zero scale: the moments decay and only weight decay moves the weights.
    std::vector<float> w3 = init, m3(64, 0.0f), v3(64, 0.0f);
    AdamWArgs zero = make_args(g, w3, m3, v3);
    zero.grad_scale = 0.0f;
    adamw_step(zero, *cpu.stream);
    cpu.stream->synchronize();
    for (std::size_t i = 0; i < w3.size(); ++i) EXPECT_FLOAT_EQ(w3[i], init[i] - 0.01f * 0.1f * init[i]);
}

TEST(AdamWOp, ParamCopyIsMasterRoundedToItsDtype) {
    Cpu cpu;
    std::vector<float> g = random_floats(100, 3), master = random_floats(100, 4, 2.0f), m(100, 0.0f), v(100, 0.0f),
                       param_f32(100, 0.0f);
    std::vector<std::uint16_t> param_bf16(100, 0);
    AdamWArgs a = make_args(g, master, m, v);
    a.param = param_bf16.data();
    a.param_dtype = DType::kBF16;
    adamw_step(a, *cpu.stream);
    cpu.stream->synchronize();
    for (std::size_t i = 0; i < master.size(); ++i) EXPECT_EQ(param_bf16[i], math::f32_to_bf16_bits(master[i])) << i;
    a.step = 2;
    a.param = param_f32.data();
    a.param_dtype = DType::kF32;
    adamw_step(a, *cpu.stream);
    cpu.stream->synchronize();
    EXPECT_EQ(0, std::memcmp(param_f32.data(), master.data(), master.size() * sizeof(float)));
}

TEST(AdamWOp, ZeroElementsIsANoOp) {
    Cpu cpu;
    AdamWArgs a;
    a.lr = 0.1f;
    adamw_step(a, *cpu.stream);  // n = 0, null pointers allowed
    cpu.stream->synchronize();
}

TEST(AdamWOp, RejectsInvalidArguments) {
    Cpu cpu;
    std::vector<float> g(4, 0.1f), w(4, 1.0f), m(4, 0.0f), v(4, 0.0f);
    auto expect_throw = [&](auto mutate, const char* what) {
        AdamWArgs a = make_args(g, w, m, v);
        mutate(a);
        EXPECT_THROW(adamw_step(a, *cpu.stream), Error) << what;
    };
    expect_throw([](AdamWArgs& a) { a.n = -1; }, "n < 0");
    expect_throw([](AdamWArgs& a) { a.grad = nullptr; }, "null grad");
    expect_throw([](AdamWArgs& a) { a.master = nullptr; }, "null master");
    expect_throw([](AdamWArgs& a) { a.m = nullptr; }, "null m");
    expect_throw([](AdamWArgs& a) { a.v = nullptr; }, "null v");
    expect_throw([](AdamWArgs& a) { a.step = 0; }, "step 0");
    expect_throw([](AdamWArgs& a) { a.lr = -1.0f; }, "negative lr");
    expect_throw([](AdamWArgs& a) { a.lr = std::numeric_limits<float>::quiet_NaN(); }, "NaN lr");
    expect_throw([](AdamWArgs& a) { a.beta1 = 1.0f; }, "beta1 = 1");
    expect_throw([](AdamWArgs& a) { a.beta2 = -0.1f; }, "beta2 < 0");
    expect_throw([](AdamWArgs& a) { a.eps = 0.0f; }, "eps = 0");
    expect_throw([](AdamWArgs& a) { a.weight_decay = -0.1f; }, "negative weight decay");
    expect_throw([](AdamWArgs& a) { a.grad_scale = std::numeric_limits<float>::infinity(); }, "infinite grad scale");
    expect_throw([](AdamWArgs& a) { a.param_dtype = DType::kI32; }, "i32 param");
    cpu.stream->synchronize();
    for (float x : w) EXPECT_EQ(x, 1.0f);  // nothing was enqueued
}

TEST(SumOfSquares, MatchesDoubleAndIsDeterministic) {
    Cpu cpu;
    DeviceBuffer scratch(*cpu.device, sum_of_squares_scratch_bytes());
    const std::vector<float> x = random_floats(100003, 5, 3.0f);
    double want = 0.0;
    for (float e : x) want += static_cast<double>(e) * e;
    float got = -1.0f, again = -2.0f, empty = -3.0f;
    sum_of_squares(x.data(), static_cast<std::int64_t>(x.size()), &got, scratch.data(), *cpu.stream);
    sum_of_squares(x.data(), static_cast<std::int64_t>(x.size()), &again, scratch.data(), *cpu.stream);
    sum_of_squares(nullptr, 0, &empty, scratch.data(), *cpu.stream);
    cpu.stream->synchronize();
    EXPECT_NEAR(got, want, 1e-6 * want);
    EXPECT_EQ(std::memcmp(&got, &again, sizeof(float)), 0);
    EXPECT_EQ(empty, 0.0f);
    EXPECT_THROW(sum_of_squares(x.data(), -1, &got, scratch.data(), *cpu.stream), Error);
    EXPECT_THROW(sum_of_squares(x.data(), 4, nullptr, scratch.data(), *cpu.stream), Error);
    EXPECT_THROW(sum_of_squares(nullptr, 4, &got, scratch.data(), *cpu.stream), Error);
    EXPECT_THROW(sum_of_squares(x.data(), 4, &got, nullptr, *cpu.stream), Error);
}

LrSchedule schedule(float peak, float min, std::int64_t warmup, std::int64_t total) {
    LrSchedule s;
    s.peak_lr = peak;
    s.min_lr = min;
    s.warmup_steps = warmup;
    s.total_steps = total;
    return s;
}

TEST(LrSchedule, WarmupThenCosineToMin) {
    const LrSchedule s = schedule(1e-3f, 1e-4f, 10, 110);
    EXPECT_EQ(s.lr(0), 0.0f);                                            // warmup start
    EXPECT_NEAR(s.lr(1), 1e-4f, 1e-10f);                                 // first step taken
    EXPECT_NEAR(s.lr(5), 5e-4f, 1e-10f);                                 // halfway up
    EXPECT_FLOAT_EQ(s.lr(10), 1e-3f);                                    // warmup end = peak
    EXPECT_NEAR(s.lr(60), 1e-4f + 0.5f * (1e-3f - 1e-4f), 1e-10f);       // midway through the cosine
    EXPECT_NEAR(s.lr(35), 1e-4f + 0.9e-3f * 0.5 * (1.0 + std::cos(std::numbers::pi / 4.0)), 1e-9f);  // a quarter in
    EXPECT_FLOAT_EQ(s.lr(110), 1e-4f);                                   // end
    EXPECT_FLOAT_EQ(s.lr(1000), 1e-4f);                                  // past the end
    for (std::int64_t t = 10; t < 110; ++t) EXPECT_GE(s.lr(t), s.lr(t + 1)) << t;  // monotone decay
    for (std::int64_t t = 0; t < 10; ++t) EXPECT_LT(s.lr(t), s.lr(t + 1)) << t;    // monotone warmup

    const LrSchedule no_warmup = schedule(2e-3f, 0.0f, 0, 100);
    EXPECT_FLOAT_EQ(no_warmup.lr(0), 2e-3f);
    EXPECT_NEAR(no_warmup.lr(50), 1e-3f, 1e-9f);
    EXPECT_EQ(no_warmup.lr(100), 0.0f);
}

// A run shorter than its warmup ends inside it: no jump to the cosine's end at the last step.
TEST(LrSchedule, RunShorterThanItsWarmupEndsInsideIt) {
    const LrSchedule s = schedule(1e-3f, 1e-4f, 5, 4);
    for (std::int64_t t = 1; t <= 4; ++t) EXPECT_NEAR(s.lr(t), 1e-3f * static_cast<float>(t) / 5.0f, 1e-10f) << t;
    EXPECT_FLOAT_EQ(s.lr(5), 1e-4f);  // past the end of the run
}

TEST(LrSchedule, RejectsInvalidSchedules) {
    LrSchedule s;
    EXPECT_THROW(s.lr(-1), Error);
    LrSchedule bad = s;
    bad.min_lr = 1.0f;  // above peak
    EXPECT_THROW(bad.lr(0), Error);
    bad = s;
    bad.total_steps = 0;
    EXPECT_THROW(bad.validate(), Error);
    bad = s;
    bad.peak_lr = -1.0f;
    EXPECT_THROW(bad.validate(), Error);
}

TEST(ClipScale, ScalesOnlyAboveTheMaximum) {
    EXPECT_EQ(clip_scale(0.5f, 1.0f), 1.0f);
    EXPECT_EQ(clip_scale(1.0f, 1.0f), 1.0f);
    EXPECT_FLOAT_EQ(clip_scale(4.0f, 1.0f), 0.25f);
    EXPECT_FLOAT_EQ(clip_scale(10.0f, 2.5f) * 10.0f, 2.5f);  // the clipped norm is max_norm
    EXPECT_EQ(clip_scale(0.0f, 1.0f), 1.0f);
    EXPECT_EQ(clip_scale(1e6f, 0.0f), 1.0f);  // max_norm <= 0: clipping off
    EXPECT_THROW(clip_scale(std::numeric_limits<float>::quiet_NaN(), 1.0f), Error);
    EXPECT_THROW(clip_scale(std::numeric_limits<float>::infinity(), 1.0f), Error);
    EXPECT_THROW(clip_scale(-1.0f, 1.0f), Error);
}

TEST(GlobalGradNorm, MatchesDoubleReference) {
    Cpu cpu;
    const std::vector<float> a = random_floats(1000, 6), b = random_floats(12345, 7, 0.1f), c = {3.0f, 4.0f};
    double want = 0.0;
    for (const auto* vec : {&a, &b, &c}) {
        for (float x : *vec) want += static_cast<double>(x) * x;
    }
    want = std::sqrt(want);
    const std::vector<std::pair<const float*, std::int64_t>> grads = {
        {a.data(), 1000}, {nullptr, 0}, {b.data(), 12345}, {c.data(), 2}};
    const float got = global_grad_norm(grads, *cpu.device, *cpu.stream);
    EXPECT_NEAR(got, want, 1e-6 * want);
    const float again = global_grad_norm(grads, *cpu.device, *cpu.stream);
    EXPECT_EQ(std::memcmp(&got, &again, sizeof(float)), 0);
    EXPECT_FLOAT_EQ(global_grad_norm({{c.data(), 2}}, *cpu.device, *cpu.stream), 5.0f);
    EXPECT_EQ(global_grad_norm({}, *cpu.device, *cpu.stream), 0.0f);
    EXPECT_THROW(global_grad_norm({{a.data(), -1}}, *cpu.device, *cpu.stream), Error);
    EXPECT_THROW(global_grad_norm({{nullptr, 3}}, *cpu.device, *cpu.stream), Error);
}

TEST(AdamWOptimizer, MatchesTheOpAndCountsSteps) {
    Cpu cpu;
    const std::int64_t n = 37;
    DeviceBuffer params(*cpu.device, n * sizeof(float)), grads(*cpu.device, n * sizeof(float));
    const std::vector<float> init = random_floats(n, 8), g = random_floats(n, 9);
    std::memcpy(params.data(), init.data(), n * sizeof(float));
    std::memcpy(grads.data(), g.data(), n * sizeof(float));
    AdamWConfig config;
    config.schedule = {1e-2f, 1e-3f, 2, 10};
    config.weight_decay = 0.05f;
    AdamW opt(*cpu.device, params.data(), DType::kF32, n, config, *cpu.stream);
    EXPECT_EQ(opt.steps_taken(), 0);

    std::vector<float> w = init, m(n, 0.0f), v(n, 0.0f), gg = g;
    for (std::int64_t t = 1; t <= 3; ++t) {
        const float lr = opt.step(grads.as<float>(), 0.75f, *cpu.stream);
        EXPECT_EQ(lr, config.schedule.lr(t));
        AdamWArgs a = make_args(gg, w, m, v);
        a.lr = lr;
        a.weight_decay = 0.05f;
        a.step = t;
        a.grad_scale = 0.75f;
        adamw_step(a, *cpu.stream);
    }
    cpu.stream->synchronize();
    EXPECT_EQ(opt.steps_taken(), 3);
    EXPECT_EQ(std::memcmp(opt.master(), w.data(), n * sizeof(float)), 0);
    EXPECT_EQ(std::memcmp(opt.m(), m.data(), n * sizeof(float)), 0);
    EXPECT_EQ(std::memcmp(opt.v(), v.data(), n * sizeof(float)), 0);
    EXPECT_EQ(std::memcmp(params.data(), w.data(), n * sizeof(float)), 0);

    // Restoring a checkpoint: master overwritten, params rewritten, step counter set.
    std::vector<float> restored(n, 0.5f);
    std::memcpy(opt.master(), restored.data(), n * sizeof(float));
    opt.write_params(*cpu.stream);
    opt.set_steps_taken(7);
    cpu.stream->synchronize();
    EXPECT_EQ(std::memcmp(params.data(), restored.data(), n * sizeof(float)), 0);
    EXPECT_EQ(opt.steps_taken(), 7);
    EXPECT_THROW(opt.set_steps_taken(-1), Error);
    EXPECT_THROW(opt.step(nullptr, 1.0f, *cpu.stream), Error);
    EXPECT_EQ(opt.steps_taken(), 7);  // a rejected step is not counted
}

TEST(AdamWOptimizer, WidensBf16ParamsIntoMaster) {
    Cpu cpu;
    const std::vector<float> values = {1.0f, -2.5f, 3.140625f, 0.0f};
    std::vector<std::uint16_t> bits(values.size());
    for (std::size_t i = 0; i < values.size(); ++i) bits[i] = math::f32_to_bf16_bits(values[i]);
    AdamW opt(*cpu.device, bits.data(), DType::kBF16, 4, AdamWConfig{}, *cpu.stream);
    cpu.stream->synchronize();
    for (std::size_t i = 0; i < values.size(); ++i) EXPECT_EQ(opt.master()[i], values[i]);
    for (std::size_t i = 0; i < values.size(); ++i) EXPECT_EQ(opt.m()[i], 0.0f);
}

TEST(AdamWOptimizer, RejectsInvalidConstruction) {
    Cpu cpu;
    std::vector<float> p(4, 1.0f);
    AdamWConfig ok;
    EXPECT_THROW(AdamW(*cpu.device, p.data(), DType::kF32, -1, ok, *cpu.stream), Error);
    EXPECT_THROW(AdamW(*cpu.device, nullptr, DType::kF32, 4, ok, *cpu.stream), Error);
    EXPECT_THROW(AdamW(*cpu.device, p.data(), DType::kI32, 4, ok, *cpu.stream), Error);
    AdamWConfig bad = ok;
    bad.beta2 = 1.0f;
    EXPECT_THROW(AdamW(*cpu.device, p.data(), DType::kF32, 4, bad, *cpu.stream), Error);
    bad = ok;
    bad.schedule.total_steps = 0;
    EXPECT_THROW(AdamW(*cpu.device, p.data(), DType::kF32, 4, bad, *cpu.stream), Error);
    AdamW empty(*cpu.device, nullptr, DType::kF32, 0, ok, *cpu.stream);
    empty.step(nullptr, 1.0f, *cpu.stream);
    cpu.stream->synchronize();
    EXPECT_EQ(empty.steps_taken(), 1);
}

TEST(AdamWOptimizer, MinimizesAQuadratic) {
    // f(w) = 0.5 * sum_i a_i (w_i - c_i)^2 with curvatures spanning 3 decades; grad = a (w - c).
    Cpu cpu;
    const std::int64_t n = 16;
    std::vector<float> a(n), c = random_floats(n, 10, 2.0f);
    for (std::int64_t i = 0; i < n; ++i) a[i] = std::pow(10.0f, -1.0f + 3.0f * static_cast<float>(i) / (n - 1));
    DeviceBuffer params(*cpu.device, n * sizeof(float)), grads(*cpu.device, n * sizeof(float));
    float* w = params.as<float>();
    float* g = grads.as<float>();
    for (std::int64_t i = 0; i < n; ++i) w[i] = 0.0f;
    auto loss = [&] {
        double l = 0.0;
        for (std::int64_t i = 0; i < n; ++i) l += 0.5 * a[i] * (w[i] - c[i]) * (w[i] - c[i]);
        return l;
    };
    AdamWConfig config;
    config.schedule = {0.05f, 1e-4f, 20, 600};
    AdamW opt(*cpu.device, params.data(), DType::kF32, n, config, *cpu.stream);
    cpu.stream->synchronize();
    const double initial = loss();
    for (int t = 0; t < 600; ++t) {
        for (std::int64_t i = 0; i < n; ++i) g[i] = a[i] * (w[i] - c[i]);
        const float scale = clip_scale(global_grad_norm({{g, n}}, *cpu.device, *cpu.stream), 10.0f);
        opt.step(g, scale, *cpu.stream);
        cpu.stream->synchronize();
    }
    const double final_loss = loss();
    EXPECT_LT(final_loss, initial * 1e-4) << "initial " << initial << " final " << final_loss;
}

}  // namespace
}  // namespace scmoe::models
