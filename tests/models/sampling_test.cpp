// Token sampling (scmoe/models/sampling.h): greedy is the argmax (lowest index among ties); top-k
// never picks outside the k largest; top-k 1 is greedy at any temperature; draws follow
// softmax(logits / T) (frequencies over many seeded draws, within a bound a wrong temperature
// breaks); the same (seed, sequence) gives the same tokens and another seed or sequence others;
// bad options are refused naming the value.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "scmoe/kernels/error.h"
#include "scmoe/models/sampling.h"

namespace scmoe::models {
namespace {

std::vector<std::int32_t> draws(const SamplingOptions& o, std::uint64_t seed, std::uint64_t sequence,
                                const std::vector<float>& logits, int n) {
    TokenSampler s(o, seed, sequence);
    std::vector<std::int32_t> out;
    for (int i = 0; i < n; ++i) out.push_back(s.next(logits.data(), static_cast<std::int64_t>(logits.size())));
    return out;
}

TEST(Sampling, GreedyIsTheArgmaxLowestIndexAmongTies) {
    const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f, 1.9f};
    for (std::int32_t t : draws({}, 3, 0, logits, 5)) EXPECT_EQ(t, 1);
}

TEST(Sampling, TopKNeverLeavesTheKLargestAndTopOneIsGreedy) {
    const std::vector<float> logits = {0.1f, 3.0f, 2.9f, -2.0f, 2.8f, 0.0f, 1.0f};
    for (std::int32_t t : draws({1.5f, 3}, 9, 0, logits, 2000)) EXPECT_TRUE(t == 1 || t == 2 || t == 4) << t;
    for (std::int32_t t : draws({5.0f, 1}, 9, 0, logits, 200)) EXPECT_EQ(t, 1);
}

TEST(Sampling, FrequenciesFollowTheTemperedSoftmax) {
    const std::vector<float> logits = {1.0f, 0.0f, -1.0f, 0.5f};
    const float T = 0.7f;
    const int n = 40000;
    const auto got = draws({T, 0}, 21, 0, logits, n);
    std::vector<double> p(logits.size());
    double sum = 0;
    for (std::size_t i = 0; i < p.size(); ++i) sum += p[i] = std::exp(logits[i] / T);
    std::vector<int> count(logits.size(), 0);
    for (std::int32_t t : got) ++count[static_cast<std::size_t>(t)];
    for (std::size_t i = 0; i < p.size(); ++i) {
        const double want = p[i] / sum, freq = static_cast<double>(count[i]) / n;
        // 5 standard deviations of a binomial frequency; temperature 1 instead of 0.7 moves token 0 by 0.08.
        EXPECT_NEAR(freq, want, 5 * std::sqrt(want * (1 - want) / n)) << "token " << i;
    }
}

TEST(Sampling, SameSeedSameTokensOtherSeedOrSequenceOthers) {
    std::vector<float> logits(256);
    for (std::size_t i = 0; i < logits.size(); ++i) logits[i] = std::sin(static_cast<float>(i)) * 2.0f;
    const SamplingOptions o{1.0f, 50};
    const auto a = draws(o, 42, 0, logits, 64);
    EXPECT_EQ(a, draws(o, 42, 0, logits, 64));
    EXPECT_NE(a, draws(o, 43, 0, logits, 64));
    EXPECT_NE(a, draws(o, 42, 1, logits, 64));
}

TEST(Sampling, RefusesBadOptionsAndNaNLogits) {
    try {
        TokenSampler s({-0.5f, 0}, 0, 0);
        FAIL() << "temperature -0.5 accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("-0.5"), std::string::npos) << e.what();
    }
    try {
        TokenSampler s({1.0f, -3}, 0, 0);
        FAIL() << "top-k -3 accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("-3"), std::string::npos) << e.what();
    }
    const std::vector<float> bad = {0.0f, NAN, 1.0f};
    TokenSampler s({}, 0, 0);
    EXPECT_THROW(s.next(bad.data(), 3), Error);
}

}  // namespace
}  // namespace scmoe::models
