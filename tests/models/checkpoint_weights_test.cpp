// Loading a checkpoint's weights for inference (open_checkpoint_weights / load_checkpoint_weights,
// scmoe/models/checkpoint.h): a checkpoint written by 2 expert-parallel ranks loads into 1 rank and
// into 4, every tensor bitwise the trainer's (dense tensors, and each expert by its global index);
// a corrupted expert file is refused naming it; a model of another shape is refused naming the field.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "scmoe/kernels/error.h"
#include "scmoe/models/checkpoint.h"
#include "scmoe/models/lm.h"
#include "scmoe/models/trainer.h"
#include "test_util.h"
#include "train_test_util.h"

namespace scmoe::models {
namespace {

namespace fs = std::filesystem;
using testing::fresh_dir;
using testing::run_train_ranks;
using testing::small_training;

// name ("blocks.1.moe.expert_w1.3" for expert 3) -> values, for every tensor a rank holds.
using Named = std::map<std::string, std::vector<float>>;

void collect(LanguageModel& lm, Named& out) {
    lm.blocks().synchronize();
    for (const ParamGroup& g : lm.param_groups())
        for (const NamedTensor& t : g.tensors) {
            const auto* p = static_cast<const float*>(g.params) + t.offset;
            const std::int64_t parts = t.expert ? t.shape[0] : 1, per = t.numel() / parts;
            for (std::int64_t e = 0; e < parts; ++e)
                out[t.expert ? t.name + "." + std::to_string(t.first_expert + e) : t.name] =
                    std::vector<float>(p + e * per, p + (e + 1) * per);
        }
}

// The tensors of a world-`world` (= ep) model loaded from `dir`, every rank's merged.
Named load_on(int world, const std::string& dir) {
    Named all;
    std::mutex mu;
    const CheckpointWeights w = open_checkpoint_weights(dir);
    auto load = [&](Communicator* ep) {
        auto device = make_device("cpu");
        LanguageModel lm(w.config, *device, w.config.backbone.seq_len, ep);
        load_checkpoint_weights(w, lm);
        Named mine;
        collect(lm, mine);
        std::lock_guard<std::mutex> lock(mu);
        all.insert(mine.begin(), mine.end());
    };
    if (world == 1) load(nullptr);
    else run_train_ranks(world, world, [&](int, const TrainComms& comms) { load(comms.ep); });
    return all;
}

TEST(CheckpointWeights, AnyExpertParallelSizeLoadsTheTrainersTensorsBitwise) {
    const TrainConfig config = small_training(2);
    const fs::path dir = fresh_dir("ckpt_weights");
    Named trained;
    std::mutex mu;
    run_train_ranks(2, 2, [&](int rank, const TrainComms& comms) {
        auto device = make_device("cpu");
        Trainer t(config, *device, {2, rank, 2}, comms);
        t.step();
        t.step();
        t.save(dir.string());
        Named mine;
        collect(t.model(), mine);
        std::lock_guard<std::mutex> lock(mu);
        trained.insert(mine.begin(), mine.end());
    });
    const CheckpointWeights w = open_checkpoint_weights(dir.string());
    EXPECT_EQ(w.state.step, 2);
    EXPECT_EQ(w.state.ep, 2);
    for (int world : {1, 4}) {
        const Named loaded = load_on(world, dir.string());
        ASSERT_EQ(loaded.size(), trained.size()) << world << " rank(s)";
        for (const auto& [name, values] : trained) {
            const auto it = loaded.find(name);
            ASSERT_NE(it, loaded.end()) << name;
            EXPECT_EQ(it->second, values) << name << " on " << world << " rank(s)";
        }
    }

    // A corrupted expert file is refused, naming it.
    const fs::path experts = fs::path(w.dir) / "experts-00002-of-00002.safetensors";
    {
        std::fstream f(experts, std::ios::in | std::ios::out | std::ios::binary);
        f.seekp(-3, std::ios::end);
        f.put('\x7f');
    }
    try {
        load_on(1, dir.string());
        FAIL() << "a corrupted expert file was loaded";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("experts-00002-of-00002.safetensors: checksum mismatch"), std::string::npos)
            << e.what();
    }

    // A model of another shape is refused, naming the field.
    LmConfig other = w.config;
    other.backbone.ffn *= 2;
    auto device = make_device("cpu");
    LanguageModel lm(other, *device, other.backbone.seq_len);
    try {
        load_checkpoint_weights(w, lm);
        FAIL() << "weights of another shape were loaded";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("ffn"), std::string::npos) << e.what();
    }
    fs::remove_all(dir);
}

}  // namespace
}  // namespace scmoe::models
