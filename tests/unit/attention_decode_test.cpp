// Decoding attention against a KV cache (scmoe/kernels/attention_decode.h) on the CPU backend, f32:
// a prefill of part of each sequence then one token per step gives, at every position, the rows of
// the full causal attention_forward over the same qkv (MHA and GQA, sequences of different lengths
// in one batch); the cache holds exactly the K/V parts of the qkv rows; bad arguments and lengths
// are refused naming the value; the emulator's cost grows with the cached length.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "scmoe/kernels/attention.h"
#include "scmoe/kernels/attention_decode.h"
#include "scmoe/kernels/device.h"
#include "scmoe/kernels/error.h"
#include "test_util.h"

namespace scmoe {
namespace {

using F = std::vector<float>;
using testing::Cpu;
using testing::random_floats;
using testing::sz;

struct Shape {
    std::int64_t heads, kv_heads, head_dim;
    std::int64_t width() const { return (heads + 2 * kv_heads) * head_dim; }
};

// The full causal attention of one sequence's qkv rows [seq, width].
F full_attention(Stream& s, const Shape& sh, const F& qkv, std::int64_t seq) {
    F out(sz(seq * sh.heads * sh.head_dim));
    attention_forward({1, seq, sh.heads, sh.head_dim, DType::kF32, qkv.data(), out.data(), nullptr, sh.kv_heads}, s);
    s.synchronize();
    return out;
}

// Decodes `seqs` (each [len_b, width] qkv rows): one prefill pass of `prefill[b]` tokens per
// sequence alone (batch 1, as a generator prefills its prompts), then steps of one token for the
// whole batch while every sequence has tokens left. Returns each sequence's attention rows.
std::vector<F> decode(Stream& s, const Shape& sh, const std::vector<F>& seqs, const std::vector<std::int64_t>& prefill,
                      std::int64_t max_length) {
    const auto B = static_cast<std::int64_t>(seqs.size());
    const std::int64_t hd = sh.heads * sh.head_dim, W = sh.width(), kv = sh.kv_heads;
    F kc(sz(B * kv * max_length * sh.head_dim), std::numeric_limits<float>::quiet_NaN());
    F vc(kc.size(), std::numeric_limits<float>::quiet_NaN());
    std::vector<F> out(seqs.size());
    std::vector<std::int64_t> len(seqs.size());
    for (std::int64_t b = 0; b < B; ++b) {
        const std::int64_t n = prefill[sz(b)];
        len[sz(b)] = n;
        std::vector<std::int32_t> lengths = {static_cast<std::int32_t>(n)};
        F o(sz(n * hd));
        // The cache of sequence b alone: batch 1 over its block of the cache.
        float* kb = kc.data() + b * kv * max_length * sh.head_dim;
        float* vb = vc.data() + b * kv * max_length * sh.head_dim;
        kv_cache_append({1, n, sh.heads, kv, sh.head_dim, max_length, DType::kF32, seqs[sz(b)].data(), lengths.data(), kb, vb}, s);
        attention_decode({1, n, sh.heads, kv, sh.head_dim, max_length, DType::kF32, seqs[sz(b)].data(), lengths.data(), kb, vb, o.data()}, s);
        s.synchronize();
        out[sz(b)] = o;
    }
    for (;;) {
        // Every sequence steps together (each has the same number of steps left).
        bool any = false;
        F qkv(sz(B * W));
        std::vector<std::int32_t> lengths(sz(B));
        for (std::int64_t b = 0; b < B; ++b) {
            const std::int64_t total = static_cast<std::int64_t>(seqs[sz(b)].size()) / W;
            if (len[sz(b)] >= total) continue;
            any = true;
            std::copy(seqs[sz(b)].begin() + len[sz(b)] * W, seqs[sz(b)].begin() + (len[sz(b)] + 1) * W, qkv.begin() + b * W);
            lengths[sz(b)] = static_cast<std::int32_t>(++len[sz(b)]);
        }
        if (!any) break;
        F o(sz(B * hd));
        kv_cache_append({B, 1, sh.heads, kv, sh.head_dim, max_length, DType::kF32, qkv.data(), lengths.data(), kc.data(), vc.data()}, s);
        attention_decode({B, 1, sh.heads, kv, sh.head_dim, max_length, DType::kF32, qkv.data(), lengths.data(), kc.data(), vc.data(), o.data()}, s);
        s.synchronize();
        for (std::int64_t b = 0; b < B; ++b) out[sz(b)].insert(out[sz(b)].end(), o.begin() + b * hd, o.begin() + (b + 1) * hd);
    }
    return out;
}

void expect_decode_equals_full(const Shape& sh) {
    Cpu cpu;
    const std::int64_t max_length = 40;
    // Different lengths and prefills; every sequence decodes the same number of steps (12).
    const std::vector<std::int64_t> prefill = {5, 17, 1};
    std::vector<F> seqs;
    for (std::size_t b = 0; b < prefill.size(); ++b)
        seqs.push_back(random_floats((prefill[b] + 12) * sh.width(), 100 + b));
    const std::vector<F> got = decode(*cpu.stream, sh, seqs, prefill, max_length);
    for (std::size_t b = 0; b < seqs.size(); ++b) {
        const std::int64_t seq = static_cast<std::int64_t>(seqs[b].size()) / sh.width();
        const F want = full_attention(*cpu.stream, sh, seqs[b], seq);
        ASSERT_EQ(got[b].size(), want.size());
        for (std::size_t i = 0; i < want.size(); ++i)
            ASSERT_NEAR(got[b][i], want[i], 2e-6f * (1.0f + std::fabs(want[i])))
                << "sequence " << b << " element " << i << " (position " << i / sz(sh.heads * sh.head_dim) << ")";
    }
}

TEST(AttentionDecode, EqualsFullCausalAttentionMha) { expect_decode_equals_full({4, 4, 8}); }
TEST(AttentionDecode, EqualsFullCausalAttentionGqa) { expect_decode_equals_full({6, 2, 8}); }
TEST(AttentionDecode, EqualsFullCausalAttentionMqa) { expect_decode_equals_full({4, 1, 16}); }

TEST(AttentionDecode, CacheHoldsTheKeyAndValueParts) {
    Cpu cpu;
    const Shape sh{4, 2, 3};
    const std::int64_t max_length = 6, n = 4;
    const F qkv = random_floats(n * sh.width(), 7);
    F kc(sz(sh.kv_heads * max_length * sh.head_dim), -1.0f), vc(kc.size(), -1.0f);
    std::vector<std::int32_t> lengths = {static_cast<std::int32_t>(n)};
    kv_cache_append({1, n, sh.heads, sh.kv_heads, sh.head_dim, max_length, DType::kF32, qkv.data(), lengths.data(), kc.data(), vc.data()}, *cpu.stream);
    cpu.stream->synchronize();
    for (std::int64_t g = 0; g < sh.kv_heads; ++g)
        for (std::int64_t p = 0; p < max_length; ++p)
            for (std::int64_t d = 0; d < sh.head_dim; ++d) {
                const std::size_t at = sz((g * max_length + p) * sh.head_dim + d);
                const float k = p < n ? qkv[sz(p * sh.width() + (sh.heads + g) * sh.head_dim + d)] : -1.0f;
                const float v = p < n ? qkv[sz(p * sh.width() + (sh.heads + sh.kv_heads + g) * sh.head_dim + d)] : -1.0f;
                EXPECT_EQ(kc[at], k) << "K head " << g << " position " << p;
                EXPECT_EQ(vc[at], v) << "V head " << g << " position " << p;
            }
}

TEST(AttentionDecode, RefusesBadArgumentsNamingTheValue) {
    Cpu cpu;
    F qkv(64), kc(64), vc(64), out(64);
    std::vector<std::int32_t> lengths = {3};
    AttentionDecodeArgs a{1, 2, 4, 3, 2, 4, DType::kF32, qkv.data(), lengths.data(), kc.data(), vc.data(), out.data()};
    try {
        attention_decode(a, *cpu.stream);
        FAIL() << "kv_heads 3 of 4 heads was accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("kv_heads 3"), std::string::npos) << e.what();
    }
    a.kv_heads = 2;
    a.new_tokens = 5;
    try {
        attention_decode(a, *cpu.stream);
        FAIL() << "new_tokens beyond max_length was accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("new_tokens 5"), std::string::npos) << e.what();
    }
    // A length beyond the cache fails at the stream's synchronize, naming the sequence and its length.
    a.new_tokens = 1;
    lengths[0] = 9;
    attention_decode(a, *cpu.stream);
    try {
        cpu.stream->synchronize();
        FAIL() << "length 9 in a cache of 4 was accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("length 9"), std::string::npos) << e.what();
    }
}

TEST(AttentionDecode, CostGrowsWithTheCacheLength) {
    AttentionDecodeArgs a{2, 1, 8, 2, 64, 128, DType::kF32};
    const OpCost short_cache = op_cost(a);
    a.max_length = 1024;
    const OpCost long_cache = op_cost(a);
    EXPECT_DOUBLE_EQ(long_cache.flops, 8.0 * short_cache.flops);
    EXPECT_GT(long_cache.bytes, short_cache.bytes);
    a.kv_heads = 8;  // MHA reads 4x the K/V bytes of GQA with 2 K/V heads
    EXPECT_GT(op_cost(a).bytes, long_cache.bytes);
    // The longest cached sequence of the call, where given, sets the keys costed.
    a.kv_heads = 2;
    a.longest = 128;
    EXPECT_DOUBLE_EQ(op_cost(a).flops, short_cache.flops);
}

}  // namespace
}  // namespace scmoe
