// Backbone ops on the CPU backend: RMSNorm and causal multi-head attention against hand-computed
// cases, a double-precision reference written from the equations, finite differences of the ops'
// own forward (with a known-wrong gradient that the same check must reject), causality, exact
// accumulation, bitwise determinism (also with another stream busy) and argument checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "scmoe/kernels/attention.h"
#include "scmoe/kernels/device.h"
#include "scmoe/kernels/error.h"
#include "scmoe/kernels/rmsnorm.h"
#include "test_util.h"

namespace scmoe {
namespace {

using F = std::vector<float>;
using testing::bitwise_equal;
using testing::dot;
using testing::finite_differences;
using testing::worst_violation;
using testing::Cpu;
using testing::random_floats;
using testing::sz;

// ---- RMSNorm -----------------------------------------------------------------------------------

struct Norm {
    std::int64_t tokens, hidden;
    float eps;
    F forward(Cpu& c, const F& x, const F& w, F* rstd = nullptr) const {
        F y(x.size());
        if (rstd) rstd->assign(sz(tokens), 0.0f);
        rmsnorm_forward({tokens, hidden, eps, DType::kF32, x.data(), w.data(), y.data(), rstd ? rstd->data() : nullptr},
                        *c.stream);
        c.stream->synchronize();
        return y;
    }
    void backward(Cpu& c, const F& x, const F& w, const F& rstd, const F& gy, F& gx, F& gw, bool accumulate) const {
        rmsnorm_backward({tokens, hidden, eps, DType::kF32, x.data(), w.data(), rstd.data(), gy.data(), gx.data(),
                          accumulate, gw.data()},
                         *c.stream);
        c.stream->synchronize();
    }
};

TEST(BackboneRmsNorm, KnownRows) {
    Cpu c;
    // Row 0: mean(x^2) = 4, rstd = 1/2. Row 1: mean(x^2) = 25/4, rstd = 2/5.
    const F x = {2, -2, 2, -2, 3, 4, 0, 0}, w = {1, 2, 3, 4};
    F rstd;
    const F y = Norm{2, 4, 0.0f}.forward(c, x, w, &rstd);
    const F want = {1, -2, 3, -4, 1.2f, 3.2f, 0, 0};
    for (std::size_t i = 0; i < want.size(); ++i) EXPECT_FLOAT_EQ(y[i], want[i]) << i;
    EXPECT_FLOAT_EQ(rstd[0], 0.5f);
    EXPECT_FLOAT_EQ(rstd[1], 0.4f);
    // eps joins the mean: mean(x^2) = 1, eps = 0.25 -> rstd = 1/sqrt(1.25).
    const F ones = {1, -1, 1, -1};
    F rstd_eps;
    const F y_eps = Norm{1, 4, 0.25f}.forward(c, ones, F(4, 1.0f), &rstd_eps);
    EXPECT_FLOAT_EQ(rstd_eps[0], 1.0f / std::sqrt(1.25f));
    EXPECT_FLOAT_EQ(y_eps[1], -1.0f / std::sqrt(1.25f));
}

TEST(BackboneRmsNorm, InPlaceForwardAndNullRstd) {
    Cpu c;
    const Norm n{5, 7, 1e-5f};
    const F x = random_floats(35, 1), w = random_floats(7, 2);
    const F want = n.forward(c, x, w);
    F inplace = x;
    rmsnorm_forward({n.tokens, n.hidden, n.eps, DType::kF32, inplace.data(), w.data(), inplace.data(), nullptr},
                    *c.stream);
    c.stream->synchronize();
    EXPECT_TRUE(bitwise_equal(inplace, want));
}

TEST(BackboneRmsNorm, GradientsMatchFiniteDifferences) {
    Cpu c;
    const Norm n{3, 8, 1e-2f};
    F x = random_floats(24, 3), w = random_floats(8, 4, 2.0f);
    const F gy = random_floats(24, 5);
    F rstd, gx(24), gw(8);
    n.forward(c, x, w, &rstd);
    n.backward(c, x, w, rstd, gy, gx, gw, false);
    auto loss = [&] { return dot(gy, n.forward(c, x, w)); };
    const std::vector<double> fd_x = finite_differences(x, 1e-3f, loss);
    const std::vector<double> fd_w = finite_differences(w, 1e-3f, loss);
    constexpr double kAtol = 1e-3, kRtol = 1e-2;
    EXPECT_LT(worst_violation(gx, fd_x, kAtol, kRtol), 1.0) << "grad_x";
    EXPECT_LT(worst_violation(gw, fd_w, kAtol, kRtol), 1.0) << "grad_weight";
    // The same check rejects a plausible wrong gradient: dropping the term through rstd.
    F wrong(24);
    for (std::int64_t i = 0; i < 24; ++i) wrong[sz(i)] = gy[sz(i)] * w[sz(i % 8)] * rstd[sz(i / 8)];
    EXPECT_GT(worst_violation(wrong, fd_x, kAtol, kRtol), 1.0) << "a grad_x without the rstd term must fail";
    F wrong_w = gw;
    for (float& v : wrong_w) v *= 1.05f;
    EXPECT_GT(worst_violation(wrong_w, fd_w, kAtol, kRtol), 1.0) << "grad_weight 5% off must fail";
}

TEST(BackboneRmsNorm, AccumulateAddsExactlyAndGradWeightIsOverwritten) {
    Cpu c;
    const Norm n{6, 10, 1e-5f};
    const F x = random_floats(60, 6), w = random_floats(10, 7), gy = random_floats(60, 8), base = random_floats(60, 9);
    F rstd, fresh(60, std::numeric_limits<float>::quiet_NaN()), gw(10, 123.0f);
    n.forward(c, x, w, &rstd);
    n.backward(c, x, w, rstd, gy, fresh, gw, false);
    const F gw_first = gw;
    F acc = base;
    n.backward(c, x, w, rstd, gy, acc, gw, true);
    for (std::size_t i = 0; i < acc.size(); ++i) ASSERT_EQ(acc[i], base[i] + fresh[i]) << i;
    EXPECT_TRUE(bitwise_equal(gw, gw_first)) << "grad_weight must be overwritten, never accumulated";
}

// ---- Attention ---------------------------------------------------------------------------------

struct Attn {
    std::int64_t batch, seq, heads, head_dim;
    std::int64_t hd() const { return heads * head_dim; }
    std::int64_t rows() const { return batch * seq; }
    std::int64_t qkv_size() const { return rows() * 3 * hd(); }
    std::int64_t out_size() const { return rows() * hd(); }

