// Expert parallelism with in-process ranks (LocalCommunicator, one thread per rank): the
// distributed layer's output, dropped-token count and every gradient equal the single-rank layer
// run on each rank's tokens (fp32, relative 1e-5), for ep = 2 and 4, dp x ep = 2 x 2, top-1 and
// top-2, capacity and dropless, a rank with zero tokens, skewed token counts.
#include <gtest/gtest.h>

#include <exception>
#include <thread>

#include "comm/local_communicator.h"
#include "ep_reference.h"

namespace scmoe {
namespace {

using testing::EpCase;

constexpr double kTol = 1e-5;

class MoeEpLocalRanks : public ::testing::TestWithParam<EpCase> {};

TEST_P(MoeEpLocalRanks, EqualsSingleRankLayer) {
    const EpCase& c = GetParam();
    const int world = c.dp * c.ep;
    ASSERT_EQ(static_cast<int>(c.tokens.size()), world);
    std::vector<testing::RankReference> refs;
    for (int w = 0; w < world; ++w) refs.push_back(testing::single_rank_reference(c, w));

    std::vector<std::shared_ptr<LocalGroup>> groups;
    for (int d = 0; d < c.dp; ++d) groups.push_back(LocalGroup::create(c.ep, 60.0));
    std::vector<std::string> errors(static_cast<std::size_t>(world));
    std::vector<std::thread> threads;
    for (int w = 0; w < world; ++w) {
        threads.emplace_back([&, w] {
            try {
                auto comm = groups[static_cast<std::size_t>(w / c.ep)]->communicator(w % c.ep);
                errors[static_cast<std::size_t>(w)] = testing::run_ep_rank(c, w, *comm, refs, kTol);
            } catch (const std::exception& e) {
                errors[static_cast<std::size_t>(w)] = std::string("world rank ") + std::to_string(w) + " threw: " + e.what();
            }
        });
    }
    for (auto& t : threads) t.join();
    for (const std::string& e : errors) EXPECT_EQ(e, "");
}

const auto kCap = DispatchMode::kCapacity;
const auto kDropless = DispatchMode::kDropless;

INSTANTIATE_TEST_SUITE_P(
    Cpu, MoeEpLocalRanks,
    ::testing::Values(EpCase{"ep2_top1_capacity", 1, 2, 1, kCap, {12, 12}, false},
                      EpCase{"ep2_top2_dropless", 1, 2, 2, kDropless, {12, 9}, false},
                      EpCase{"ep2_top2_capacity_shared", 1, 2, 2, kCap, {10, 10}, true},
                      EpCase{"ep4_top2_capacity", 1, 4, 2, kCap, {8, 8, 8, 8}, false},
                      EpCase{"ep4_top1_dropless_zero_token_rank", 1, 4, 1, kDropless, {9, 0, 5, 13}, false},
                      EpCase{"ep4_top2_capacity_uneven", 1, 4, 2, kCap, {16, 3, 0, 7}, true},
                      EpCase{"dp2_ep2_top2_dropless", 2, 2, 2, kDropless, {6, 11, 8, 4}, false},
                      EpCase{"dp2_ep2_top1_capacity", 2, 2, 1, kCap, {10, 10, 10, 10}, true}),
    [](const ::testing::TestParamInfo<EpCase>& param_info) { return param_info.param.name; });

TEST(MoeEpLocalRanks, MismatchedConfigGivesTheSameErrorOnEveryRank) {
    auto group = LocalGroup::create(2, 30.0);
    std::vector<std::string> errors(2);
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r) {
        threads.emplace_back([&, r] {
            MoeConfig c = testing::ep_config(EpCase{});
            if (r == 1) c.ffn = 16;  // rank 1 disagrees
            auto comm = group->communicator(r);
            auto device = make_device("cpu");
            try {
                MoeLayer layer(c, *device, 8, comm.get());
            } catch (const Error& e) {
                errors[static_cast<std::size_t>(r)] = e.what();
            }
        });
    }
    for (auto& t : threads) t.join();
    for (const std::string& e : errors) EXPECT_NE(e.find("MoeConfig differs across the 2 expert-parallel ranks"), std::string::npos) << e;
    // Same table of hashes on both ranks.
    auto table = [](const std::string& e) { return e.substr(0, e.find("this is rank")); };
    EXPECT_EQ(table(errors[0]), table(errors[1]));
}

TEST(MoeEpLocalRanks, ExpertsNotDivisibleByEpIsRejected) {
    auto group = LocalGroup::create(3, 5.0);
    MoeConfig c = testing::ep_config(EpCase{});  // 8 experts
    auto comm = group->communicator(0);
    auto device = make_device("cpu");
    try {
        MoeLayer layer(c, *device, 8, comm.get());
        FAIL() << "8 experts over 3 ranks accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("not divisible by the expert-parallel size 3"), std::string::npos) << e.what();
    }
}

}  // namespace
}  // namespace scmoe
