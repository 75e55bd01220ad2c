// What a trainer that embeds MoeLayer needs for data x expert parallelism, with in-process ranks
// (LocalCommunicator, one thread per rank):
// - all_reduce_moe_grads sums each gradient over the group moe_param_specs names: the dense ones
//   (gate, shared expert, CG-1) over every rank, the expert slices over the ranks holding the same
//   experts; groups of the wrong size are refused before anything is enqueued;
// - constructing the expert-parallel layers of two ranks from one thread fails with an error that
//   names the constructor and says what to do, instead of a bare communicator timeout.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "scmoe/comm/local_communicator.h"
#include "scmoe/moe/grad_reduction.h"
#include "test_util.h"

namespace scmoe {
namespace {

MoeConfig small_config() {
    MoeConfig c;
    c.hidden = 8;
    c.ffn = 12;
    c.num_experts = 4;
    c.top_k = 2;
    c.shared_expert = true;
    c.coefficient_gate = true;
    return c;
}

// A value no sum of other ranks' values can produce by accident: element i of rank w.
float value(int w, std::size_t i) { return static_cast<float>(1 << w) + 0.001f * static_cast<float>(i % 97); }

TEST(MoeGradGroups, DenseOverEveryRankExpertsOverTheirReplicas) {
    const auto specs = moe_param_specs(small_config(), 2);
    for (const ParamSpec& s : specs) {
        const bool expert = s.name == "expert_w1" || s.name == "expert_w2";
        EXPECT_EQ(s.reduce_over, expert ? GradGroup::kExpertReplicas : GradGroup::kDataParallel) << s.name;
    }
    EXPECT_STREQ(grad_group_name(GradGroup::kExpertReplicas), "expert-replicas");
}

// world 4 = dp 2 x ep 2: ep groups {0, 1} and {2, 3}; the expert replicas of ep rank r are {r, r + 2}.
TEST(MoeGradReduction, SumsDenseOverTheWorldAndExpertsOverTheirReplicas) {
    constexpr int kEp = 2, kDp = 2, kWorld = kEp * kDp;
    const MoeConfig cfg = small_config();
    auto world = LocalGroup::create(kWorld, 60.0);
    std::vector<std::shared_ptr<LocalGroup>> replicas{LocalGroup::create(kDp, 60.0), LocalGroup::create(kDp, 60.0)};
    std::vector<std::vector<float>> result(kWorld);
    std::vector<std::string> errors(kWorld);
    std::vector<std::thread> threads;
    for (int w = 0; w < kWorld; ++w) {
        threads.emplace_back([&, w] {
            try {
                testing::Cpu cpu;
                auto dp_comm = world->communicator(w);
                auto replica_comm = replicas[static_cast<std::size_t>(w % kEp)]->communicator(w / kEp);
                MoeParamStore grads(*cpu.device, cfg, DType::kF32, kEp);
                auto* g = static_cast<float*>(grads.data());
                for (std::int64_t i = 0; i < grads.numel(); ++i) g[i] = value(w, static_cast<std::size_t>(i));
                all_reduce_moe_grads(cfg, grads.view(), kEp, dp_comm.get(), replica_comm.get(), *cpu.stream);
                cpu.stream->synchronize();
                result[static_cast<std::size_t>(w)].assign(g, g + grads.numel());
            } catch (const std::exception& e) {
                errors[static_cast<std::size_t>(w)] = e.what();
            }
        });
    }
    for (auto& t : threads) t.join();
    for (const std::string& e : errors) ASSERT_EQ(e, "");

    // Which store elements belong to which group (the store lays the tensors out in spec order).
    std::vector<GradGroup> group_of;
    for (const ParamSpec& s : moe_param_specs(cfg, kEp))
        group_of.insert(group_of.end(), static_cast<std::size_t>(s.numel()), s.reduce_over);
    int dense = 0, expert = 0;
    for (int w = 0; w < kWorld; ++w) {
        ASSERT_EQ(result[static_cast<std::size_t>(w)].size(), group_of.size());
        for (std::size_t i = 0; i < group_of.size(); ++i) {
            float want = 0.0f;
            for (int v = 0; v < kWorld; ++v)
                if (group_of[i] == GradGroup::kDataParallel || v % kEp == w % kEp) want += value(v, i);
            ASSERT_FLOAT_EQ(result[static_cast<std::size_t>(w)][i], want)
                << "rank " << w << " element " << i << " (" << grad_group_name(group_of[i]) << ")";
            (group_of[i] == GradGroup::kDataParallel ? dense : expert) += w == 0;
        }
    }
    EXPECT_GT(dense, 0);
    EXPECT_GT(expert, 0);
}

TEST(MoeGradReduction, RefusesGroupsThatDoNotFit) {
    const MoeConfig cfg = small_config();
    testing::Cpu cpu;
    MoeParamStore grads(*cpu.device, cfg, DType::kF32, 2);
    auto world = LocalGroup::create(3, 5.0), replicas = LocalGroup::create(2, 5.0);
    auto w = world->communicator(0);
    auto r = replicas->communicator(0);
    try {
        all_reduce_moe_grads(cfg, grads.view(), 2, w.get(), r.get(), *cpu.stream);
        FAIL() << "a world of 3 with ep 2 x 2 replicas was taken";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("data-parallel group has 3 ranks, but ep_size 2 x the expert-replica "
                                             "group's 2 ranks = 4"),
                  std::string::npos)
            << e.what();
    }
    // Gradients of another ep size (4 local experts instead of 2) are refused, naming the tensor.
    MoeParamStore whole(*cpu.device, cfg, DType::kF32, 1);
    EXPECT_THROW(all_reduce_moe_grads(cfg, whole.view(), 2, nullptr, nullptr, *cpu.stream), Error);
    // One rank, no communicators: nothing to sum, nothing changes.
    testing::fill_uniform(static_cast<float*>(whole.data()), whole.numel(), 1.0f, 3);
    const std::vector<float> before(static_cast<float*>(whole.data()), static_cast<float*>(whole.data()) + whole.numel());
    all_reduce_moe_grads(cfg, whole.view(), 1, nullptr, nullptr, *cpu.stream);
    cpu.stream->synchronize();
    EXPECT_TRUE(testing::bitwise_equal(
        before, std::vector<float>(static_cast<float*>(whole.data()), static_cast<float*>(whole.data()) + whole.numel())));
}

// The layers of two expert-parallel ranks constructed one after the other from one thread: the
// first constructor's config check waits for a peer that never comes. The error names the
// constructor and the remedy (the communicator's timeout is 1 s here).
TEST(MoeLayerConstruction, TwoRanksFromOneThreadNamesTheConstructor) {
    const MoeConfig cfg = small_config();
    auto group = LocalGroup::create(2, 1.0);
    auto c0 = group->communicator(0);
    auto c1 = group->communicator(1);
    testing::Cpu cpu;
    try {
        MoeLayer rank0(cfg, *cpu.device, 8, c0.get());
        MoeLayer rank1(cfg, *cpu.device, 8, c1.get());
        FAIL() << "two ranks' layers were constructed from one thread";
    } catch (const Error& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find("MoeLayer constructor on expert-parallel rank 0 of 2"), std::string::npos) << what;
        EXPECT_NE(what.find("each from its own thread"), std::string::npos) << what;
        EXPECT_NE(what.find("rank 1"), std::string::npos) << "the communicator's part names the missing rank: " << what;
        std::printf("the error: %s\n", what.c_str());
    }
}

}  // namespace
}  // namespace scmoe
