// Grouped-query attention (GQA, kv_heads < heads) on the CPU backend, f32: the op against multi-head
// attention with each K/V head repeated for its group of query heads (the definition of GQA), its
// gradients against finite differences (with a known-wrong gradient the check must reject), the
// argument checks naming kv_heads, the emulator's cost (FLOPs per query head, fewer K/V bytes) and
// the attention sublayer: its wqkv width and its forward/backward against the repeated-KV MHA sublayer.
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
#include "scmoe/moe/backbone.h"
#include "attention_shape.h"
#include "test_util.h"

namespace scmoe {
namespace {

using F = std::vector<float>;
using testing::Cpu;
using testing::random_floats;
using testing::sz;

using Gqa = testing::AttentionShape;

// The MHA qkv of a GQA qkv: query head h gets a copy of K/V head h / group.
F repeat_kv(const Gqa& g, const F& qkv) {
    const Gqa m = g.mha();
    F out(sz(m.qkv_size()));
    for (std::int64_t t = 0; t < g.rows(); ++t)
        for (std::int64_t h = 0; h < g.heads; ++h)
            for (std::int64_t d = 0; d < g.head_dim; ++d) {
                out[m.at(t, 0, h, d)] = qkv[g.at(t, 0, h, d)];
                out[m.at(t, 1, h, d)] = qkv[g.at(t, 1, h / g.group(), d)];
                out[m.at(t, 2, h, d)] = qkv[g.at(t, 2, h / g.group(), d)];
            }
    return out;
}

// The GQA gradient of an MHA gradient over repeated K/V: dQ as is, dK and dV of a K/V head summed
// over its group. first_only: the bug of keeping only the group's first query head.
F sum_kv_grads(const Gqa& g, const F& mha_grad, bool first_only = false) {
    const Gqa m = g.mha();
    F out(sz(g.qkv_size()), 0.0f);
    for (std::int64_t t = 0; t < g.rows(); ++t)
        for (std::int64_t h = 0; h < g.heads; ++h)
            for (std::int64_t d = 0; d < g.head_dim; ++d) {
                out[g.at(t, 0, h, d)] = mha_grad[m.at(t, 0, h, d)];
                if (first_only && h % g.group() != 0) continue;
                out[g.at(t, 1, h / g.group(), d)] += mha_grad[m.at(t, 1, h, d)];
                out[g.at(t, 2, h / g.group(), d)] += mha_grad[m.at(t, 2, h, d)];
            }
    return out;
}

TEST(AttentionGqa, EqualsMultiHeadAttentionWithEachKvHeadRepeated) {
    Cpu c;
    // seq 70 spans two 64-row blocks of the CPU kernel; kv_heads 2 (groups of 3) and 1 (multi-query).
    for (const Gqa g : {Gqa{2, 70, 6, 2, 5}, Gqa{1, 9, 4, 1, 8}}) {
        SCOPED_TRACE("heads " + std::to_string(g.heads) + " kv_heads " + std::to_string(g.kv_heads));
        const F qkv = random_floats(g.qkv_size(), 31, 1.5f), go = random_floats(g.out_size(), 32);
        const F mha_qkv = repeat_kv(g, qkv);
        F out, lse, grad, mout, mlse, mgrad;
        g.forward(*c.stream, qkv, out, lse);
        g.backward(*c.stream, qkv, out, lse, go, grad);
        g.mha().forward(*c.stream, mha_qkv, mout, mlse);
        g.mha().backward(*c.stream, mha_qkv, mout, mlse, go, mgrad);
        c.stream->synchronize();
        testing::expect_close(out, mout, 1e-6f, "out");
        testing::expect_close(lse, mlse, 1e-6f, "lse");
        testing::expect_close(grad, sum_kv_grads(g, mgrad), 1e-5f, "grad_qkv (dK, dV summed over each group)");
        // Not vacuous: the K/V gradient of a group differs from its first query head's share.
        const F first_only = sum_kv_grads(g, mgrad, /*first_only=*/true);
        float diff = 0.0f;
        for (std::size_t i = 0; i < grad.size(); ++i) diff = std::max(diff, std::abs(grad[i] - first_only[i]));
        EXPECT_GT(diff, 1e-3f);
    }
}

TEST(AttentionGqa, GradientsMatchFiniteDifferences) {
    Cpu c;
    for (const Gqa g : {Gqa{2, 5, 4, 2, 3}, Gqa{1, 6, 3, 1, 4}}) {
        SCOPED_TRACE("heads " + std::to_string(g.heads) + " kv_heads " + std::to_string(g.kv_heads));
        F qkv = random_floats(g.qkv_size(), 33, 1.5f);
        const F go = random_floats(g.out_size(), 34);
        F out, lse, grad;
        g.forward(*c.stream, qkv, out, lse);
        g.backward(*c.stream, qkv, out, lse, go, grad);
        c.stream->synchronize();
        const testing::AttentionGradCheck check = testing::attention_grad_check(qkv, go, [&] {
            F o, l;
            g.forward(*c.stream, qkv, o, l);
            c.stream->synchronize();
            return o;
        });
        EXPECT_LT(check.worst(grad), 1.0) << "grad of q, k and v";
        // The same check rejects dK/dV from the group's first query head only.
        F mout, mlse, mgrad;
        const F mha_qkv = repeat_kv(g, qkv);
        g.mha().forward(*c.stream, mha_qkv, mout, mlse);
        g.mha().backward(*c.stream, mha_qkv, mout, mlse, go, mgrad);
        c.stream->synchronize();
        EXPECT_GT(check.worst(sum_kv_grads(g, mgrad, /*first_only=*/true)), 1.0)
            << "a K/V gradient of one head must fail";
    }
}

TEST(AttentionGqa, KvHeadsThatDoNotDivideHeadsAreRefusedNamingTheField) {
    Cpu c;
    F buf(4096), lse(64);
    for (const std::int64_t kv : {3, -1, 8}) {
        try {
            attention_forward({1, 2, 4, 4, DType::kF32, buf.data(), buf.data() + 1024, lse.data(), kv}, *c.stream);
            FAIL() << "kv_heads " << kv << ": expected an Error";
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find("kv_heads " + std::to_string(kv)), std::string::npos) << e.what();
        }
        EXPECT_THROW(attention_backward({1, 2, 4, 4, DType::kF32, buf.data(), buf.data() + 1024, lse.data(),
                                         buf.data() + 2048, buf.data() + 3072, kv},
                                        *c.stream),
                     Error);
    }
    c.stream->synchronize();
}

TEST(AttentionGqa, CostKeepsFlopsPerQueryHeadAndReadsFewerKvBytes) {
    const std::int64_t B = 2, S = 128, H = 16, D = 64, kv = 4;
    const AttentionArgs mha{B, S, H, D, DType::kBF16, nullptr, nullptr, nullptr};
    AttentionArgs gqa = mha;
    gqa.kv_heads = kv;
    const OpCost a = op_cost(mha), g = op_cost(gqa);
    EXPECT_EQ(g.flops, a.flops);
    // K and V of H - kv heads fewer, 2 bytes each, per token.
    EXPECT_DOUBLE_EQ(a.bytes - g.bytes, 2.0 * static_cast<double>(B * S * 2 * (H - kv) * D));
    AttentionBackwardArgs mb{B, S, H, D, DType::kBF16};
    AttentionBackwardArgs gb = mb;
    gb.kv_heads = kv;
    EXPECT_EQ(op_cost(gb).flops, op_cost(mb).flops);
    // Read from qkv and written to grad_qkv.
    EXPECT_DOUBLE_EQ(op_cost(mb).bytes - op_cost(gb).bytes, 2.0 * 2.0 * static_cast<double>(B * S * 2 * (H - kv) * D));
}

// ---- The attention sublayer ---------------------------------------------------------------------

BackboneShape sublayer_shape(std::int64_t kv_heads) {
    BackboneShape s;
    s.hidden = 24;
    s.heads = 6;
    s.kv_heads = kv_heads;
    s.seq_len = 7;
    s.ffn = 16;
    return s;
}

TEST(AttentionSublayerGqa, WqkvHasHeadsPlusTwoKvHeadSlicesAndTheFieldIsChecked) {
    const std::vector<ParamSpec> gqa = AttentionSublayer::param_specs(sublayer_shape(2));
    EXPECT_EQ(gqa[1].name, "wqkv");
    EXPECT_EQ(gqa[1].shape, (std::vector<std::int64_t>{24, (6 + 2 * 2) * 4}));
    EXPECT_EQ(AttentionSublayer::param_specs(sublayer_shape(0))[1].shape, (std::vector<std::int64_t>{24, 72}));
    EXPECT_EQ(AttentionSublayer::param_specs(sublayer_shape(6))[1].shape, (std::vector<std::int64_t>{24, 72}));
    for (const std::int64_t kv : {4, -2, 12}) {
        try {
            validate_backbone_shape(sublayer_shape(kv), "BackboneShape");
            FAIL() << "kv_heads " << kv << ": expected an Error";
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find("BackboneShape.kv_heads = " + std::to_string(kv)), std::string::npos)
                << e.what();
        }
    }
}

