// Attention on the CPU: per (batch, head), BLAS on strided views of qkv, in row blocks of kRowBlock
// queries. Causal: only keys 0..(last query of the block) are computed (about half of the full
// seq x seq work); non-causal (causal = false): every block computes all seq keys. Scratch score
// buffers are thread_local: a CPU stream is one worker thread.
// GQA (attention.h): query head h reads K/V head h / group; backward walks each K/V head's group of
// query heads in order, summing its dK and dV over them.
// NOTES: no threads of our own and a fixed block order, so results do not depend on timing.
#include <algorithm>
#include <cmath>
#include <vector>

#include "scmoe/kernels/cpu/attention_rows.h"
#include "scmoe/kernels/cpu/cpu_ops.h"
#include "scmoe/kernels/error.h"
#include "scmoe/kernels/math.h"

namespace scmoe::cpu {
namespace {

constexpr std::int64_t kRowBlock = 64;

constexpr auto sgemm = attention_sgemm;

// Strided views of one (batch, query head): q/k/v rows have stride ld, out/grad_out rows stride
// ld_out; k_off and v_off locate the K/V head the query head reads.
struct HeadView {
    std::int64_t q_off, k_off, v_off, ld, ld_out, o_off;
};
HeadView head_view(std::int64_t b, std::int64_t h, std::int64_t seq, std::int64_t heads, std::int64_t kv_heads,
                   std::int64_t head_dim) {
    const std::int64_t hd = heads * head_dim, ld = attention_qkv_width(heads, kv_heads, head_dim);
    const std::int64_t kv = attention_kv_heads(heads, kv_heads), g = h / (heads / kv);
    const std::int64_t row0 = b * seq * ld;
    return {row0 + h * head_dim,        row0 + hd + g * head_dim, row0 + hd + kv * head_dim + g * head_dim, ld, hd,
            b * seq * hd + h * head_dim};
}

std::vector<float>& scratch(int which, std::size_t floats) {
    thread_local std::vector<float> buffers[2];
    auto& v = buffers[which];
    if (v.size() < floats) v.resize(floats);
    return v;
}

}  // namespace

void attention_forward(const AttentionArgs& a) {
    SCMOE_CHECK(a.dtype == DType::kF32, "attention_forward: CPU computes in f32 only");
    const std::int64_t S = a.seq, D = a.head_dim;
    const float scale = math::attention_scale(D);
    float* p = scratch(0, static_cast<std::size_t>(std::min(S, kRowBlock) * S)).data();
    for (std::int64_t b = 0; b < a.batch; ++b) {
        for (std::int64_t h = 0; h < a.heads; ++h) {
            const HeadView v = head_view(b, h, S, a.heads, a.kv_heads, D);
            const float* q = static_cast<const float*>(a.qkv) + v.q_off;
            const float* k = static_cast<const float*>(a.qkv) + v.k_off;
            const float* val = static_cast<const float*>(a.qkv) + v.v_off;
            float* out = static_cast<float*>(a.out) + v.o_off;
            for (std::int64_t r0 = 0; r0 < S; r0 += kRowBlock) {
                const std::int64_t nr = std::min(kRowBlock, S - r0);
                const std::int64_t nk = a.causal ? r0 + nr : S;  // keys 0..nk-1
                sgemm(false, true, nr, nk, D, scale, q + r0 * v.ld, v.ld, k, v.ld, 0.0f, p, nk);
                for (std::int64_t r = 0; r < nr; ++r) {
                    const std::int64_t i = r0 + r;
                    const std::int64_t last = a.causal ? i : S - 1;  // keys 0..last are visible
                    const SoftmaxRowStats st = causal_softmax_row(p + r * nk, last, nk);
                    if (a.lse) a.lse[(b * a.heads + h) * S + i] = st.max + logf(st.sum);
                }
                sgemm(false, false, nr, D, nk, 1.0f, p, nk, val, v.ld, 0.0f, out + r0 * v.ld_out, v.ld_out);
            }
        }
    }
}

void attention_backward(const AttentionBackwardArgs& a) {
    SCMOE_CHECK(a.dtype == DType::kF32, "attention_backward: CPU computes in f32 only");
    const std::int64_t S = a.seq, D = a.head_dim;
    const std::int64_t group = a.heads / attention_kv_heads(a.heads, a.kv_heads);
    const float scale = math::attention_scale(D);
    const std::size_t block_floats = static_cast<std::size_t>(std::min(S, kRowBlock) * S);
    float* p = scratch(0, block_floats).data();
    float* ds = scratch(1, block_floats).data();
    for (std::int64_t b = 0; b < a.batch; ++b) {
        for (std::int64_t h = 0; h < a.heads; ++h) {
            const HeadView v = head_view(b, h, S, a.heads, a.kv_heads, D);
            const float* q = static_cast<const float*>(a.qkv) + v.q_off;
            const float* k = static_cast<const float*>(a.qkv) + v.k_off;
            const float* val = static_cast<const float*>(a.qkv) + v.v_off;
            const float* out = static_cast<const float*>(a.out) + v.o_off;
            const float* go = static_cast<const float*>(a.grad_out) + v.o_off;
            const float* lse = a.lse + (b * a.heads + h) * S;
            float* dq = static_cast<float*>(a.grad_qkv) + v.q_off;
            float* dk = static_cast<float*>(a.grad_qkv) + v.k_off;
            float* dv = static_cast<float*>(a.grad_qkv) + v.v_off;
            // dK and dV collect contributions from every later row block and from every query head
            // of the K/V head's group (h, h+1, ... in order): the group's first head starts them at zero.
            if (h % group == 0) {
                for (std::int64_t j = 0; j < S; ++j) {
                    std::fill(dk + j * v.ld, dk + j * v.ld + D, 0.0f);
                    std::fill(dv + j * v.ld, dv + j * v.ld + D, 0.0f);
                }
            }
            for (std::int64_t r0 = 0; r0 < S; r0 += kRowBlock) {
                const std::int64_t nr = std::min(kRowBlock, S - r0);
                const std::int64_t nk = a.causal ? r0 + nr : S;  // keys 0..nk-1
                const float* qb = q + r0 * v.ld;
                const float* gob = go + r0 * v.ld_out;
                sgemm(false, true, nr, nk, D, scale, qb, v.ld, k, v.ld, 0.0f, p, nk);         // scaled scores
                sgemm(false, true, nr, nk, D, 1.0f, gob, v.ld_out, val, v.ld, 0.0f, ds, nk);  // dP = dO V^T
                for (std::int64_t r = 0; r < nr; ++r) {
                    const std::int64_t i = r0 + r;
                    const float* o_i = out + i * v.ld_out;
                    const float* go_i = go + i * v.ld_out;
                    float delta = 0.0f;  // D_i = dO_i . O_i = sum_j P_ij dP_ij
                    for (std::int64_t d = 0; d < D; ++d) delta += go_i[d] * o_i[d];
                    float* prow = p + r * nk;
                    float* dsrow = ds + r * nk;
                    const std::int64_t last = a.causal ? i : S - 1;  // keys 0..last are visible
                    for (std::int64_t j = 0; j <= last; ++j) {
                        prow[j] = math::attention_prob(prow[j], lse[i]);
                        dsrow[j] = prow[j] * (dsrow[j] - delta);
                    }
                    for (std::int64_t j = last + 1; j < nk; ++j) prow[j] = dsrow[j] = 0.0f;
                }
                sgemm(true, false, nk, D, nr, 1.0f, p, nk, gob, v.ld_out, 1.0f, dv, v.ld);           // dV += P^T dO
                sgemm(false, false, nr, D, nk, scale, ds, nk, k, v.ld, 0.0f, dq + r0 * v.ld, v.ld);  // dQ = s dS K
                sgemm(true, false, nk, D, nr, scale, ds, nk, qb, v.ld, 1.0f, dk, v.ld);              // dK += s dS^T Q
            }
        }
    }
}

}  // namespace scmoe::cpu
