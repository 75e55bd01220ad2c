#include "scmoe/models/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "scmoe/kernels/error.h"

namespace scmoe::models {
namespace {

std::uint64_t splitmix64(std::uint64_t& state) {
    std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

}  // namespace

void SamplingOptions::validate() const {
    SCMOE_CHECK(std::isfinite(temperature) && temperature >= 0.0f,
                "--temperature " << temperature << ": must be >= 0 (0: greedy)");
    SCMOE_CHECK(top_k >= 0, "--top-k " << top_k << ": must be >= 0 (0: every token)");
}

TokenSampler::TokenSampler(const SamplingOptions& options, std::uint64_t seed, std::uint64_t sequence)
    : options_(options) {
    options.validate();
    std::uint64_t s = seed ^ (0x5c3e5c3e5c3e5c3eull * (sequence + 1));
    state_ = splitmix64(s);
}

double TokenSampler::uniform() { return static_cast<double>(splitmix64(state_) >> 11) * 0x1.0p-53; }

std::int32_t TokenSampler::next(const float* logits, std::int64_t vocab) {
    SCMOE_CHECK(vocab > 0, "TokenSampler: vocab = " << vocab);
    for (std::int64_t i = 0; i < vocab; ++i)
        SCMOE_CHECK(!std::isnan(logits[i]), "TokenSampler: the logit of token " << i << " is NaN");
    if (options_.temperature == 0.0f)
        return static_cast<std::int32_t>(std::max_element(logits, logits + vocab) - logits);
    // Candidates: by logit, largest first, ties by index (a total order, so the draw is reproducible).
    std::vector<std::int32_t> order(static_cast<std::size_t>(vocab));
    std::iota(order.begin(), order.end(), 0);
    const std::int64_t k = options_.top_k > 0 ? std::min(options_.top_k, vocab) : vocab;
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](std::int32_t a, std::int32_t b) {
        return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    std::vector<double> p(static_cast<std::size_t>(k));
    const double top = logits[order[0]], t = options_.temperature;
    double sum = 0;
    for (std::int64_t i = 0; i < k; ++i) sum += p[static_cast<std::size_t>(i)] = std::exp((logits[order[static_cast<std::size_t>(i)]] - top) / t);
    const double u = uniform() * sum;
    double acc = 0;
    for (std::int64_t i = 0; i < k; ++i) {
        acc += p[static_cast<std::size_t>(i)];
        if (u < acc) return order[static_cast<std::size_t>(i)];
    }
    return order[static_cast<std::size_t>(k - 1)];
}

}  // namespace scmoe::models