TEST(AttentionSublayerGqa, ForwardAndBackwardEqualTheMhaSublayerWithRepeatedKvWeights) {
    Cpu c;
    const BackboneShape gs = sublayer_shape(2), ms = sublayer_shape(0);
    const std::int64_t T = 2 * gs.seq_len, H = gs.hidden, D = H / gs.heads, group = gs.heads / 2;
    const std::int64_t GQ = backbone_qkv_width(gs), MQ = backbone_qkv_width(ms);
    ParamSet gp(*c.device, AttentionSublayer::param_specs(gs), DType::kF32);
    ParamSet mp(*c.device, AttentionSublayer::param_specs(ms), DType::kF32);
    ParamSet gg(*c.device, AttentionSublayer::param_specs(gs), DType::kF32);
    ParamSet mg(*c.device, AttentionSublayer::param_specs(ms), DType::kF32);
    const F gparams = random_floats(gp.numel(), 41, 0.5f);
    std::copy(gparams.begin(), gparams.end(), static_cast<float*>(gp.data()));
    // The MHA weights: norm and wo as the GQA's; wqkv's K/V columns of head h from K/V head h / group.
    const float* gw = gp[1].as<float>();
    float* mw = mp[1].as<float>();
    std::copy(gp[0].as<float>(), gp[0].as<float>() + H, mp[0].as<float>());
    std::copy(gp[2].as<float>(), gp[2].as<float>() + H * H, mp[2].as<float>());
    for (std::int64_t r = 0; r < H; ++r)
        for (std::int64_t h = 0; h < gs.heads; ++h)
            for (std::int64_t d = 0; d < D; ++d) {
                mw[r * MQ + h * D + d] = gw[r * GQ + h * D + d];
                mw[r * MQ + H + h * D + d] = gw[r * GQ + H + (h / group) * D + d];
                mw[r * MQ + 2 * H + h * D + d] = gw[r * GQ + H + 2 * D + (h / group) * D + d];
            }
    F x = random_floats(T * H, 42), go = random_floats(T * H, 43);
    F gout(sz(T * H)), mout(sz(T * H)), gin(sz(T * H)), min(sz(T * H));
    AttentionSublayer ga(gs, *c.device, T), ma(ms, *c.device, T);
    ga.forward(Tensor(x.data(), DType::kF32, {T, H}), gp.tensors(), Tensor(gout.data(), DType::kF32, {T, H}),
               *c.stream);
    ma.forward(Tensor(x.data(), DType::kF32, {T, H}), mp.tensors(), Tensor(mout.data(), DType::kF32, {T, H}),
               *c.stream);
    ga.backward(Tensor(go.data(), DType::kF32, {T, H}), gp.tensors(), gg.tensors(),
                Tensor(gin.data(), DType::kF32, {T, H}), *c.stream);
    ma.backward(Tensor(go.data(), DType::kF32, {T, H}), mp.tensors(), mg.tensors(),
                Tensor(min.data(), DType::kF32, {T, H}), *c.stream);
    c.stream->synchronize();
    testing::expect_close(gout, mout, 1e-5f, "out");
    testing::expect_close(gin, min, 1e-5f, "grad_in");
    const auto span = [](const Tensor& t) { return F(t.as<float>(), t.as<float>() + t.numel()); };
    testing::expect_close(span(gg[0]), span(mg[0]), 1e-5f, "grad norm_w");
    testing::expect_close(span(gg[2]), span(mg[2]), 1e-5f, "grad wo");
    // grad wqkv: Q columns as the MHA's; a K/V head's columns the sum over its group's copies.
    F want(sz(H * GQ), 0.0f);
    const float* m = mg[1].as<float>();
    for (std::int64_t r = 0; r < H; ++r)
        for (std::int64_t h = 0; h < gs.heads; ++h)
            for (std::int64_t d = 0; d < D; ++d) {
                want[sz(r * GQ + h * D + d)] = m[r * MQ + h * D + d];
                want[sz(r * GQ + H + (h / group) * D + d)] += m[r * MQ + H + h * D + d];
                want[sz(r * GQ + H + 2 * D + (h / group) * D + d)] += m[r * MQ + 2 * H + h * D + d];
            }
    testing::expect_close(span(gg[1]), want, 1e-5f, "grad wqkv");
}

}  // namespace
}  // namespace scmoe
