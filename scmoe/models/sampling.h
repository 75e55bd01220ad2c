// Choosing the next token from a position's logits: greedy (temperature 0), or a draw from
// softmax(logits / temperature) restricted to the top_k most likely tokens (top_k 0: all of them).
// Draws come from a TokenSampler's own generator (SplitMix64, defined bit for bit), seeded from
// (seed, sequence): the same seed gives the same tokens on every run, platform and batch layout.
#pragma once

#include <cstdint>

namespace scmoe::models {

struct SamplingOptions {
    float temperature = 0.0f;  // 0: greedy (the lowest index among ties); > 0: sample
    std::int64_t top_k = 0;    // > 0: only the k largest logits are candidates; 0: every token
    // Throws scmoe::Error naming the value: temperature < 0 or not finite, top_k < 0.
    void validate() const;
};

class TokenSampler {
  public:
    // One sampler per sequence: `sequence` keys its stream, so sequence b's tokens do not depend on
    // how many other sequences share the batch.
    TokenSampler(const SamplingOptions& options, std::uint64_t seed, std::uint64_t sequence);
    // The next token from logits[0, vocab). Throws scmoe::Error if a logit is NaN.
    std::int32_t next(const float* logits, std::int64_t vocab);

  private:
    double uniform();  // in [0, 1)
    SamplingOptions options_;
    std::uint64_t state_;
};

}  // namespace scmoe::models
