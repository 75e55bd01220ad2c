// Generation (scmoe/models/generator.h) on the CPU: the same seed gives the same tokens and another
// seed others; greedy tokens are the argmax of the full forward's logits at every position (the
// decoder's logits are the full forward's); a prompt's tokens do not depend on the other prompts of
// its batch (greedy); the timings have one entry per step and count every new token; the latency
// quantiles are nearest-rank; a request beyond the cache is refused naming the value; expert-parallel
// ranks given different prompts or options stop, every rank naming what differs.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "scmoe/kernels/error.h"
#include "scmoe/models/decoder.h"
#include "scmoe/models/generator.h"
#include "scmoe/models/lm.h"
#include "test_util.h"
#include "train_test_util.h"

namespace scmoe::models {
namespace {

using Tokens = std::vector<std::int32_t>;

LmConfig gen_lm() {
    LmConfig c;
    c.layers = 2;
    c.variant = "scmoe-pos2";
    c.backbone.hidden = 32;
    c.backbone.heads = 4;
    c.backbone.seq_len = 24;
    c.backbone.ffn = 48;
    c.backbone.activation = Activation::kGeLU;
    c.moe.num_experts = 4;
    c.moe.ffn = 24;
    c.moe.activation = Activation::kGeLU;
    c.moe.dispatch = DispatchMode::kDropless;
    return c;
}

struct Model {
    LmConfig config = gen_lm();
    std::unique_ptr<Device> device = make_device("cpu");
    LanguageModel lm{config, *device, config.backbone.seq_len};
    Model() { lm.init_params(3); }
    GenerateResult run(const std::vector<Tokens>& prompts, const GenerateOptions& o) {
        Decoder d(lm, {static_cast<std::int64_t>(prompts.size()), generation_length(prompts, o.max_new_tokens)});
        return generate(d, prompts, o);
    }
};

const std::vector<Tokens> kPrompts = {{'T', 'h', 'e', ' '}, {'a'}, {'x', 'y', 'z', 'z', 'y', 'x', '!'}};

TEST(Generate, SameSeedSameTokensOtherSeedOthers) {
    Model m;
    GenerateOptions o;
    o.max_new_tokens = 12;
    o.sampling = {1.5f, 0};
    o.seed = 7;
    const GenerateResult a = m.run(kPrompts, o), b = m.run(kPrompts, o);
    EXPECT_EQ(a.tokens, b.tokens);
    o.seed = 8;
    EXPECT_NE(m.run(kPrompts, o).tokens, a.tokens);
}

TEST(Generate, GreedyTokensAreTheFullForwardsArgmaxAndIndependentOfTheBatch) {
    Model m;
    GenerateOptions o;
    o.max_new_tokens = 10;
    const GenerateResult batch = m.run(kPrompts, o);
    const std::int64_t V = m.config.vocab, S = m.config.backbone.seq_len;
    for (std::size_t b = 0; b < kPrompts.size(); ++b) {
        EXPECT_EQ(m.run({kPrompts[b]}, o).tokens[0], batch.tokens[b]) << "prompt " << b;
        Tokens seq = kPrompts[b];
        seq.insert(seq.end(), batch.tokens[b].begin(), batch.tokens[b].end());
        Tokens in(static_cast<std::size_t>(S), 0);
        std::copy(seq.begin(), seq.end(), in.begin());
        m.lm.forward(in.data(), in.data(), S);
        m.lm.loss_sum();
        const std::vector<float> logits = m.lm.logits();
        for (std::size_t i = 0; i < batch.tokens[b].size(); ++i) {
            const std::size_t pos = kPrompts[b].size() - 1 + i;  // the position whose logits chose token i
            const float* row = logits.data() + pos * static_cast<std::size_t>(V);
            EXPECT_EQ(batch.tokens[b][i], std::max_element(row, row + V) - row) << "prompt " << b << " token " << i;
        }
    }
    EXPECT_EQ(batch.times.step_s.size(), 9u);
    EXPECT_EQ(batch.times.tokens, 30);
    EXPECT_GT(batch.times.total_s, 0.0);
}

TEST(Generate, QuantilesAreNearestRank) {
    GenerateTimes t;
    t.step_s = {5, 1, 4, 2, 3, 10, 6, 7, 9, 8};
    EXPECT_EQ(t.step_quantile(0.5), 5);
    EXPECT_EQ(t.step_quantile(0.9), 9);
    EXPECT_EQ(t.step_quantile(1.0), 10);
    EXPECT_DOUBLE_EQ(t.step_mean(), 5.5);
}

TEST(Generate, RefusesMoreTokensThanTheCacheHolds) {
    Model m;
    Decoder d(m.lm, {1, 8});
    GenerateOptions o;
    o.max_new_tokens = 6;  // 4 + 6 - 1 = 9 positions
    try {
        generate(d, {kPrompts[0]}, o);
        FAIL() << "9 positions in a cache of 8 were accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("need 9 positions"), std::string::npos) << e.what();
    }
}

// Two expert-parallel ranks must generate from the same prompts and options (every pass is a
// collective over them): one that differs makes every rank fail at the start, naming it.
TEST(GenerateRanks, RanksWithOtherPromptsOrOptionsStopNamingThem) {
    const struct {
        const char* name;
        std::function<void(std::vector<Tokens>&, GenerateOptions&)> vary;
        const char* says;
    } cases[] = {
        {"seed", [](std::vector<Tokens>&, GenerateOptions& o) { o.seed = 8; }, "rank 1 has seed 8 (rank 0: 7)"},
        {"prompt", [](std::vector<Tokens>& p, GenerateOptions&) { p[1] = {'b'}; }, "prompt tokens (hash)"},
        {"max new tokens", [](std::vector<Tokens>&, GenerateOptions& o) { o.max_new_tokens = 3; },
         "max new tokens 3 (rank 0: 4)"},
    };
    for (const auto& c : cases) {
        std::vector<std::string> errors(2);
        testing::run_train_ranks(2, 2, [&](int rank, const TrainComms& comms) {
            const LmConfig config = gen_lm();
            auto device = make_device("cpu");
            LanguageModel lm(config, *device, config.backbone.seq_len, comms.ep);
            lm.init_params(3);
            std::vector<Tokens> prompts = kPrompts;
            GenerateOptions o;
            o.max_new_tokens = 4;
            o.seed = 7;
            if (rank == 1) c.vary(prompts, o);
            Decoder d(lm, {static_cast<std::int64_t>(prompts.size()), generation_length(kPrompts, 4)}, comms.ep);
            try {
                generate(d, prompts, o);
            } catch (const Error& e) {
                errors[static_cast<std::size_t>(rank)] = e.what();
            }
        });
        for (int r = 0; r < 2; ++r) {
            const std::string& e = errors[static_cast<std::size_t>(r)];
            EXPECT_NE(e.find("generation settings: the ranks disagree"), std::string::npos) << c.name << " rank " << r << ": " << e;
            EXPECT_NE(e.find(c.says), std::string::npos) << c.name << " rank " << r << ": " << e;
        }
    }
}

}  // namespace
}  // namespace scmoe::models
