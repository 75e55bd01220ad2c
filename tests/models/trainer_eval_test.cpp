// Trainer::evaluate and the held-out split: the eval loss is the mean cross-entropy of the LM's
// forward over the eval windows (no gate noise, no router losses), the same on any number of ranks,
// leaving training bitwise unchanged; bad eval data is a clear error.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "scmoe/models/trainer.h"
#include "train_test_util.h"

namespace scmoe::models {
namespace {

namespace fs = std::filesystem;
using testing::all_params;
using testing::expect_bitwise_same_runs;
using testing::fresh_dir;
using testing::RankRun;
using testing::run_train_ranks;
using testing::small_training;

// A text of `windows` whole eval windows of seq_len (+ the one byte the last window ends on) and a
// few bytes of tail that no window reaches.
fs::path write_eval_text(const fs::path& dir, std::int64_t windows, std::int64_t seq_len) {
    const fs::path path = dir / ("eval_" + std::to_string(windows) + ".txt");
    std::string text = generate_corpus_text(windows * seq_len + 1 + seq_len / 2, 42);
    std::ofstream(path, std::ios::binary) << text;
    return path;
}

// Dropless dispatch: a token's output then does not depend on which tokens share its pass, so the
// eval loss cannot depend on how the windows are batched or sharded.
TrainConfig eval_training(const fs::path& eval_file) {
    TrainConfig c = small_training(4);
    c.model.moe.dispatch = DispatchMode::kDropless;
    c.eval_data = {eval_file.string()};
    c.eval_batches = 0;
    return c;
}

// The eval loss on one rank, with every window of the file.
double eval_on_ranks(const TrainConfig& config, int world, int ep) {
    std::vector<double> loss(static_cast<std::size_t>(world));
    run_train_ranks(world, ep, [&](int rank, const TrainComms& comms) {
        auto device = make_device("cpu");
        Trainer t(config, *device, {world, rank, ep}, comms);
        const EvalMetrics e = t.evaluate();
        EXPECT_EQ(e.windows, t.eval_windows()->num_windows());
        EXPECT_EQ(e.tokens, e.windows * config.model.backbone.seq_len);
        loss[static_cast<std::size_t>(rank)] = e.loss;
    });
    for (int r = 1; r < world; ++r) EXPECT_EQ(loss[0], loss[static_cast<std::size_t>(r)]) << "rank " << r;
    return loss[0];
}

// The eval loss is what an outside implementation computes: the LM's forward CE over windows
// [w * S, w * S + S] of the file (read here with plain file I/O), one window per pass, mean per
// predicted byte; --eval-batches K caps the windows at the first K x batch x world.
TEST(TrainerEval, LossIsTheMeanCeOfTheLmForwardOverTheFirstWindows) {
    const fs::path dir = fresh_dir("eval_ce");
    const std::int64_t S = 16, file_windows = 11;
    const fs::path file = write_eval_text(dir, file_windows, S);
    TrainConfig config = eval_training(file);
    std::ifstream in(file, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    auto expected_loss = [&](std::int64_t windows) {
        auto device = make_device("cpu");
        LmConfig lm = config.model;
        lm.backbone.dtype = device->compute_dtype();
        LanguageModel model(lm, *device, S);
        model.init_params(config.seed);
        for (MoeLayer* layer : model.blocks().moe_layers()) layer->set_training(false);
        double sum = 0;
        std::vector<std::int32_t> inputs(S), targets(S);
        for (std::int64_t w = 0; w < windows; ++w) {
            for (std::int64_t t = 0; t < S; ++t) {
                inputs[t] = static_cast<unsigned char>(bytes[w * S + t]);
                targets[t] = static_cast<unsigned char>(bytes[w * S + t + 1]);
            }
            model.forward(inputs.data(), targets.data(), S);
            sum += model.loss_sum();
        }
        return sum / static_cast<double>(windows * S);
    };
    auto device = make_device("cpu");
    for (std::int64_t eval_batches : {0, 2}) {
        config.eval_batches = eval_batches;
        Trainer t(config, *device, {1, 0, 1}, {});
        const EvalMetrics e = t.evaluate();
        const std::int64_t windows = eval_batches == 0 ? file_windows : eval_batches * config.batch;
        EXPECT_EQ(e.windows, windows);
        EXPECT_EQ(e.tokens, windows * S);
        EXPECT_EQ(e.step, 0);
        const double want = expected_loss(windows);
        EXPECT_NEAR(e.loss, want, 1e-6 * want) << "eval_batches " << eval_batches;
        EXPECT_DOUBLE_EQ(e.ppl, std::exp(e.loss));
    }
    fs::remove_all(dir);
}

// The loss is summed over every rank's tokens: 1, 2 (ep 2) and 4 ranks (dp 2 x ep 2) agree, also
// where the shards differ in size (13 windows), a rank's last pass has no window left (batch 3), or
// a rank has no window at all (3 windows on 4 ranks).
TEST(TrainerEval, SameLossOnOneTwoAndFourRanks) {
    const fs::path dir = fresh_dir("eval_ranks");
    for (std::int64_t windows : {13, 3}) {
        TrainConfig config = eval_training(write_eval_text(dir, windows, 16));
        config.batch = 3;
        const double one = eval_on_ranks(config, 1, 1);
        EXPECT_NEAR(eval_on_ranks(config, 2, 2), one, 1e-6 * one) << windows << " windows";
        EXPECT_NEAR(eval_on_ranks(config, 4, 2), one, 1e-6 * one) << windows << " windows";
    }
    fs::remove_all(dir);
}

// Evaluation runs without gate noise: a model with a noisy gate evaluates exactly like the same
// parameters without one.
TEST(TrainerEval, NoGateNoise) {
    const fs::path dir = fresh_dir("eval_noise");
    TrainConfig config = eval_training(write_eval_text(dir, 8, 16));
    config.model.moe.dispatch = DispatchMode::kCapacity;
    auto device = make_device("cpu");
    Trainer quiet(config, *device, {1, 0, 1}, {});
    config.model.moe.noise_std = 1.0f;
    Trainer noisy(config, *device, {1, 0, 1}, {});
    EXPECT_EQ(noisy.evaluate().loss, quiet.evaluate().loss);
    fs::remove_all(dir);
}

// Evaluating before, between and after the steps changes nothing in training (a noisy gate,
// capacity dispatch, dp 2 x ep 2): the losses and the final parameters are bitwise those of a run
// that never evaluates; evaluating twice gives the same number.
TEST(TrainerEval, LeavesTrainingBitwiseUnchanged) {
    const int world = 4, ep = 2, steps = 4;
    const fs::path dir = fresh_dir("eval_bitwise");
    TrainConfig config = small_training(steps);
    config.model.moe.noise_std = 0.5f;
    config.eval_data = {write_eval_text(dir, 9, 16).string()};
    std::vector<RankRun> runs[2];
    for (int evaluating = 0; evaluating < 2; ++evaluating) {
        runs[evaluating].resize(world);
        run_train_ranks(world, ep, [&](int rank, const TrainComms& comms) {
            auto device = make_device("cpu");
            Trainer t(config, *device, {world, rank, ep}, comms);
            RankRun& run = runs[evaluating][static_cast<std::size_t>(rank)];
            if (evaluating) t.evaluate();
            for (int s = 0; s < steps; ++s) {
                run.losses.push_back(t.step().loss);
                if (evaluating) {
                    const double first = t.evaluate().loss;
                    EXPECT_EQ(t.evaluate().loss, first) << "rank " << rank << " step " << s + 1;
                }
            }
            run.params = all_params(t);
        });
    }
    expect_bitwise_same_runs(runs[0], runs[1]);
    fs::remove_all(dir);
}

// The held-out loss on the default corpus's held-out split starts near ln 256 and falls as the
// model trains on the rest of the corpus.
TEST(TrainerEval, HeldOutLossFallsWithTraining) {
    TrainConfig config = small_training(40);
    config.eval_data = {kDefaultHeldOut};
    std::vector<double> before(2), after(2);
    run_train_ranks(2, 2, [&](int rank, const TrainComms& comms) {
        auto device = make_device("cpu");
        Trainer t(config, *device, {2, rank, 2}, comms);
        before[static_cast<std::size_t>(rank)] = t.evaluate().loss;
        for (int s = 0; s < 40; ++s) t.step();
        after[static_cast<std::size_t>(rank)] = t.evaluate().loss;
    });
    EXPECT_NEAR(before[0], std::log(256.0), 0.5);
    EXPECT_LT(after[0], before[0] - 1.0) << "at init " << before[0] << ", after 40 steps " << after[0];
    EXPECT_EQ(before[0], before[1]);
    EXPECT_EQ(after[0], after[1]);
}

// The default corpus's last tenth is held out: training reads only the bytes before it, evaluation
// only those from it on, the same bytes as the files'; the split needs the default corpus.
TEST(TrainerEval, DefaultHeldOutSplitIsNeverTrainedOn) {
    const DefaultCorpus corpus = default_corpus();
    ASSERT_GT(corpus.held_out_begin, 0);
    EXPECT_EQ(corpus.total_bytes - corpus.held_out_begin, corpus.total_bytes / 10);
    TrainConfig config = small_training(2);
    config.eval_data = {kDefaultHeldOut};
    auto device = make_device("cpu");
    Trainer t(config, *device, {1, 0, 1}, {});
    EXPECT_EQ(t.batcher().data().size(), corpus.held_out_begin);
    const std::int64_t S = config.model.backbone.seq_len;
    EXPECT_LE(t.batcher().num_windows() * S + 1, corpus.held_out_begin);  // the last training byte read
    const EvalWindows& w = *t.eval_windows();
    ASSERT_EQ(w.data().size(), corpus.total_bytes - corpus.held_out_begin);
    ByteDataset whole(corpus.paths);
    std::vector<std::uint8_t> want(static_cast<std::size_t>(S + 1));
    whole.read(corpus.held_out_begin + 2 * S, S + 1, want.data());
    std::vector<std::int32_t> inputs(static_cast<std::size_t>(S)), targets(inputs.size());
    w.read(2, 1, inputs.data(), targets.data());
    for (std::int64_t i = 0; i < S; ++i) {
        EXPECT_EQ(inputs[static_cast<std::size_t>(i)], want[static_cast<std::size_t>(i)]) << "byte " << i;
        EXPECT_EQ(targets[static_cast<std::size_t>(i)], want[static_cast<std::size_t>(i + 1)]) << "byte " << i;
    }
    config.data = corpus.paths;
    try {
        Trainer with_data(config, *device, {1, 0, 1}, {});
        FAIL() << "eval data 'default' was accepted with explicit training files";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("held-out"), std::string::npos) << e.what();
    }
}

// A missing, empty or too short eval file is an error naming it; evaluate() without eval data throws.
TEST(TrainerEval, BadEvalDataIsAClearError) {
    const fs::path dir = fresh_dir("eval_bad");
    auto device = make_device("cpu");
    auto error_of = [&](const std::string& path) -> std::string {
        TrainConfig c = small_training(2);
        c.eval_data = {path};
        try {
            Trainer t(c, *device, {1, 0, 1}, {});
        } catch (const Error& e) {
            return e.what();
        }
        return "(accepted)";
    };
    const fs::path empty = dir / "empty.txt", short_file = dir / "short.txt";
    std::ofstream(empty).close();
    std::ofstream(short_file) << "sixteen bytes ok";  // seq 16 needs 17
    EXPECT_NE(error_of("/nonexistent/heldout.txt").find("eval data file '/nonexistent/heldout.txt'"), std::string::npos)
        << error_of("/nonexistent/heldout.txt");
    EXPECT_NE(error_of(empty.string()).find("'" + empty.string() + "' is empty"), std::string::npos)
        << error_of(empty.string());
    EXPECT_NE(error_of(short_file.string()).find("'" + short_file.string() + "' (16 bytes) is shorter than one window"),
              std::string::npos)
        << error_of(short_file.string());
    Trainer no_eval(small_training(2), *device, {1, 0, 1}, {});
    EXPECT_FALSE(no_eval.has_eval_data());
    EXPECT_THROW(no_eval.evaluate(), Error);
    fs::remove_all(dir);
}

// A held-out loss that is not finite on one rank (NaN in its copy of the embedding: the layer's NaN
// check fails there): rank 1 fails with its own cause, rank 0 names rank 1 and that cause (before:
// "the loss is not finite on another rank", and rank 0 never learnt which or why).
TEST(TrainerEval, NonFiniteLossNamesTheRank) {
    const fs::path dir = fresh_dir("eval_nan");
    const TrainConfig config = eval_training(write_eval_text(dir, 8, small_training(4).model.backbone.seq_len));
    std::vector<std::string> errors(2);
    run_train_ranks(2, 1, [&](int rank, const TrainComms& comms) {
        auto device = make_device("cpu");
        Trainer t(config, *device, {2, rank, 1}, comms);
        if (rank == 1) {
            const ParamGroup& g = t.model().param_groups().front();  // the embedding and head (f32 on CPU)
            for (std::int64_t i = 0; i < g.numel; ++i) static_cast<float*>(g.params)[i] = std::nanf("");
        }
        try {
            t.evaluate();
        } catch (const Error& e) {
            errors[static_cast<std::size_t>(rank)] = e.what();
        }
    });
    EXPECT_NE(errors[1].find("NaN/Inf"), std::string::npos) << errors[1];
    EXPECT_NE(errors[0].find("the held-out loss sum is not finite on rank 1 ("), std::string::npos) << errors[0];
    EXPECT_NE(errors[0].find("NaN/Inf"), std::string::npos) << "rank 0 names rank 1's cause: " << errors[0];
    EXPECT_EQ(errors[0].find("rank 0 ("), std::string::npos) << errors[0];
    fs::remove_all(dir);
}

}  // namespace
}  // namespace scmoe::models
