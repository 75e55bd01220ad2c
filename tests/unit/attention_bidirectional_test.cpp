// Bidirectional (non-causal) attention on the CPU backend, f32 (AttentionArgs::causal = false): the
// forward and backward against a double-precision reference written from the equations (GQA and
// MQA shapes, seq not a multiple of the kernel's 64-row blocks), the gradients against finite
// differences (sharp enough to reject the causal gradient), every query seeing every key of its own
// sequence and none of another, causal staying the default, the cost model's FLOPs (twice the causal
// count), and the attention sublayer's BackboneShape::causal reaching the op.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "scmoe/kernels/attention.h"
#include "scmoe/kernels/device.h"
#include "scmoe/moe/backbone.h"
#include "scmoe/moe/params.h"
#include "attention_shape.h"
#include "test_util.h"

namespace scmoe {
namespace {

using F = std::vector<float>;
using testing::bitwise_equal;
using testing::Cpu;
using testing::random_floats;
using testing::sz;

using Shape = testing::AttentionShape;

// The equations in double precision, straightforward loops: query i of (b, h) sees keys j of its
// sequence with j <= i when causal, every j otherwise; query head h reads K/V head h / group.
//   s_ij = scale q_i . k_j, P = softmax_j(s), o_i = sum_j P_ij v_j, lse_i = log sum_j exp(s_ij)
//   dP_ij = dO_i . v_j, D_i = sum_j P_ij dP_ij, dS_ij = P_ij (dP_ij - D_i)
//   dq_i = scale sum_j dS_ij k_j, dk_j += scale dS_ij q_i, dv_j += P_ij dO_i
void reference(const Shape& a, const F& qkv, const F& go, bool causal, F& out, F& lse, F& gqkv) {
    std::vector<double> o(sz(a.out_size()), 0.0), l(sz(a.batch * a.heads * a.seq), 0.0), g(sz(a.qkv_size()), 0.0);
    const double scale = 1.0 / std::sqrt(static_cast<double>(a.head_dim));
    for (std::int64_t b = 0; b < a.batch; ++b) {
        for (std::int64_t h = 0; h < a.heads; ++h) {
            const std::int64_t kvh = h / a.group();
            for (std::int64_t i = 0; i < a.seq; ++i) {
                const std::int64_t ti = b * a.seq + i, keys = causal ? i + 1 : a.seq;
                std::vector<double> p(sz(keys)), dp(sz(keys));
                double mx = -INFINITY;
                for (std::int64_t j = 0; j < keys; ++j) {
                    const std::int64_t tj = b * a.seq + j;
                    double qk = 0.0, gv = 0.0;
                    for (std::int64_t d = 0; d < a.head_dim; ++d) {
                        qk += static_cast<double>(qkv[a.at(ti, 0, h, d)]) * qkv[a.at(tj, 1, kvh, d)];
                        gv += static_cast<double>(go[a.out_at(ti, h, d)]) * qkv[a.at(tj, 2, kvh, d)];
                    }
                    p[sz(j)] = qk * scale;
                    dp[sz(j)] = gv;
                    mx = std::max(mx, p[sz(j)]);
                }
                double sum = 0.0;
                for (double& v : p) sum += (v = std::exp(v - mx));
                double delta = 0.0;
                for (std::int64_t j = 0; j < keys; ++j) delta += (p[sz(j)] /= sum) * dp[sz(j)];
                l[sz((b * a.heads + h) * a.seq + i)] = mx + std::log(sum);
                for (std::int64_t j = 0; j < keys; ++j) {
                    const std::int64_t tj = b * a.seq + j;
                    const double pj = p[sz(j)], ds = pj * (dp[sz(j)] - delta) * scale;
                    for (std::int64_t d = 0; d < a.head_dim; ++d) {
                        o[a.out_at(ti, h, d)] += pj * qkv[a.at(tj, 2, kvh, d)];
                        g[a.at(ti, 0, h, d)] += ds * qkv[a.at(tj, 1, kvh, d)];
                        g[a.at(tj, 1, kvh, d)] += ds * qkv[a.at(ti, 0, h, d)];
                        g[a.at(tj, 2, kvh, d)] += pj * go[a.out_at(ti, h, d)];
                    }
                }
            }
        }
    }
    out.assign(o.begin(), o.end());
    lse.assign(l.begin(), l.end());
    gqkv.assign(g.begin(), g.end());
}

float max_abs_diff(const F& a, const F& b) {
    float m = 0.0f;
    for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
    return m;
}

// GQA (groups of 3), MQA, MHA; seq 70 and 130 span two and three 64-row blocks of the CPU kernel and
// are multiples of no tile; seq 1 is a single key.
const Shape kShapes[] = {{2, 70, 6, 2, 5}, {1, 9, 4, 1, 8}, {2, 33, 3, 3, 4}, {1, 130, 2, 1, 16}, {3, 1, 2, 2, 4}};

TEST(AttentionBidirectional, ForwardAndBackwardMatchTheDoubleReference) {
    Cpu c;
    for (const Shape& a : kShapes) {
        SCOPED_TRACE(a.name());
        const F qkv = random_floats(a.qkv_size(), 51, 1.5f), go = random_floats(a.out_size(), 52);
        for (const bool causal : {false, true}) {
            SCOPED_TRACE(causal ? "causal" : "bidirectional");
            F out, lse, grad, want_out, want_lse, want_grad;
            a.forward(*c.stream, qkv, out, lse, causal);
            a.backward(*c.stream, qkv, out, lse, go, grad, causal);
            c.stream->synchronize();
            reference(a, qkv, go, causal, want_out, want_lse, want_grad);
            testing::expect_close(out, want_out, 1e-5f, "out");
            testing::expect_close(lse, want_lse, 1e-5f, "lse");
            testing::expect_close(grad, want_grad, 1e-4f, "grad_qkv");
        }
        // Not vacuous: with more than one key the two modes differ.
        if (a.seq > 1) {
            F causal_out, bidir_out, want_lse, want_grad;
            reference(a, qkv, go, true, causal_out, want_lse, want_grad);
            reference(a, qkv, go, false, bidir_out, want_lse, want_grad);
            EXPECT_GT(max_abs_diff(causal_out, bidir_out), 1e-2f);
        }
    }
}

TEST(AttentionBidirectional, GradientsMatchFiniteDifferences) {
    Cpu c;
    for (const Shape& a : {Shape{2, 5, 4, 2, 3}, Shape{1, 6, 3, 1, 4}, Shape{1, 4, 2, 2, 3}}) {
        SCOPED_TRACE(a.name());
        F qkv = random_floats(a.qkv_size(), 53, 1.5f);
        const F go = random_floats(a.out_size(), 54);
        F out, lse, grad;
        a.forward(*c.stream, qkv, out, lse, false);
        a.backward(*c.stream, qkv, out, lse, go, grad, false);
        c.stream->synchronize();
        const testing::AttentionGradCheck check =
            testing::attention_grad_check(qkv, go, [&] { return a.out_only(c, qkv, false); });
        EXPECT_LT(check.worst(grad), 1.0) << "grad of q, k and v";
        // The same check rejects the causal op's gradient (the mask left in the backward).
        F cout, clse, cgrad;
        a.forward(*c.stream, qkv, cout, clse, true);
        a.backward(*c.stream, qkv, cout, clse, go, cgrad, true);
        c.stream->synchronize();
        EXPECT_GT(check.worst(cgrad), 1.0) << "the causal gradient must fail";
    }
}

TEST(AttentionBidirectional, EveryQuerySeesEveryKeyOfItsOwnSequenceOnly) {
    Cpu c;
    const Shape a{2, 9, 2, 1, 4};
    const F qkv = random_floats(a.qkv_size(), 55);
    F out, lse;
    a.forward(*c.stream, qkv, out, lse, false);
    c.stream->synchronize();
    // Change the last token of sequence 0: every query of sequence 0 (the first one included) sees
    // it, sequence 1 does not.
    F changed = qkv;
    for (std::int64_t e = 0; e < a.width(); ++e) changed[sz((a.seq - 1) * a.width() + e)] += 0.5f;
    F out2, lse2;
    a.forward(*c.stream, changed, out2, lse2, false);
    c.stream->synchronize();
    const std::int64_t hd = a.heads * a.head_dim;
    for (std::int64_t i = 0; i < a.seq; ++i) {
        float diff = 0.0f;
        for (std::int64_t e = 0; e < hd; ++e)
            diff = std::max(diff, std::abs(out2[sz(i * hd + e)] - out[sz(i * hd + e)]));
        EXPECT_GT(diff, 0.0f) << "query " << i << " of sequence 0 must see the last key";
    }
    for (std::int64_t t = a.seq; t < a.rows(); ++t)
        for (std::int64_t e = 0; e < hd; ++e)
            ASSERT_EQ(out2[sz(t * hd + e)], out[sz(t * hd + e)]) << "sequence 1, token " << t;
    for (std::int64_t h = 0; h < a.heads; ++h)
        for (std::int64_t i = 0; i < a.seq; ++i)
            ASSERT_EQ(lse2[sz((a.heads + h) * a.seq + i)], lse[sz((a.heads + h) * a.seq + i)]);
}

TEST(AttentionBidirectional, CausalIsTheDefaultAndUnchanged) {
    EXPECT_TRUE(AttentionArgs{}.causal);
    EXPECT_TRUE(AttentionBackwardArgs{}.causal);
    EXPECT_TRUE(BackboneShape{}.causal);
    Cpu c;
    const Shape a{2, 70, 6, 2, 5};
    const F qkv = random_floats(a.qkv_size(), 56, 1.5f), go = random_floats(a.out_size(), 57);
    // Args without the field (as every caller before it wrote them) against causal = true set.
    F out(sz(a.out_size())), lse(sz(a.batch * a.heads * a.seq)), grad(sz(a.qkv_size()));
    attention_forward(
        {a.batch, a.seq, a.heads, a.head_dim, DType::kF32, qkv.data(), out.data(), lse.data(), a.kv_heads}, *c.stream);
    attention_backward({a.batch, a.seq, a.heads, a.head_dim, DType::kF32, qkv.data(), out.data(), lse.data(), go.data(),
                        grad.data(), a.kv_heads},
                       *c.stream);
    F cout, clse, cgrad;
    a.forward(*c.stream, qkv, cout, clse, true);
    a.backward(*c.stream, qkv, cout, clse, go, cgrad, true);
    c.stream->synchronize();
    EXPECT_TRUE(bitwise_equal(out, cout));
    EXPECT_TRUE(bitwise_equal(lse, clse));
    EXPECT_TRUE(bitwise_equal(grad, cgrad));
}

TEST(AttentionBidirectional, CostCountsTheFullSquare) {
    const std::int64_t B = 2, S = 144, H = 12, D = 32;
    for (const std::int64_t kv : {std::int64_t{0}, std::int64_t{4}}) {
        AttentionArgs causal{B, S, H, D, DType::kBF16, nullptr, nullptr, nullptr, kv};
        AttentionArgs bidir = causal;
        bidir.causal = false;
        const OpCost c = op_cost(causal), b = op_cost(bidir);
        // Causal: 2 * (2 * b*h*s*s*d) / 2; bidirectional: 2 * (2 * b*h*s*s*d).
        EXPECT_DOUBLE_EQ(c.flops, 2.0 * B * H * S * S * D);
        EXPECT_DOUBLE_EQ(b.flops, 2.0 * c.flops);
        EXPECT_DOUBLE_EQ(b.bytes, c.bytes);  // the same tensors read and written
        EXPECT_EQ(b.gemm_m, c.gemm_m);
        EXPECT_EQ(b.gemm_n, c.gemm_n);
        EXPECT_EQ(b.gemm_k, c.gemm_k);
        EXPECT_EQ(b.gemm_count, c.gemm_count);
        AttentionBackwardArgs cb{B, S, H, D, DType::kBF16};
        cb.kv_heads = kv;
        AttentionBackwardArgs bb = cb;
        bb.causal = false;
        EXPECT_DOUBLE_EQ(op_cost(cb).flops, 2.5 * c.flops);
        EXPECT_DOUBLE_EQ(op_cost(bb).flops, 2.0 * op_cost(cb).flops);
        EXPECT_DOUBLE_EQ(op_cost(bb).bytes, op_cost(cb).bytes);
    }
}

// ---- The attention sublayer ---------------------------------------------------------------------

TEST(AttentionSublayerBidirectional, BackboneShapeCausalReachesTheOp) {
    Cpu c;
    BackboneShape s;
    s.hidden = 24, s.heads = 6, s.kv_heads = 2, s.seq_len = 7, s.ffn = 16;
    BackboneShape bs = s;
    bs.causal = false;
    const std::int64_t T = 2 * s.seq_len, H = s.hidden;
    ParamSet p(*c.device, AttentionSublayer::param_specs(s), DType::kF32);
    ParamSet cg(*c.device, AttentionSublayer::param_specs(s), DType::kF32);
    ParamSet bg(*c.device, AttentionSublayer::param_specs(s), DType::kF32);
    const F params = random_floats(p.numel(), 58, 0.5f);
    std::copy(params.begin(), params.end(), static_cast<float*>(p.data()));
    F x = random_floats(T * H, 59), go = random_floats(T * H, 60);
    F cout(sz(T * H)), bout(sz(T * H)), cin(sz(T * H)), bin(sz(T * H));
    AttentionSublayer ca(s, *c.device, T), ba(bs, *c.device, T);
    const Tensor xt(x.data(), DType::kF32, {T, H}), got(go.data(), DType::kF32, {T, H});
    ca.forward(xt, p.tensors(), Tensor(cout.data(), DType::kF32, {T, H}), *c.stream);
    ba.forward(xt, p.tensors(), Tensor(bout.data(), DType::kF32, {T, H}), *c.stream);
    ca.backward(got, p.tensors(), cg.tensors(), Tensor(cin.data(), DType::kF32, {T, H}), *c.stream);
    ba.backward(got, p.tensors(), bg.tensors(), Tensor(bin.data(), DType::kF32, {T, H}), *c.stream);
    c.stream->synchronize();
    for (std::int64_t t = 0; t < T; ++t) {
        const std::int64_t i = t % s.seq_len;
        float diff = 0.0f;
        for (std::int64_t e = 0; e < H; ++e) diff = std::max(diff, std::abs(bout[sz(t * H + e)] - cout[sz(t * H + e)]));
        if (i + 1 == s.seq_len)
            EXPECT_LT(diff, 1e-5f) << "the last token sees every key either way, token " << t;
        else
            EXPECT_GT(diff, 1e-4f) << "token " << t << " sees later tokens only when bidirectional";
    }
    EXPECT_GT(max_abs_diff(bin, cin), 1e-4f) << "the backward runs bidirectional too";
    const auto span = [](const Tensor& t) { return F(t.as<float>(), t.as<float>() + t.numel()); };
    EXPECT_GT(max_abs_diff(span(bg[1]), span(cg[1])), 1e-4f) << "grad wqkv";
}

}  // namespace
}  // namespace scmoe
