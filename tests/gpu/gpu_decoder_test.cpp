// Decoding on CUDA (bf16; scmoe/models/decoder.h), where a GPU is present:
//  (a) the decoder's logits at every position (the prompt's from its prefill, each generated one's
//      from its step) against the CUDA full forward over the sequence so far: relative L2 per
//      position <= 5e-2 (bf16 storage, other GEMM shapes and rounding points than the full pass,
//      through 4 blocks; the GPU tests' tolerance for a whole block's output). The check can fail:
//      the logits one position off differ by more;
//  (b) resident, blocking and prefetch give bitwise the same tokens and logits (same device, same
//      kernels, the same GEMM per expert);
//  (c) against the CPU reference (f32, the same bf16-rounded parameters): the logits of the first
//      generated position within relative L2 5e-2. The greedy tokens after it may diverge in bf16,
//      so they are not compared.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gpu_test_util.h"
#include "scmoe/kernels/host_io.h"
#include "scmoe/models/decoder.h"
#include "scmoe/models/expert_cache.h"
#include "scmoe/models/lm.h"
#include "scmoe/models/lm_config.h"
#include "models/train_test_util.h"

namespace scmoe::models {
namespace {

using Tokens = std::vector<std::int32_t>;
using gpu_testing::F;

constexpr double kBf16Logits = 5e-2;  // relative L2 of one position's logits row

LmConfig gpu_decode_lm(const std::string& variant, DType dtype) {
    LmConfig c = testing::decode_lm(variant);
    c.backbone.dtype = c.moe.dtype = dtype;
    return c;
}

// Parameters with enough spread that the logits depend visibly on every input, uniform in
// [-0.35, 0.35] and rounded to bf16, so the CPU (f32) and CUDA (bf16) models hold the same values.
void spread_params(LanguageModel& lm, std::uint64_t seed) {
    lm.init_params(seed);
    for (const ParamGroup& g : lm.param_groups())
        copy_from_host(gpu_testing::round_bf16(testing::spread_values(g, seed)), Tensor(g.params, g.dtype, {g.numel}),
                       lm.stream());
    lm.stream().synchronize();
}

// One sequence: its prompt prefilled, then `steps` greedy steps. logits[p] ([positions, vocab])
// follow tokens 0..p.
struct Decoded {
    Tokens tokens;
    F logits;
};
Decoded decode(LanguageModel& lm, const Tokens& prompt, int steps, ExpertResidency mode = ExpertResidency::kResident) {
    const std::int64_t V = lm.config().vocab;
    Decoder dec(lm, {1, static_cast<std::int64_t>(prompt.size()) + steps, mode, 0});
    Decoded d;
    d.tokens = prompt;
    d.logits = dec.prefill(0, prompt.data(), static_cast<std::int64_t>(prompt.size()));
    for (int i = 0; i < steps; ++i) {
        const float* last = d.logits.data() + d.logits.size() - static_cast<std::size_t>(V);
        const std::int32_t next = static_cast<std::int32_t>(std::max_element(last, last + V) - last);
        const std::vector<float>& l = dec.step(&next);
        d.tokens.push_back(next);
        d.logits.insert(d.logits.end(), l.begin(), l.end());
    }
    return d;
}

// Row p of a [*, V] array.
F row(const F& a, std::int64_t p, std::int64_t V) {
    return F(a.begin() + static_cast<std::ptrdiff_t>(p * V), a.begin() + static_cast<std::ptrdiff_t>((p + 1) * V));
}

void expect_logits_equal_full_forward(const std::string& variant) {
    SCOPED_TRACE(variant);
    auto gpu = make_device("cuda");
    const LmConfig c = gpu_decode_lm(variant, gpu->compute_dtype());
    LanguageModel lm(c, *gpu, c.backbone.seq_len);
    spread_params(lm, 11);
    const Decoded d = decode(lm, testing::random_tokens(5, 1), 6);
    // The full forward over the whole sequence (padded to seq_len; causal, so the padding changes
    // nothing before it): its row p is the logits after tokens 0..p.
    Tokens in(static_cast<std::size_t>(c.backbone.seq_len), 0);
    std::copy(d.tokens.begin(), d.tokens.end(), in.begin());
    lm.forward(in.data(), in.data(), static_cast<std::int64_t>(in.size()));
    lm.loss_sum();
    const F full = lm.logits();
    const std::int64_t V = c.vocab, positions = static_cast<std::int64_t>(d.tokens.size());
    double worst_shifted = 0;
    for (std::int64_t p = 0; p < positions; ++p) {
        EXPECT_LE(testing::relative_l2(row(d.logits, p, V), row(full, p, V)), kBf16Logits) << "position " << p;
        if (p + 1 < positions)
            worst_shifted = std::max(worst_shifted, testing::relative_l2(row(d.logits, p, V), row(full, p + 1, V)));
    }
    EXPECT_GT(worst_shifted, 2 * kBf16Logits) << "one position off, the logits should be far apart";
}

TEST(GpuDecoder, LogitsEqualTheFullForwardScmoePos2) {
    SCMOE_REQUIRE_GPU();
    expect_logits_equal_full_forward("scmoe-pos2");
}

TEST(GpuDecoder, LogitsEqualTheFullForwardTop2) {
    SCMOE_REQUIRE_GPU();
    expect_logits_equal_full_forward("top2");
}

// A model whose MoE parameters live in the CUDA device's pinned host memory for the offloaded modes.
Decoded decode_in_mode(const std::string& variant, ExpertResidency mode) {
    auto gpu = make_device("cuda");
    const LmConfig c = gpu_decode_lm(variant, gpu->compute_dtype());
    const std::unique_ptr<Device> host = mode == ExpertResidency::kResident ? nullptr : pinned_host_memory(*gpu);
    LanguageModel lm(c, *gpu, 0, nullptr, nullptr, host.get());
    spread_params(lm, 13);
    return decode(lm, testing::random_tokens(7, 2), 6, mode);
}

TEST(GpuDecoder, ResidencyModesGiveBitwiseTheSameTokensAndLogits) {
    SCMOE_REQUIRE_GPU();
    for (const char* variant : {"scmoe-pos2", "top2"}) {
        SCOPED_TRACE(variant);
        const Decoded resident = decode_in_mode(variant, ExpertResidency::kResident);
        for (ExpertResidency mode : {ExpertResidency::kBlocking, ExpertResidency::kPrefetch}) {
            SCOPED_TRACE(expert_residency_name(mode));
            const Decoded other = decode_in_mode(variant, mode);
            EXPECT_EQ(other.tokens, resident.tokens);
            gpu_testing::expect_bitwise_equal(other.logits, resident.logits, "logits");
        }
    }
}

TEST(GpuDecoder, FirstGeneratedLogitsMatchTheCpuReference) {
    SCMOE_REQUIRE_GPU();
    const Tokens prompt = testing::random_tokens(6, 3);
    F first[2];  // the logits after the prompt (the first generated token's distribution): CPU, CUDA
    const char* backends[2] = {"cpu", "cuda"};
    for (int i = 0; i < 2; ++i) {
        auto device = make_device(backends[i]);
        const LmConfig c = gpu_decode_lm("scmoe-pos2", device->compute_dtype());
        LanguageModel lm(c, *device, 0);
        spread_params(lm, 17);
        const Decoded d = decode(lm, prompt, 0);
        first[i] = row(d.logits, static_cast<std::int64_t>(prompt.size()) - 1, c.vocab);
    }
    EXPECT_LE(testing::relative_l2(first[1], first[0]), kBf16Logits);
    // The check can fail: another position's CPU logits are far from these.
    auto cpu = make_device("cpu");
    const LmConfig c = gpu_decode_lm("scmoe-pos2", DType::kF32);
    LanguageModel lm(c, *cpu, 0);
    spread_params(lm, 17);
    const Decoded d = decode(lm, prompt, 0);
    EXPECT_GT(testing::relative_l2(first[1], row(d.logits, static_cast<std::int64_t>(prompt.size()) - 2, c.vocab)), 2 * kBf16Logits);
}

}  // namespace
}  // namespace scmoe::models
