// The shape of a causal or bidirectional attention test case on the CPU (f32): the qkv row layout
// (q heads, then kv_heads K heads, then kv_heads V heads), element positions, and the op's forward
// and backward on NaN-filled outputs (a result the op does not write shows). Shared by the GQA and
// bidirectional attention tests.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "scmoe/kernels/attention.h"
#include "test_util.h"

namespace scmoe::testing {

struct AttentionShape {
    std::int64_t batch, seq, heads, kv_heads, head_dim;
    std::int64_t group() const { return heads / kv_heads; }
    std::int64_t width() const { return (heads + 2 * kv_heads) * head_dim; }  // one qkv row
    std::int64_t rows() const { return batch * seq; }
    std::int64_t qkv_size() const { return rows() * width(); }
    std::int64_t out_size() const { return rows() * heads * head_dim; }
    std::string name() const {
        return "batch " + std::to_string(batch) + " seq " + std::to_string(seq) + " heads " + std::to_string(heads) +
               " kv_heads " + std::to_string(kv_heads) + " head_dim " + std::to_string(head_dim);
    }
    // Element d of q head h (part 0), or of K/V head h (parts 1, 2), at token t.
    std::size_t at(std::int64_t t, int part, std::int64_t h, std::int64_t d) const {
        const std::int64_t base = part == 0 ? 0 : part == 1 ? heads * head_dim : (heads + kv_heads) * head_dim;
        return sz(t * width() + base + h * head_dim + d);
    }
    std::size_t out_at(std::int64_t t, std::int64_t h, std::int64_t d) const {
        return sz(t * heads * head_dim + h * head_dim + d);
    }
    // The same attention as MHA: kv_heads = heads.
    AttentionShape mha() const { return {batch, seq, heads, heads, head_dim}; }

    void forward(Stream& s, const std::vector<float>& qkv, std::vector<float>& out, std::vector<float>& lse,
                 bool causal = true) const {
        out.assign(sz(out_size()), std::numeric_limits<float>::quiet_NaN());
        lse.assign(sz(batch * heads * seq), std::numeric_limits<float>::quiet_NaN());
        AttentionArgs a{batch, seq, heads, head_dim, DType::kF32, qkv.data(), out.data(), lse.data(), kv_heads};
        a.causal = causal;
        attention_forward(a, s);
    }
    void backward(Stream& s, const std::vector<float>& qkv, const std::vector<float>& out, const std::vector<float>& lse,
                  const std::vector<float>& go, std::vector<float>& gqkv, bool causal = true) const {
        gqkv.assign(sz(qkv_size()), std::numeric_limits<float>::quiet_NaN());  // must be overwritten
        AttentionBackwardArgs a{batch,      seq,        heads,     head_dim,    DType::kF32, qkv.data(),
                                out.data(), lse.data(), go.data(), gqkv.data(), kv_heads};
        a.causal = causal;
        attention_backward(a, s);
    }
    std::vector<float> out_only(Cpu& c, const std::vector<float>& qkv, bool causal = true) const {
        std::vector<float> out, lse;
        forward(*c.stream, qkv, out, lse, causal);
        c.stream->synchronize();
        return out;
    }
};

// The finite differences of the loss <out(qkv), go> over qkv (step 1e-3), against which worst()
// measures an analytic gradient (|analytic - fd| <= 1e-3 + 1e-2 |fd| passes: worst < 1). `out_of`
// runs the forward alone on the current qkv.
struct AttentionGradCheck {
    std::vector<double> fd;
    double worst(const std::vector<float>& analytic) const { return worst_violation(analytic, fd, 1e-3, 1e-2); }
};
template <class OutOf>
AttentionGradCheck attention_grad_check(std::vector<float>& qkv, const std::vector<float>& go, OutOf&& out_of) {
    return {finite_differences(qkv, 1e-3f, [&] { return dot(out_of(), go); })};
}

// Every element of `got` within rtol * (max |want| + 1) of `want`, the first miss named.
inline void expect_close(const std::vector<float>& got, const std::vector<float>& want, float rtol, const char* what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    float scale = 0.0f;
    for (float v : want) scale = std::max(scale, std::abs(v));
    for (std::size_t i = 0; i < got.size(); ++i)
        ASSERT_NEAR(got[i], want[i], rtol * (scale + 1.0f)) << what << " element " << i;
}

}  // namespace scmoe::testing
