// Ranks started with different training settings fail at construction, every rank naming the rank
// and the setting that differ, before any collective depends on them (Trainer::agree_on_settings,
// check_same_on_every_rank); settings that may differ per rank (the data paths) do not.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "scmoe/models/data.h"
#include "scmoe/models/trainer.h"
#include "train_test_util.h"

namespace scmoe::models {
namespace {

// Each rank's construction error ("" when it built), on `world` in-process ranks; `vary` changes
// the config of rank 1.
std::vector<std::string> construct(int world, int ep, const std::function<void(TrainConfig&)>& vary) {
    std::vector<std::string> errors(static_cast<std::size_t>(world));
    launch::LocalTrainGroups groups(world, ep, std::nullopt);
    launch::run_local_ranks(groups, world, [&](int rank, const launch::RankComms& comms) {
        TrainConfig config = testing::small_training(2);
        if (rank == 1) vary(config);
        auto device = make_device("cpu");
        try {
            Trainer t(config, *device, {world, rank, ep}, comms.comms());
        } catch (const Error& e) {
            errors[static_cast<std::size_t>(rank)] = e.what();
        }
    });
    return errors;
}

TEST(TrainerSettings, EveryRankNamesTheRankAndSettingThatDiffer) {
    const struct {
        const char* name;
        std::function<void(TrainConfig&)> vary;
        const char* says;
    } cases[] = {
        {"seed", [](TrainConfig& c) { c.seed = 99; }, "rank 1 has seed 99 (rank 0: 7)"},
        {"hidden", [](TrainConfig& c) { c.model.backbone.hidden = 64; }, "rank 1 has model hidden 64 (rank 0: 32)"},
        {"wire", [](TrainConfig& c) { c.grad_reduce_dtype = DType::kBF16; },
         "gradient all-reduce overlapped in bf16 (rank 0: overlapped in f32)"},
        {"batch", [](TrainConfig& c) { c.batch = 2; }, "rank 1 has batch 2 (rank 0: 4)"},
    };
    for (const auto& c : cases) {
        const std::vector<std::string> errors = construct(4, 2, c.vary);
        for (std::size_t r = 0; r < errors.size(); ++r) {
            EXPECT_NE(errors[r].find("training settings: the ranks disagree"), std::string::npos)
                << c.name << ", rank " << r << ": " << errors[r];
            EXPECT_NE(errors[r].find(c.says), std::string::npos) << c.name << ", rank " << r << ": " << errors[r];
        }
    }
}

TEST(TrainerSettings, DataPathsMayDifferPerRank) {
    const std::vector<std::string> errors = construct(2, 2, [](TrainConfig& c) {
        c.data = default_corpus().paths;  // rank 0 reads the default corpus, rank 1 names its files
    });
    for (std::size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

}  // namespace
}  // namespace scmoe::models
