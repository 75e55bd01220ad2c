// CPU ops against naive loops written here: GEMM in every transpose, grouped GEMM of every kind
// over balanced, skewed and empty groups, activations against finite differences, permute /
// combine and their backward, bf16 conversion, and a whole MoE layer forward against a reference
// written from the equations in scmoe/moe/moe_layer.h.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "scmoe/kernels/activation.h"
#include "scmoe/kernels/elementwise.h"
#include "scmoe/kernels/gemm.h"
#include "scmoe/kernels/grouped_gemm.h"
#include "scmoe/kernels/math.h"
#include "test_util.h"

namespace scmoe {
namespace {

using F = std::vector<float>;
using testing::Cpu;
using testing::random_floats;

// C[m, n] = op(A) op(B), row-major, double accumulation.
F naive_gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, const F& a, const F& b) {
    F c(static_cast<std::size_t>(m * n));
    for (std::int64_t i = 0; i < m; ++i)
        for (std::int64_t j = 0; j < n; ++j) {
            double acc = 0;
            for (std::int64_t p = 0; p < k; ++p) {
                const float av = ta ? a[static_cast<std::size_t>(p * m + i)] : a[static_cast<std::size_t>(i * k + p)];
                const float bv = tb ? b[static_cast<std::size_t>(j * k + p)] : b[static_cast<std::size_t>(p * n + j)];
                acc += static_cast<double>(av) * bv;
            }
            c[static_cast<std::size_t>(i * n + j)] = static_cast<float>(acc);
        }
    return c;
}

void expect_close(const F& got, const F& want, float tol, const char* what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    for (std::size_t i = 0; i < got.size(); ++i)
        ASSERT_NEAR(got[i], want[i], tol * std::max(1.0f, std::abs(want[i]))) << what << " element " << i;
}

TEST(CpuGemm, AllTransposesAndBeta) {
    Cpu cpu;
    const std::int64_t m = 7, n = 5, k = 9;
    for (bool ta : {false, true})
        for (bool tb : {false, true}) {
            F a = random_floats(m * k, 1), b = random_floats(k * n, 2), c(static_cast<std::size_t>(m * n), 2.0f);
            gemm({ta, tb, m, n, k, 1.0f, 1.0f, a.data(), b.data(), c.data()}, *cpu.stream);
            cpu.stream->synchronize();
            F want = naive_gemm(ta, tb, m, n, k, a, b);
            for (float& w : want) w += 2.0f;
            expect_close(c, want, 1e-5f, "gemm");
        }
}

TEST(CpuGemm, ZeroInnerDimensionZeroesOutput) {
    Cpu cpu;
    F c(6, std::numeric_limits<float>::quiet_NaN());
    gemm({false, false, 2, 3, 0, 1.0f, 0.0f, nullptr, nullptr, c.data()}, *cpu.stream);
    cpu.stream->synchronize();
    EXPECT_EQ(c, F(6, 0.0f));
}

class CpuGroupedGemm : public ::testing::TestWithParam<std::vector<std::int32_t>> {};

TEST_P(CpuGroupedGemm, EveryKindMatchesPerGroupLoops) {
    Cpu cpu;
    const std::vector<std::int32_t> counts = GetParam();
    const int G = static_cast<int>(counts.size());
    std::vector<std::int32_t> offsets(counts.size() + 1, 0);
    for (int g = 0; g < G; ++g) offsets[static_cast<std::size_t>(g + 1)] = offsets[static_cast<std::size_t>(g)] + counts[static_cast<std::size_t>(g)];
    const std::int64_t rows = offsets.back(), k = 6, n = 10;
    const F a = random_floats(rows * k, 3), w = random_floats(G * k * n, 4), dy = random_floats(rows * n, 5);
    F y(static_cast<std::size_t>(rows * n)), dx(static_cast<std::size_t>(rows * k)),
        dw(static_cast<std::size_t>(G * k * n), std::numeric_limits<float>::quiet_NaN());
    GroupedGemmArgs args;
    args.num_groups = G;
    args.k = k;
    args.n = n;
    args.max_rows = rows;
    args.group_offsets = offsets.data();
    args.kind = GroupedGemmKind::kForward;
    args.a = a.data();
    args.b = w.data();
    args.c = y.data();
    grouped_gemm(args, *cpu.stream);
    args.kind = GroupedGemmKind::kGradInput;
    args.a = dy.data();
    args.c = dx.data();
    grouped_gemm(args, *cpu.stream);
    args.kind = GroupedGemmKind::kGradWeight;
    args.a = a.data();
    args.b = dy.data();
    args.c = dw.data();
    grouped_gemm(args, *cpu.stream);
    cpu.stream->synchronize();
    for (int g = 0; g < G; ++g) {
        const std::size_t r0 = static_cast<std::size_t>(offsets[static_cast<std::size_t>(g)]);
        const std::int64_t m = counts[static_cast<std::size_t>(g)];
        const F ag(a.begin() + static_cast<std::ptrdiff_t>(r0 * k), a.begin() + static_cast<std::ptrdiff_t>((r0 + static_cast<std::size_t>(m)) * k));
        const F dyg(dy.begin() + static_cast<std::ptrdiff_t>(r0 * n), dy.begin() + static_cast<std::ptrdiff_t>((r0 + static_cast<std::size_t>(m)) * n));
        const F wg(w.begin() + g * k * n, w.begin() + (g + 1) * k * n);
        expect_close(F(y.begin() + static_cast<std::ptrdiff_t>(r0 * n), y.begin() + static_cast<std::ptrdiff_t>((r0 + static_cast<std::size_t>(m)) * n)),
                     naive_gemm(false, false, m, n, k, ag, wg), 1e-5f, "forward");
        expect_close(F(dx.begin() + static_cast<std::ptrdiff_t>(r0 * k), dx.begin() + static_cast<std::ptrdiff_t>((r0 + static_cast<std::size_t>(m)) * k)),
                     naive_gemm(false, true, m, k, n, dyg, wg), 1e-5f, "grad input");
        expect_close(F(dw.begin() + g * k * n, dw.begin() + (g + 1) * k * n), naive_gemm(true, false, k, n, m, ag, dyg),
                     1e-5f, "grad weight (zeros for an empty group)");
    }
}

INSTANTIATE_TEST_SUITE_P(Loads, CpuGroupedGemm,
                         ::testing::Values(std::vector<std::int32_t>{4, 4, 4, 4},     // balanced
                                           std::vector<std::int32_t>{13, 1, 0, 2},    // skewed, one empty
                                           std::vector<std::int32_t>{0, 0, 16, 0},    // all to one expert
                                           std::vector<std::int32_t>{0, 0, 0}));      // no rows at all

TEST(CpuGroupedGemm, RejectsOffsetsPastMaxRows) {
    Cpu cpu;
    std::vector<std::int32_t> offsets = {0, 4, 9};
    F a(36), w(2 * 4 * 4), c(36);
    GroupedGemmArgs args{GroupedGemmKind::kForward, 2, 4, 4, 8, 0, offsets.data(), a.data(), w.data(), c.data()};
    grouped_gemm(args, *cpu.stream);
    EXPECT_THROW(cpu.stream->synchronize(), Error);
}

TEST(CpuActivation, BackwardMatchesFiniteDifferencesOfTheSharedMath) {
    Cpu cpu;
    for (Activation act : {Activation::kSwiGLU, Activation::kGeLU}) {
        const std::int64_t rows = 3, ffn = 4, width = activation_input_width(act, ffn);
        F h = random_floats(rows * width, 6), go = random_floats(rows * ffn, 7),
          out(static_cast<std::size_t>(rows * ffn)), gh(static_cast<std::size_t>(rows * width));
        activation_forward({act, rows, ffn, DType::kF32, h.data(), out.data()}, *cpu.stream);
        activation_backward({act, rows, ffn, DType::kF32, h.data(), go.data(), gh.data()}, *cpu.stream);
        cpu.stream->synchronize();
        for (std::int64_t i = 0; i < rows * width; ++i) {
            const std::int64_t r = i / width;
            auto loss = [&](float delta) {
                F hp = h;
                hp[static_cast<std::size_t>(i)] += delta;
                double l = 0;
                for (std::int64_t f = 0; f < ffn; ++f) {
                    const float* hr = hp.data() + r * width;
                    const float o = act == Activation::kSwiGLU ? math::swiglu(hr[f], hr[ffn + f]) : math::gelu(hr[f]);
                    l += static_cast<double>(o) * go[static_cast<std::size_t>(r * ffn + f)];
                }
                return l;
            };
            const double fd = (loss(1e-3f) - loss(-1e-3f)) / 2e-3;
            EXPECT_NEAR(gh[static_cast<std::size_t>(i)], fd, 2e-3) << activation_name(act) << " element " << i;
        }
        EXPECT_NEAR(out[0], act == Activation::kSwiGLU ? math::swiglu(h[0], h[4]) : math::gelu(h[0]), 0.0f);
    }
}

TEST(Bf16, RoundToNearestEvenAndNaN) {
    EXPECT_EQ(math::f32_to_bf16_bits(1.0f), 0x3f80);
    EXPECT_EQ(math::round_to_bf16(1.0f + 1.0f / 256), 1.0f);              // tie -> even (down)
    EXPECT_EQ(math::round_to_bf16(1.0f + 3.0f / 256), 1.0f + 4.0f / 256);  // tie -> even (up)
    EXPECT_TRUE(std::isnan(math::round_to_bf16(std::numeric_limits<float>::quiet_NaN())));
    EXPECT_EQ(math::round_to_bf16(std::numeric_limits<float>::infinity()), std::numeric_limits<float>::infinity());
    Cpu cpu;
    F src = {1.0f, -2.5f, 3.14159f}, back(3);
    std::vector<std::uint16_t> bits(3);
    convert(src.data(), DType::kF32, bits.data(), DType::kBF16, 3, *cpu.stream);
    convert(bits.data(), DType::kBF16, back.data(), DType::kF32, 3, *cpu.stream);
    cpu.stream->synchronize();
    EXPECT_EQ(back, (F{1.0f, -2.5f, math::round_to_bf16(3.14159f)}));
}

TEST(CpuCountNonfinite, CountsAndLocates) {
    Cpu cpu;
    F v = {0.0f, 1.0f, std::numeric_limits<float>::infinity(), 2.0f, -std::numeric_limits<float>::quiet_NaN()};
    std::int64_t count = -1, first = -1;
    count_nonfinite(v.data(), 5, DType::kF32, &count, &first, *cpu.stream);
    cpu.stream->synchronize();
    EXPECT_EQ(count, 2);
    EXPECT_EQ(first, 2);
}

// ---- The whole layer against the equations, written out with plain loops ----------------------

double softmax_prob(const F& logits, std::size_t row, int E, int e) {
    double mx = -1e30, sum = 0;
    for (int j = 0; j < E; ++j) mx = std::max(mx, static_cast<double>(logits[row * E + static_cast<std::size_t>(j)]));
    for (int j = 0; j < E; ++j) sum += std::exp(logits[row * E + static_cast<std::size_t>(j)] - mx);
    return std::exp(logits[row * E + static_cast<std::size_t>(e)] - mx) / sum;
}

// One dense FFN on one token: act(x W1) W2, W1 [H, I], W2 [F, H].
std::vector<double> ffn_ref(const float* x, const float* w1, const float* w2, std::int64_t H, std::int64_t Fw,
                            Activation act) {
    const std::int64_t I = activation_input_width(act, Fw);
    std::vector<double> h(static_cast<std::size_t>(I), 0.0), out(static_cast<std::size_t>(H), 0.0);
    for (std::int64_t i = 0; i < I; ++i)
        for (std::int64_t k = 0; k < H; ++k) h[static_cast<std::size_t>(i)] += static_cast<double>(x[k]) * w1[k * I + i];
    for (std::int64_t f = 0; f < Fw; ++f) {
        const float a = act == Activation::kSwiGLU
                            ? math::swiglu(static_cast<float>(h[static_cast<std::size_t>(f)]),
                                           static_cast<float>(h[static_cast<std::size_t>(Fw + f)]))
                            : math::gelu(static_cast<float>(h[static_cast<std::size_t>(f)]));
        for (std::int64_t k = 0; k < H; ++k) out[static_cast<std::size_t>(k)] += static_cast<double>(a) * w2[f * H + k];
    }
    return out;
}

TEST(CpuMoeLayer, ForwardMatchesTheEquations) {
    MoeConfig c;
    c.hidden = 6;
    c.ffn = 5;
    c.num_experts = 3;
    c.top_k = 2;
    c.dispatch = DispatchMode::kDropless;
    c.shared_expert = true;
    c.shared_ffn = 4;
    c.coefficient_gate = true;
    const std::int64_t T = 9, H = c.hidden, E = c.num_experts, I = c.expert_inner_width();
    testing::CpuLayerHarness h(c, T, true, 11);
    h.forward();
    const MoeParams p = h.params.view();
    const F gate(p.gate_w.as<float>(), p.gate_w.as<float>() + H * E);
    for (std::int64_t t = 0; t < T; ++t) {
        const float* s = h.s.data() + t * H;
        const float* x = h.x.data() + t * H;
        F logits(static_cast<std::size_t>(E));
        for (std::int64_t e = 0; e < E; ++e) {
            double l = 0;
            for (std::int64_t k = 0; k < H; ++k) l += static_cast<double>(s[k]) * gate[static_cast<std::size_t>(k * E + e)];
            logits[static_cast<std::size_t>(e)] = static_cast<float>(l);
        }
        std::vector<int> order = {0, 1, 2};
        std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
            return softmax_prob(logits, 0, 3, a) > softmax_prob(logits, 0, 3, b);
        });
        const double p0 = softmax_prob(logits, 0, 3, order[0]), p1 = softmax_prob(logits, 0, 3, order[1]);
        std::vector<double> y(static_cast<std::size_t>(H), 0.0);
        for (int j = 0; j < 2; ++j) {
            const int e = order[static_cast<std::size_t>(j)];
            const double w = (j == 0 ? p0 : p1) / (p0 + p1);
            auto out = ffn_ref(s, p.expert_w1.as<float>() + e * H * I, p.expert_w2.as<float>() + e * c.ffn * H, H,
                               c.ffn, c.activation);
            for (std::int64_t k = 0; k < H; ++k) y[static_cast<std::size_t>(k)] += w * out[static_cast<std::size_t>(k)];
        }
        double cg = 0;
        for (std::int64_t k = 0; k < H; ++k) cg += static_cast<double>(x[k]) * p.cg_w.as<float>()[k];
        const double coef = 1.0 / (1.0 + std::exp(-cg));
        auto se = ffn_ref(x, p.shared_w1.as<float>(), p.shared_w2.as<float>(), H, 4, c.activation);
        for (std::int64_t k = 0; k < H; ++k) {
            const double want = y[static_cast<std::size_t>(k)] + coef * se[static_cast<std::size_t>(k)];
            EXPECT_NEAR(h.y[static_cast<std::size_t>(t * H + k)], want, 1e-4 * std::max(1.0, std::abs(want)))
                << "token " << t << " column " << k;
        }
    }
}

TEST(CpuMoeLayer, ForwardAndBackwardAreBitwiseRepeatable) {
    MoeConfig c;
    c.hidden = 16;
    c.ffn = 24;
    c.num_experts = 4;
    c.top_k = 2;
    c.shared_expert = true;
    c.coefficient_gate = true;
    testing::CpuLayerHarness h(c, 32, true, 5);
    h.forward();
    h.backward();
    const F y1 = h.y, gx1 = h.grad_x, gs1 = h.grad_s;
    const F g1(static_cast<float*>(h.grads.data()), static_cast<float*>(h.grads.data()) + h.grads.numel());
    std::fill(h.y.begin(), h.y.end(), 0.0f);
    h.forward();
    h.backward();
    EXPECT_EQ(h.y, y1);
    EXPECT_EQ(h.grad_x, gx1);
    EXPECT_EQ(h.grad_s, gs1);
    EXPECT_EQ(F(static_cast<float*>(h.grads.data()), static_cast<float*>(h.grads.data()) + h.grads.numel()), g1);
}

}  // namespace
}  // namespace scmoe