    void forward(Stream& s, const F& qkv, F& out, F& lse) const {
        out.assign(sz(out_size()), 0.0f);
        lse.assign(sz(batch * heads * seq), 0.0f);
        attention_forward({batch, seq, heads, head_dim, DType::kF32, qkv.data(), out.data(), lse.data()}, s);
    }
    void backward(Stream& s, const F& qkv, const F& out, const F& lse, const F& go, F& gqkv) const {
        gqkv.assign(sz(qkv_size()), std::numeric_limits<float>::quiet_NaN());  // must be overwritten
        attention_backward(
            {batch, seq, heads, head_dim, DType::kF32, qkv.data(), out.data(), lse.data(), go.data(), gqkv.data()}, s);
    }
    F out_only(Cpu& c, const F& qkv) const {
        F out, lse;
        forward(*c.stream, qkv, out, lse);
        c.stream->synchronize();
        return out;
    }
    // Element d of q (part 0), k (1) or v (2) of head h at token t.
    std::size_t at(std::int64_t t, int part, std::int64_t h, std::int64_t d) const {
        return sz(t * 3 * hd() + part * hd() + h * head_dim + d);
    }
};

// Double-precision reference from the equations. drop_delta: the classic bug dS = P * dP (no D_i).
void reference(const Attn& a, const F& qkv, const F& go, F& out, F& lse, F& gqkv, bool drop_delta = false) {
    lse.assign(sz(a.batch * a.heads * a.seq), 0.0f);
    std::vector<double> o_acc(sz(a.out_size()), 0.0), g(sz(a.qkv_size()), 0.0);
    const double scale = 1.0 / std::sqrt(static_cast<double>(a.head_dim));
    for (std::int64_t b = 0; b < a.batch; ++b) {
        for (std::int64_t h = 0; h < a.heads; ++h) {
            for (std::int64_t i = 0; i < a.seq; ++i) {
                const std::int64_t ti = b * a.seq + i;
                std::vector<double> s(sz(i + 1)), dp(sz(i + 1));
                double mx = -INFINITY, sum = 0.0, delta = 0.0;
                for (std::int64_t j = 0; j <= i; ++j) {
                    double qk = 0.0, gv = 0.0;
                    for (std::int64_t d = 0; d < a.head_dim; ++d) {
                        qk += static_cast<double>(qkv[a.at(ti, 0, h, d)]) * qkv[a.at(b * a.seq + j, 1, h, d)];
                        gv += static_cast<double>(go[sz(ti * a.hd() + h * a.head_dim + d)]) *
                              qkv[a.at(b * a.seq + j, 2, h, d)];
                    }
                    s[sz(j)] = qk * scale;
                    dp[sz(j)] = gv;
                    mx = std::max(mx, s[sz(j)]);
                }
                for (double& v : s) sum += (v = std::exp(v - mx));
                for (std::int64_t j = 0; j <= i; ++j) delta += (s[sz(j)] /= sum) * dp[sz(j)];
                lse[sz((b * a.heads + h) * a.seq + i)] = static_cast<float>(mx + std::log(sum));
                for (std::int64_t j = 0; j <= i; ++j) {
                    const double p = s[sz(j)], ds = p * (dp[sz(j)] - (drop_delta ? 0.0 : delta)) * scale;
                    const std::int64_t tj = b * a.seq + j;
                    for (std::int64_t d = 0; d < a.head_dim; ++d) {
                        const std::size_t o = sz(ti * a.hd() + h * a.head_dim + d);
                        o_acc[o] += p * qkv[a.at(tj, 2, h, d)];
                        g[a.at(ti, 0, h, d)] += ds * qkv[a.at(tj, 1, h, d)];
                        g[a.at(tj, 1, h, d)] += ds * qkv[a.at(ti, 0, h, d)];
                        g[a.at(tj, 2, h, d)] += p * go[o];
                    }
                }
            }
        }
    }
    out.assign(o_acc.begin(), o_acc.end());
    gqkv.assign(g.begin(), g.end());
}

void expect_near_all(const F& got, const F& want, float tol, const char* what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    for (std::size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], tol) << what << " element " << i;
}

TEST(BackboneAttention, SingleTokenReturnsV) {
    Cpu c;
    const Attn a{2, 1, 2, 3};
    const F qkv = random_floats(a.qkv_size(), 10);
    F out, lse;
    a.forward(*c.stream, qkv, out, lse);
    c.stream->synchronize();
    for (std::int64_t t = 0; t < 2; ++t) {
        for (std::int64_t h = 0; h < 2; ++h) {
            double qk = 0.0;
            for (std::int64_t d = 0; d < 3; ++d) {
                EXPECT_EQ(out[sz(t * a.hd() + h * 3 + d)], qkv[a.at(t, 2, h, d)]);
                qk += static_cast<double>(qkv[a.at(t, 0, h, d)]) * qkv[a.at(t, 1, h, d)];
            }
            EXPECT_NEAR(lse[sz(t * 2 + h)], qk / std::sqrt(3.0), 1e-6);
        }
    }
}

TEST(BackboneAttention, TwoTokensByHand) {
    // head_dim 2, scale 1/sqrt(2). Query 1 scores: k0 = 0 -> 0; q1 . k1 * scale = ln 3 -> p = (1/4, 3/4).
    Cpu c;
    const Attn a{1, 2, 1, 2};
    const float q1 = static_cast<float>(std::log(3.0) * std::sqrt(2.0));
    //           q0        k0        v0        q1         k1        v1
    const F qkv = {5, -7, 0, 0, 4, 8, q1, 0, 1, 0, 8, 0};
    F out, lse;
    a.forward(*c.stream, qkv, out, lse);
    c.stream->synchronize();
    const F want = {4, 8, 0.25f * 4 + 0.75f * 8, 0.25f * 8};
    expect_near_all(out, want, 1e-5f, "out");
    EXPECT_NEAR(lse[0], 0.0f, 1e-6f);  // one key with score 0
    EXPECT_NEAR(lse[1], std::log(4.0f), 1e-5f);
}

TEST(BackboneAttention, MatchesDoubleReferenceAcrossRowBlocks) {
    Cpu c;
    const Attn a{2, 70, 3, 5};  // seq 70 spans two 64-row blocks of the CPU implementation
    const F qkv = random_floats(a.qkv_size(), 11, 1.5f), go = random_floats(a.out_size(), 12);
    F out, lse, gqkv, want_out, want_lse, want_g;
    a.forward(*c.stream, qkv, out, lse);
    a.backward(*c.stream, qkv, out, lse, go, gqkv);
    c.stream->synchronize();
    reference(a, qkv, go, want_out, want_lse, want_g);
    expect_near_all(out, want_out, 1e-5f, "out");
    expect_near_all(lse, want_lse, 1e-5f, "lse");
    expect_near_all(gqkv, want_g, 1e-4f, "grad_qkv");
}

TEST(BackboneAttention, GradientsMatchFiniteDifferences) {
    Cpu c;
    const Attn a{2, 4, 2, 3};
    F qkv = random_floats(a.qkv_size(), 13, 1.5f);
    const F go = random_floats(a.out_size(), 14);
    F out, lse, gqkv;
    a.forward(*c.stream, qkv, out, lse);
    a.backward(*c.stream, qkv, out, lse, go, gqkv);
    c.stream->synchronize();
    const std::vector<double> fd = finite_differences(qkv, 1e-3f, [&] { return dot(go, a.out_only(c, qkv)); });
    constexpr double kAtol = 1e-3, kRtol = 1e-2;
    EXPECT_LT(worst_violation(gqkv, fd, kAtol, kRtol), 1.0) << "grad of q, k and v";
    // The check is sharp enough to reject dS = P * dP (D_i forgotten) and a 5% error.
    F unused_out, unused_lse, wrong;
    reference(a, qkv, go, unused_out, unused_lse, wrong, /*drop_delta=*/true);
    EXPECT_GT(worst_violation(wrong, fd, kAtol, kRtol), 1.0) << "dS without D_i must fail";
    F scaled = gqkv;
    for (float& v : scaled) v *= 1.05f;
    EXPECT_GT(worst_violation(scaled, fd, kAtol, kRtol), 1.0) << "a 5% error must fail";
}

TEST(BackboneAttention, IsCausalAndSequencesAreIndependent) {
    Cpu c;
    const Attn a{2, 9, 2, 4};
    const F qkv = random_floats(a.qkv_size(), 15);
    F out, lse;
    a.forward(*c.stream, qkv, out, lse);
    c.stream->synchronize();
    for (std::int64_t i = 0; i < a.seq; ++i) {
        // Change every token after position i of sequence 0 and every token of sequence 1.
        F changed = qkv;
        for (std::int64_t t = 0; t < a.rows(); ++t) {
            if (t > i) {
                for (std::int64_t e = 0; e < 3 * a.hd(); ++e) changed[sz(t * 3 * a.hd() + e)] += 0.5f;
            }
        }
        F out2, lse2;
        a.forward(*c.stream, changed, out2, lse2);
        c.stream->synchronize();
        for (std::int64_t t = 0; t <= i; ++t) {
            for (std::int64_t e = 0; e < a.hd(); ++e) {
                ASSERT_EQ(out2[sz(t * a.hd() + e)], out[sz(t * a.hd() + e)]) << "i=" << i << " t=" << t;
            }
        }
        for (std::int64_t h = 0; h < a.heads; ++h) {
            for (std::int64_t t = 0; t <= i; ++t) ASSERT_EQ(lse2[sz(h * a.seq + t)], lse[sz(h * a.seq + t)]);
        }
        if (i + 1 < a.seq) {
            EXPECT_NE(out2[sz((i + 1) * a.hd())], out[sz((i + 1) * a.hd())]) << "the change is seen";
        }
    }
    // And sequence 1 does not see sequence 0.
    F changed = qkv;
    for (std::int64_t e = 0; e < a.seq * 3 * a.hd(); ++e) changed[sz(e)] -= 0.25f;
    F out2, lse2;
    a.forward(*c.stream, changed, out2, lse2);
    c.stream->synchronize();
    EXPECT_TRUE(
        bitwise_equal(F(out2.begin() + a.seq * a.hd(), out2.end()), F(out.begin() + a.seq * a.hd(), out.end())));
}

TEST(BackboneDeterminism, BitwiseAcrossRunsAndWithAnotherStreamBusy) {
    Cpu c;
    const Attn a{4, 130, 2, 16};
    const Norm n{a.rows(), 32, 1e-5f};
    const F qkv = random_floats(a.qkv_size(), 16), go = random_floats(a.out_size(), 17);
    const F x = random_floats(n.tokens * n.hidden, 18), w = random_floats(n.hidden, 19),
            gy = random_floats(n.tokens * n.hidden, 20);
    auto run_all = [&](F& out, F& lse, F& gqkv, F& y, F& gx, F& gw) {
        a.forward(*c.stream, qkv, out, lse);
        a.backward(*c.stream, qkv, out, lse, go, gqkv);
        F rstd;
        y = n.forward(c, x, w, &rstd);
        gx.assign(x.size(), 0.0f);
        gw.assign(sz(n.hidden), 0.0f);
        n.backward(c, x, w, rstd, gy, gx, gw, false);
    };
    F r1[6], r2[6], r3[6];
    run_all(r1[0], r1[1], r1[2], r1[3], r1[4], r1[5]);
    run_all(r2[0], r2[1], r2[2], r2[3], r2[4], r2[5]);
    // A second stream runs the same ops on other data concurrently.
    auto other = c.device->create_stream();
    const Attn big{8, 256, 4, 32};
    const F big_qkv = random_floats(big.qkv_size(), 21), big_go = random_floats(big.out_size(), 22);
    F big_out, big_lse, big_g;
    big.forward(*other, big_qkv, big_out, big_lse);
    big.backward(*other, big_qkv, big_out, big_lse, big_go, big_g);
    run_all(r3[0], r3[1], r3[2], r3[3], r3[4], r3[5]);
    other->synchronize();
    for (int k = 0; k < 6; ++k) {
        EXPECT_TRUE(bitwise_equal(r1[k], r2[k])) << "result " << k << " differs between runs";
        EXPECT_TRUE(bitwise_equal(r1[k], r3[k])) << "result " << k << " differs with another stream busy";
    }
}

TEST(BackboneArgs, InvalidArgumentsThrowAtTheCall) {
    Cpu c;
    F buf(64), rstd(4);
    const void* p = buf.data();
    void* m = buf.data();
    EXPECT_THROW(rmsnorm_forward({0, 4, 1e-5f, DType::kF32, p, p, m, nullptr}, *c.stream), Error);
    EXPECT_THROW(rmsnorm_forward({4, -1, 1e-5f, DType::kF32, p, p, m, nullptr}, *c.stream), Error);
    EXPECT_THROW(rmsnorm_forward({4, 4, -1.0f, DType::kF32, p, p, m, nullptr}, *c.stream), Error);
    EXPECT_THROW(rmsnorm_forward({4, 4, 1e-5f, DType::kF32, nullptr, p, m, nullptr}, *c.stream), Error);
    EXPECT_THROW(rmsnorm_forward({4, 4, 1e-5f, DType::kBF16, p, p, m, nullptr}, *c.stream), Error);
    F gx(16);
    EXPECT_THROW(rmsnorm_backward({4, 4, 1e-5f, DType::kF32, p, p, nullptr, p, gx.data(), false, nullptr}, *c.stream),
                 Error);
    EXPECT_THROW(rmsnorm_backward({4, 4, 1e-5f, DType::kF32, p, p, rstd.data(), p, m, false, nullptr}, *c.stream),
                 Error);  // grad_x aliases grad_y
    EXPECT_THROW(attention_forward({1, 0, 1, 4, DType::kF32, p, m, nullptr}, *c.stream), Error);
    EXPECT_THROW(attention_forward({1, 2, 0, 4, DType::kF32, p, m, nullptr}, *c.stream), Error);
    EXPECT_THROW(attention_forward({1, 2, 1, 4, DType::kF32, nullptr, m, nullptr}, *c.stream), Error);
    EXPECT_THROW(attention_forward({1, 2, 1, 4, DType::kBF16, p, m, nullptr}, *c.stream), Error);
    EXPECT_THROW(attention_backward({1, 2, 1, 4, DType::kF32, p, p, nullptr, p, gx.data()}, *c.stream), Error);
    EXPECT_THROW(attention_backward({1, 2, 1, 4, DType::kF32, p, p, rstd.data(), p, m}, *c.stream), Error);
    try {
        attention_forward({1, 2, -3, 4, DType::kF32, p, m, nullptr}, *c.stream);
        FAIL() << "expected an Error";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("heads=-3"), std::string::npos) << e.what();
    }
    c.stream->synchronize();  // nothing was enqueued, nothing fails later
}

}  // namespace
}  // namespace scmoe
