// The host-side logic of the cuDNN attention provider, checked on the CPU (no cuDNN, no GPU):
//   - the strided [batch, heads, seq, dim] views cuDNN gets over qkv, out, grad_qkv and lse: each
//     element lands where scmoe/kernels/attention.h puts it, q/k/v tile qkv exactly once, the 16-byte
//     alignment cuDNN needs holds, and attention computed naively *through the views* reproduces
//     the CPU op (a stride swap or a wrong offset fails it);
//   - the graph-cache key: every field separates keys, pointers do not;
//   - the provider choice (argument, SCMOE_ATTENTION_PROVIDER, dtype, head_dim, alignment, build);
//   - SCMOE_ATTENTION_DETERMINISTIC parsing, provider names, the CPU backend's checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "scmoe/kernels/attention.h"
#include "scmoe/kernels/cuda/cudnn_attention_plan.h"
#include "scmoe/kernels/device.h"
#include "scmoe/kernels/error.h"
#include "scmoe/kernels/math.h"
#include "test_util.h"

namespace scmoe {
namespace {

using cuda::attention_views;
using cuda::AttentionDirection;
using cuda::AttentionPath;
using cuda::AttentionView;
using cuda::AttentionViews;
using cuda::choose_attention_path;
using cuda::CudnnAttentionKey;
using cuda::CudnnAttentionKeyHash;
using testing::random_floats;
using testing::sz;
using F = std::vector<float>;

struct Shape {
    std::int64_t batch, seq, heads, head_dim;
};

// Where scmoe/kernels/attention.h puts element e of head h, token (b, i): part 0 = q, 1 = k, 2 = v.
std::int64_t qkv_index(const Shape& s, std::int64_t part, std::int64_t b, std::int64_t h, std::int64_t i,
                       std::int64_t e) {
    return (b * s.seq + i) * 3 * s.heads * s.head_dim + part * s.heads * s.head_dim + h * s.head_dim + e;
}
std::int64_t out_index(const Shape& s, std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t e) {
    return (b * s.seq + i) * s.heads * s.head_dim + h * s.head_dim + e;
}

template <class Fn>
void for_each_element(const AttentionView& v, Fn&& fn) {
    for (std::int64_t b = 0; b < v.dims[0]; ++b)
        for (std::int64_t h = 0; h < v.dims[1]; ++h)
            for (std::int64_t i = 0; i < v.dims[2]; ++i)
                for (std::int64_t e = 0; e < v.dims[3]; ++e) fn(b, h, i, e);
}

TEST(AttentionCudnnViews, MatchTheDocumentedLayoutAndTileTheBuffers) {
    for (const Shape s : {Shape{2, 5, 3, 8}, Shape{1, 7, 1, 16}, Shape{3, 1, 2, 64}, Shape{2, 65, 4, 24}}) {
        SCOPED_TRACE("batch=" + std::to_string(s.batch) + " seq=" + std::to_string(s.seq));
        const AttentionViews v = attention_views(s.batch, s.seq, s.heads, s.head_dim);
        const std::int64_t qkv_size = s.batch * s.seq * 3 * s.heads * s.head_dim;
        std::vector<int> hits(sz(qkv_size), 0);
        const AttentionView* parts[3] = {&v.q, &v.k, &v.v};
        for (std::int64_t part = 0; part < 3; ++part) {
            const AttentionView& view = *parts[part];
            EXPECT_EQ(view.dims, (std::array<std::int64_t, 4>{s.batch, s.heads, s.seq, s.head_dim}));
            for_each_element(view, [&](std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t e) {
                const std::int64_t at = view.at(b, h, i, e);
                ASSERT_EQ(at, qkv_index(s, part, b, h, i, e)) << "part " << part;
                ++hits[sz(at)];
            });
        }
        // q, k and v (and so dQ, dK, dV over grad_qkv) cover every element exactly once: grad_qkv is
        // fully overwritten, with no element written twice.
        EXPECT_TRUE(std::all_of(hits.begin(), hits.end(), [](int n) { return n == 1; }));

        std::vector<int> out_hits(sz(s.batch * s.seq * s.heads * s.head_dim), 0);
        for_each_element(v.o, [&](std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t e) {
            ASSERT_EQ(v.o.at(b, h, i, e), out_index(s, b, h, i, e));
            ++out_hits[sz(v.o.at(b, h, i, e))];
        });
        EXPECT_TRUE(std::all_of(out_hits.begin(), out_hits.end(), [](int n) { return n == 1; }));

        // lse [batch, heads, seq] as [b, h, s, 1], packed (what cuDNN < 9.26 requires of Stats).
        EXPECT_EQ(v.stats.dims, (std::array<std::int64_t, 4>{s.batch, s.heads, s.seq, 1}));
        for_each_element(v.stats, [&](std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t) {
            ASSERT_EQ(v.stats.at(b, h, i, 0), (b * s.heads + h) * s.seq + i);
        });
        EXPECT_EQ(v.stats.strides[3], 1);
        EXPECT_EQ(v.stats.strides[2], v.stats.dims[3]);
        EXPECT_EQ(v.stats.strides[1], v.stats.dims[2] * v.stats.dims[3]);
        EXPECT_EQ(v.stats.strides[0], v.stats.dims[1] * v.stats.dims[2] * v.stats.dims[3]);
    }
}

// GQA: k and v are [batch, kv_heads, seq, dim] after q's heads in each qkv row; q, k and v tile the
// row (so dQ, dK, dV overwrite all of grad_qkv), and each K/V element is where the layout puts it.
TEST(AttentionCudnnViews, GroupedQueryViewsTileTheNarrowerQkvRows) {
    const std::vector<std::pair<std::int64_t, std::int64_t>> cases{{4, 2}, {6, 1}, {8, 8}};
    for (const auto& [heads, kv] : cases) {
        const std::int64_t batch = 2, seq = 5, d = 8, row = (heads + 2 * kv) * d;
        SCOPED_TRACE("heads " + std::to_string(heads) + " kv_heads " + std::to_string(kv));
        const AttentionViews v = attention_views(batch, seq, heads, d, kv);
        EXPECT_EQ(v.q.dims, (std::array<std::int64_t, 4>{batch, heads, seq, d}));
        EXPECT_EQ(v.k.dims, (std::array<std::int64_t, 4>{batch, kv, seq, d}));
        EXPECT_EQ(v.v.dims, (std::array<std::int64_t, 4>{batch, kv, seq, d}));
        std::vector<int> hits(sz(batch * seq * row), 0);
        for (const AttentionView* view : {&v.q, &v.k, &v.v})
            for_each_element(*view, [&](std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t e) {
                ++hits[sz(view->at(b, h, i, e))];
            });
        EXPECT_TRUE(std::all_of(hits.begin(), hits.end(), [](int n) { return n == 1; }));
        EXPECT_EQ(v.k.at(1, kv - 1, 3, 5), (1 * seq + 3) * row + (heads + kv - 1) * d + 5);
        EXPECT_EQ(v.v.at(1, kv - 1, 3, 5), (1 * seq + 3) * row + (heads + kv + kv - 1) * d + 5);
    }
    // kv_heads 0 is heads: the MHA views.
    const AttentionViews mha = attention_views(2, 5, 4, 8), zero = attention_views(2, 5, 4, 8, 0);
    EXPECT_EQ(mha.k.dims, zero.k.dims);
    EXPECT_EQ(mha.v.offset, zero.v.offset);
}

// cuDNN reads 16-byte vectors: with head_dim a multiple of 8, every bf16 stride but the innermost
// and every view offset is a multiple of 8 elements.
TEST(AttentionCudnnViews, StridesAndOffsetsKeepSixteenByteAlignment) {
    for (std::int64_t head_dim = 8; head_dim <= cuda::kCudnnAttentionMaxHeadDim; head_dim += 8) {
        for (std::int64_t heads : {1, 3, 12}) {
            const AttentionViews v = attention_views(2, 33, heads, head_dim);
            for (const AttentionView* view : {&v.q, &v.k, &v.v, &v.o}) {
                EXPECT_EQ(view->strides[3], 1);
                for (int d = 0; d < 3; ++d) EXPECT_EQ(view->strides[d] % 8, 0) << "head_dim " << head_dim;
                EXPECT_EQ(view->offset % 8, 0) << "head_dim " << head_dim;
            }
        }
    }
}

// Attention computed from the views alone (gather q, k, v through them; scatter out and lse
// through them) must equal the CPU op: the views mean what cuDNN will take them to mean.
TEST(AttentionCudnnViews, NaiveAttentionThroughTheViewsMatchesTheCpuOp) {
    const Shape s{2, 9, 3, 8};
    const AttentionViews v = attention_views(s.batch, s.seq, s.heads, s.head_dim);
    const F qkv = random_floats(s.batch * s.seq * 3 * s.heads * s.head_dim, 11);
    F out_views(sz(s.batch * s.seq * s.heads * s.head_dim), NAN), lse_views(sz(s.batch * s.heads * s.seq), NAN);
    const float scale = math::attention_scale(s.head_dim);
    for (std::int64_t b = 0; b < s.batch; ++b) {
        for (std::int64_t h = 0; h < s.heads; ++h) {
            for (std::int64_t i = 0; i < s.seq; ++i) {
                std::vector<double> score(sz(i + 1));
                double mx = -INFINITY;
                for (std::int64_t j = 0; j <= i; ++j) {
                    double dot = 0.0;
                    for (std::int64_t e = 0; e < s.head_dim; ++e)
                        dot += double{qkv[sz(v.q.at(b, h, i, e))]} * qkv[sz(v.k.at(b, h, j, e))];
                    score[sz(j)] = dot * scale;
                    mx = std::max(mx, score[sz(j)]);
                }
                double sum = 0.0;
                for (double x : score) sum += std::exp(x - mx);
                for (std::int64_t e = 0; e < s.head_dim; ++e) {
                    double acc = 0.0;
                    for (std::int64_t j = 0; j <= i; ++j)
                        acc += std::exp(score[sz(j)] - mx) / sum * qkv[sz(v.v.at(b, h, j, e))];
                    out_views[sz(v.o.at(b, h, i, e))] = static_cast<float>(acc);
                }
                lse_views[sz(v.stats.at(b, h, i, 0))] = static_cast<float>(mx + std::log(sum));
            }
        }
    }
    testing::Cpu c;
    F out(out_views.size()), lse(lse_views.size());
    attention_forward({s.batch, s.seq, s.heads, s.head_dim, DType::kF32, qkv.data(), out.data(), lse.data()}, *c.stream,
                      AttentionProvider::kOwn);
    c.stream->synchronize();
    for (std::size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out_views[i], out[i], 1e-5f) << "out " << i;
    for (std::size_t i = 0; i < lse.size(); ++i) ASSERT_NEAR(lse_views[i], lse[i], 1e-5f) << "lse " << i;
}

// ---- Cache key ----------------------------------------------------------------------------

TEST(AttentionCudnnKey, EveryFieldSeparatesKeysAndPointersDoNot) {
    const CudnnAttentionKey base{0, 2, 128, 4, 64, DType::kBF16, AttentionDirection::kBackward, true, true, 0, 4};
    std::vector<CudnnAttentionKey> keys{base};
    auto vary = [&](auto&& change) {
        CudnnAttentionKey k = base;
        change(k);
        keys.push_back(k);
    };
    vary([](CudnnAttentionKey& k) { k.device = 1; });
    vary([](CudnnAttentionKey& k) { k.batch = 3; });
    vary([](CudnnAttentionKey& k) { k.seq = 129; });
    vary([](CudnnAttentionKey& k) { k.heads = 8; });
    vary([](CudnnAttentionKey& k) { k.head_dim = 128; });
    vary([](CudnnAttentionKey& k) { k.dtype = DType::kF32; });
    vary([](CudnnAttentionKey& k) { k.direction = AttentionDirection::kForward; });
    vary([](CudnnAttentionKey& k) { k.with_stats = false; });
    vary([](CudnnAttentionKey& k) { k.deterministic = false; });
    vary([](CudnnAttentionKey& k) { k.sm_count = 100; });  // a graph per SM budget (Stream::set_sm_budget)
    vary([](CudnnAttentionKey& k) { k.kv_heads = 2; });    // GQA: a graph per K/V head count
    vary([](CudnnAttentionKey& k) { k.causal = false; });  // bidirectional: a graph without the mask
    // batch and seq swapped: same product of tokens, a different graph.
    vary([](CudnnAttentionKey& k) { std::swap(k.batch, k.seq); });
    std::unordered_set<CudnnAttentionKey, CudnnAttentionKeyHash> set(keys.begin(), keys.end());
    EXPECT_EQ(set.size(), keys.size());
    for (std::size_t i = 0; i < keys.size(); ++i)
        for (std::size_t j = 0; j < keys.size(); ++j) EXPECT_EQ(keys[i] == keys[j], i == j) << i << " vs " << j;
    CudnnAttentionKey copy = base;
    EXPECT_TRUE(set.count(copy));
    EXPECT_EQ(CudnnAttentionKeyHash{}(copy), CudnnAttentionKeyHash{}(base));

    float a[4], b[4];
    const AttentionArgs fwd_a{2, 128, 4, 64, DType::kBF16, a, a, a}, fwd_b{2, 128, 4, 64, DType::kBF16, b, b, b};
    EXPECT_EQ(cuda::cudnn_attention_key(0, fwd_a), cuda::cudnn_attention_key(0, fwd_b));
    const AttentionArgs inference{2, 128, 4, 64, DType::kBF16, a, a, nullptr};
    EXPECT_FALSE(cuda::cudnn_attention_key(0, fwd_a) == cuda::cudnn_attention_key(0, inference));
    EXPECT_TRUE(cuda::cudnn_attention_key(0, fwd_a).with_stats);
    EXPECT_EQ(cuda::cudnn_attention_key(0, fwd_a).direction, AttentionDirection::kForward);
    const AttentionBackwardArgs bwd{2, 128, 4, 64, DType::kBF16, a, a, a, a, b};
    EXPECT_EQ(cuda::cudnn_attention_key(0, bwd, true), base);
    AttentionBackwardArgs gqa_bwd = bwd;
    gqa_bwd.kv_heads = 2;
    EXPECT_EQ(cuda::cudnn_attention_key(0, gqa_bwd, true).kv_heads, 2);
    // causal reaches the key from both args (default true: the graph every caller had).
    EXPECT_TRUE(cuda::cudnn_attention_key(0, fwd_a).causal);
    EXPECT_TRUE(base.causal);
    AttentionArgs bidir_fwd = fwd_a;
    bidir_fwd.causal = false;
    EXPECT_FALSE(cuda::cudnn_attention_key(0, bidir_fwd).causal);
    EXPECT_FALSE(cuda::cudnn_attention_key(0, bidir_fwd) == cuda::cudnn_attention_key(0, fwd_a));
    AttentionBackwardArgs bidir_bwd = bwd;
    bidir_bwd.causal = false;
    EXPECT_FALSE(cuda::cudnn_attention_key(0, bidir_bwd, true).causal);
    EXPECT_FALSE(cuda::cudnn_attention_key(0, bidir_bwd, true) == base);
    EXPECT_FALSE(cuda::cudnn_attention_key(0, gqa_bwd, true) == base);
    EXPECT_FALSE(cuda::cudnn_attention_key(0, bwd, true) == cuda::cudnn_attention_key(0, bwd, false));
    EXPECT_FALSE(cuda::cudnn_attention_key(0, bwd, true) == cuda::cudnn_attention_key(1, bwd, true));
    EXPECT_EQ(cuda::cudnn_attention_key(0, fwd_a).sm_count, 0) << "no budget: every SM";
    EXPECT_EQ(cuda::cudnn_attention_key(0, fwd_a, 100).sm_count, 100);
    EXPECT_EQ(cuda::cudnn_attention_key(0, bwd, true, 100).sm_count, 100);
    EXPECT_FALSE(cuda::cudnn_attention_key(0, fwd_a, 100) == cuda::cudnn_attention_key(0, fwd_a));
}

// ---- Provider choice ----------------------------------------------------------------------

AttentionPath path(AttentionProvider p, DType dt, std::int64_t head_dim, bool aligned = true, bool built = true) {
    return choose_attention_path("attention_forward", p, dt, head_dim, aligned, built).path;
}

TEST(AttentionProviderChoice, AutoTakesCudnnExactlyWhereItCanRun) {
    const AttentionProvider a = AttentionProvider::kAuto;
    EXPECT_EQ(path(a, DType::kBF16, 64), AttentionPath::kCudnn);
    EXPECT_EQ(path(a, DType::kBF16, 128), AttentionPath::kCudnn);
    EXPECT_EQ(path(a, DType::kBF16, 24), AttentionPath::kCudnn);
    EXPECT_EQ(path(a, DType::kBF16, 256), AttentionPath::kCudnn);
    EXPECT_FALSE(choose_attention_path("op", a, DType::kBF16, 64, true, true).cudnn_required);
    EXPECT_EQ(path(a, DType::kF32, 64), AttentionPath::kOwn);                // cuDNN SDPA has no f32
    EXPECT_EQ(path(a, DType::kBF16, 20), AttentionPath::kOwn);               // not a multiple of 8
    EXPECT_EQ(path(a, DType::kBF16, 264), AttentionPath::kOwn);              // past cuDNN's largest
    EXPECT_EQ(path(a, DType::kBF16, 64, false), AttentionPath::kOwn);        // a pointer not 16-byte aligned
    EXPECT_EQ(path(a, DType::kBF16, 64, true, false), AttentionPath::kOwn);  // built without cuDNN
}

TEST(AttentionProviderChoice, OwnAlwaysRunsTheOwnKernel) {
    for (DType dt : {DType::kF32, DType::kBF16})
        for (bool built : {false, true})
            EXPECT_EQ(path(AttentionProvider::kOwn, dt, 64, true, built), AttentionPath::kOwn);
}

TEST(AttentionProviderChoice, ExplicitCudnnThrowsWhereItCannotRun) {
    const AttentionProvider c = AttentionProvider::kCudnn;
    const auto choice = choose_attention_path("attention_backward", c, DType::kBF16, 64, true, true);
    EXPECT_EQ(choice.path, AttentionPath::kCudnn);
    EXPECT_TRUE(choice.cudnn_required);
    auto message = [&](DType dt, std::int64_t head_dim, bool aligned, bool built) -> std::string {
        try {
            choose_attention_path("attention_backward", c, dt, head_dim, aligned, built);
        } catch (const Error& e) {
            return e.what();
        }
        return "";
    };
    EXPECT_NE(message(DType::kBF16, 64, true, false).find("built without cuDNN"), std::string::npos);
    EXPECT_NE(message(DType::kF32, 64, true, true).find("dtype f32"), std::string::npos);
    EXPECT_NE(message(DType::kBF16, 20, true, true).find("head_dim 20"), std::string::npos);
    EXPECT_NE(message(DType::kBF16, 64, false, true).find("aligned"), std::string::npos);
    EXPECT_NE(message(DType::kBF16, 20, true, true).find("attention_backward"), std::string::npos);
}

TEST(AttentionProviderChoice, EnvironmentOverridesAutoOnly) {
    using cuda::effective_attention_provider;
    const AttentionProvider a = AttentionProvider::kAuto, o = AttentionProvider::kOwn, c = AttentionProvider::kCudnn;
    EXPECT_EQ(effective_attention_provider(a, nullptr), a);
    EXPECT_EQ(effective_attention_provider(a, ""), a);
    EXPECT_EQ(effective_attention_provider(a, "own"), o);
    EXPECT_EQ(effective_attention_provider(a, "cudnn"), c);
    EXPECT_EQ(effective_attention_provider(a, "auto"), a);
    EXPECT_EQ(effective_attention_provider(c, "own"), c);  // an explicit argument wins
    EXPECT_EQ(effective_attention_provider(o, "cudnn"), o);
    try {
        effective_attention_provider(a, "fast");
        FAIL() << "expected a throw";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("SCMOE_ATTENTION_PROVIDER='fast'"), std::string::npos) << e.what();
    }
    // An explicit argument never reads the variable, not even a bad value.
    EXPECT_EQ(effective_attention_provider(o, "fast"), o);
}

TEST(AttentionProviderChoice, DeterministicSwitchParses) {
    using cuda::attention_deterministic_from_env;
    // Unset: deterministic from sm_90 on (cuDNN's deterministic backward), the atomic one below.
    EXPECT_TRUE(attention_deterministic_from_env(nullptr, 90));
    EXPECT_TRUE(attention_deterministic_from_env("", 100));
    EXPECT_FALSE(attention_deterministic_from_env(nullptr, 80));
    EXPECT_FALSE(attention_deterministic_from_env("", 89));
    // Set: as asked, on every architecture.
    EXPECT_TRUE(attention_deterministic_from_env("1", 80));
    EXPECT_FALSE(attention_deterministic_from_env("0", 90));
    EXPECT_THROW(attention_deterministic_from_env("yes", 90), Error);
}

TEST(AttentionProviderChoice, NamesRoundTripAndTheCpuBackendRejectsCudnn) {
    for (AttentionProvider p : {AttentionProvider::kAuto, AttentionProvider::kOwn, AttentionProvider::kCudnn})
        EXPECT_EQ(parse_attention_provider(attention_provider_name(p)), p);
    EXPECT_THROW(parse_attention_provider("flash"), Error);
    EXPECT_THROW(parse_attention_provider(nullptr), Error);
    EXPECT_NO_THROW(check_attention_provider(AttentionProvider::kCudnn, Backend::kCuda));
    EXPECT_THROW(check_attention_provider(AttentionProvider::kCudnn, Backend::kCpu), Error);

    testing::Cpu c;
    const Shape s{1, 4, 2, 8};
    const F qkv = random_floats(s.batch * s.seq * 3 * s.heads * s.head_dim, 3);
    F out_auto(sz(s.batch * s.seq * s.heads * s.head_dim)), out_own(out_auto.size());
    const AttentionArgs args{s.batch, s.seq, s.heads, s.head_dim, DType::kF32, qkv.data(), out_auto.data(), nullptr};
    EXPECT_THROW(attention_forward(args, *c.stream, AttentionProvider::kCudnn), Error);
    attention_forward(args, *c.stream);
    AttentionArgs own = args;
    own.out = out_own.data();
    attention_forward(own, *c.stream, AttentionProvider::kOwn);
    c.stream->synchronize();
    EXPECT_TRUE(testing::bitwise_equal(out_auto, out_own));
}

}  // namespace
}  // namespace scmoe
