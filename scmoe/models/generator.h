// Generation from prompts with a Decoder: each prompt is prefilled and its first new token sampled
// (time to first token: until every prompt has its first), then every step feeds each sequence its
// last token and samples the next, max_new_tokens in all per prompt. Tokens are handed to a
// callback as they are chosen (streaming). Times come from the device's host clock
// (Device::host_time_us: wall time on CPU and CUDA, the emulator's modeled time on emu), each pass
// synchronized, so they are per-token latencies, not issue times.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "scmoe/models/decoder.h"
#include "scmoe/models/sampling.h"

namespace scmoe::models {

struct GenerateOptions {
    std::int64_t max_new_tokens = 64;  // per prompt, >= 1
    SamplingOptions sampling;
    std::uint64_t seed = 0;
};

struct GenerateTimes {
    double first_token_s = 0;          // from the start to every prompt's first new token
    std::vector<double> step_s;        // each later step (one token for every prompt)
    double total_s = 0;                // the whole generation
    std::int64_t tokens = 0;           // new tokens over all prompts
    double tokens_per_s() const { return total_s > 0 ? static_cast<double>(tokens) / total_s : 0; }
    // Quantile q in [0, 1] of step_s (nearest rank); 0 without steps.
    double step_quantile(double q) const;
    double step_mean() const;
};

struct GenerateResult {
    std::vector<std::vector<std::int32_t>> tokens;  // per prompt, the new tokens
    GenerateTimes times;
};

// The positions a generation needs in the cache: the longest prompt + max_new_tokens - 1 (the last
// new token is sampled, never fed back).
std::int64_t generation_length(const std::vector<std::vector<std::int32_t>>& prompts, std::int64_t max_new_tokens);

// (sequence, token): called for each new token as it is chosen, in step order, sequences in order.
using TokenFn = std::function<void(std::int64_t sequence, std::int32_t token)>;

// Generates with `decoder` (its batch = prompts.size(), its max_length >= generation_length; its
// cache is reset first). A collective over the decoder's ep group: every rank passes the same
// prompts and options and gets the same tokens.
GenerateResult generate(Decoder& decoder, const std::vector<std::vector<std::int32_t>>& prompts,
                        const GenerateOptions& options, const TokenFn& on_token = {});

}  // namespace scmoe::models
