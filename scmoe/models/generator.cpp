#include "scmoe/models/generator.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

#include "scmoe/comm/communicator.h"
#include "scmoe/kernels/error.h"
#include "scmoe/models/parallel.h"

namespace scmoe::models {

double GenerateTimes::step_quantile(double q) const {
    if (step_s.empty()) return 0;
    std::vector<double> sorted = step_s;
    std::sort(sorted.begin(), sorted.end());
    const auto rank = static_cast<std::size_t>(std::ceil(q * static_cast<double>(sorted.size())));
    return sorted[std::min(sorted.size() - 1, rank == 0 ? 0 : rank - 1)];
}

double GenerateTimes::step_mean() const {
    return step_s.empty() ? 0 : std::accumulate(step_s.begin(), step_s.end(), 0.0) / static_cast<double>(step_s.size());
}

std::int64_t generation_length(const std::vector<std::vector<std::int32_t>>& prompts, std::int64_t max_new_tokens) {
    std::int64_t longest = 0;
    for (const auto& p : prompts) longest = std::max<std::int64_t>(longest, static_cast<std::int64_t>(p.size()));
    return longest + max_new_tokens - 1;
}

namespace {

// FNV-1a over every prompt's length and tokens: one value that differs when any prompt does.
std::uint64_t prompts_hash(const std::vector<std::vector<std::int32_t>>& prompts) {
    std::uint64_t h = 1469598103934665603ull;
    auto mix = [&h](std::uint64_t v) {
        for (int i = 0; i < 8; ++i, v >>= 8) h = (h ^ (v & 0xff)) * 1099511628211ull;
    };
    for (const auto& p : prompts) {
        mix(p.size());
        for (std::int32_t t : p) mix(static_cast<std::uint32_t>(t));
    }
    return h;
}

}  // namespace

GenerateResult generate(Decoder& decoder, const std::vector<std::vector<std::int32_t>>& prompts,
                        const GenerateOptions& options, const TokenFn& on_token) {
    if (decoder.ep() && decoder.ep()->size() > 1) {
        // Every rank of the group runs the same passes: prompts or options that differ would make
        // their exchanges differ in size, or the ranks sample different tokens.
        char hash[24];
        std::snprintf(hash, sizeof hash, "%016llx", static_cast<unsigned long long>(prompts_hash(prompts)));
        auto stream = decoder.device().create_stream();
        check_same_on_every_rank(decoder.ep(),
                                 {{"prompts", std::to_string(prompts.size())},
                                  {"prompt tokens (hash)", hash},
                                  {"max new tokens", std::to_string(options.max_new_tokens)},
                                  {"temperature", std::to_string(options.sampling.temperature)},
                                  {"top k", std::to_string(options.sampling.top_k)},
                                  {"seed", std::to_string(options.seed)}},
                                 "generation settings", decoder.device(), *stream);
    }
    const auto batch = static_cast<std::int64_t>(prompts.size());
    SCMOE_CHECK(batch == decoder.options().batch,
                "generate: " << batch << " prompts for a decoder of batch " << decoder.options().batch);
    SCMOE_CHECK(options.max_new_tokens >= 1, "--max-new-tokens " << options.max_new_tokens << ": must be >= 1");
    const std::int64_t need = generation_length(prompts, options.max_new_tokens);
    SCMOE_CHECK(need <= decoder.options().max_length,
                "generate: the longest prompt and --max-new-tokens " << options.max_new_tokens << " need " << need
                                                                     << " positions; the cache holds "
                                                                     << decoder.options().max_length);
    options.sampling.validate();
    const std::int64_t V = decoder.vocab();
    Device& device = decoder.device();
    std::vector<TokenSampler> samplers;
    for (std::int64_t b = 0; b < batch; ++b) samplers.emplace_back(options.sampling, options.seed, static_cast<std::uint64_t>(b));
    GenerateResult r;
    r.tokens.resize(prompts.size());
    decoder.reset();
    auto choose = [&](std::int64_t b, const float* logits) {
        const std::int32_t t = samplers[static_cast<std::size_t>(b)].next(logits, V);
        r.tokens[static_cast<std::size_t>(b)].push_back(t);
        if (on_token) on_token(b, t);
        return t;
    };
    const double start = device.host_time_us();
    std::vector<std::int32_t> last(prompts.size());
    for (std::int64_t b = 0; b < batch; ++b) {
        const auto& p = prompts[static_cast<std::size_t>(b)];
        const std::vector<float>& logits = decoder.prefill(b, p.data(), static_cast<std::int64_t>(p.size()));
        last[static_cast<std::size_t>(b)] = choose(b, logits.data() + (p.size() - 1) * static_cast<std::size_t>(V));
    }
    double at = device.host_time_us();
    r.times.first_token_s = (at - start) * 1e-6;
    for (std::int64_t i = 1; i < options.max_new_tokens; ++i) {
        const std::vector<float>& logits = decoder.step(last.data());
        for (std::int64_t b = 0; b < batch; ++b)
            last[static_cast<std::size_t>(b)] = choose(b, logits.data() + static_cast<std::size_t>(b * V));
        const double now = device.host_time_us();
        r.times.step_s.push_back((now - at) * 1e-6);
        at = now;
    }
    r.times.total_s = (at - start) * 1e-6;
    r.times.tokens = batch * options.max_new_tokens;
    return r;
}

}  // namespace scmoe::models
