// The data-parallel gradient all-reduce (GradientReducer) on dp 2 x ep 2 in-process ranks: issued
// overlapped with the backward or after it, bitwise the same sums, in f32 and in bf16; in bf16
// (its wire dtype, TrainConfig's grad_reduce_dtype, scmoe-train --grad-reduce-dtype) each reduced
// gradient is the bf16 rounding of the sum of every contributing rank's bf16-rounded gradient (dense
// tensors over the world, expert tensors over their expert-data-parallel group).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "scmoe/kernels/math.h"
#include "scmoe/models/lm.h"
#include "scmoe/models/parallel.h"
#include "test_util.h"
#include "train_test_util.h"

namespace scmoe::models {
namespace {

using testing::random_tokens;
using testing::run_train_ranks;
using testing::small_lm;

constexpr int kWorld = 4, kEp = 2;
constexpr std::int64_t kTokens = 16;

// Every gradient of the rank, group after group.
std::vector<float> all_grads(LanguageModel& lm) {
    lm.blocks().synchronize();
    std::vector<float> out;
    for (const ParamGroup& g : lm.param_groups()) {
        const auto* p = static_cast<const float*>(g.grads);
        out.insert(out.end(), p, p + g.numel);
    }
    return out;
}

// Per element of all_grads: whether it belongs to an expert tensor.
std::vector<char> expert_mask(LanguageModel& lm) {
    std::vector<char> out;
    for (const ParamGroup& g : lm.param_groups()) {
        std::vector<char> mine(static_cast<std::size_t>(g.numel), 0);
        for (const NamedTensor& t : g.tensors)
            std::fill_n(mine.begin() + t.offset, t.numel(), static_cast<char>(t.expert ? 1 : 0));
        out.insert(out.end(), mine.begin(), mine.end());
    }
    return out;
}

struct RankGrads {
    std::vector<float> before, after;
    std::vector<char> expert;
};

// Each rank's gradients of its own batch before and after GradientReducer::reduce with `wire`.
std::vector<RankGrads> reduce_once(DType wire) {
    std::vector<RankGrads> out(kWorld);
    run_train_ranks(kWorld, kEp, [&](int rank, const TrainComms& comms) {
        auto device = make_device("cpu");
        LanguageModel lm(small_lm("scmoe-pos2"), *device, kTokens, comms.ep);
        lm.init_params(9);
        GradientReducer reducer(lm, {kWorld, rank, kEp}, comms, *device, wire);
        const auto in = random_tokens(kTokens, 100 + static_cast<std::uint64_t>(rank));
        const auto tgt = random_tokens(kTokens, 200 + static_cast<std::uint64_t>(rank));
        lm.forward_backward(in.data(), tgt.data(), kTokens, 1.0f / kTokens);
        lm.loss_sum();
        RankGrads& mine = out[static_cast<std::size_t>(rank)];
        mine.before = all_grads(lm);
        mine.expert = expert_mask(lm);
        reducer.reduce();
        mine.after = all_grads(lm);
    });
    return out;
}

TEST(GradReduceBf16, SumsTheRoundedGradientsOfTheGroup) {
    const std::vector<RankGrads> f32 = reduce_once(DType::kF32), bf16 = reduce_once(DType::kBF16);
    std::int64_t rounded_differently = 0, checked = 0;
    for (int rank = 0; rank < kWorld; ++rank) {
        const ParallelLayout me{kWorld, rank, kEp};
        const RankGrads& mine = bf16[static_cast<std::size_t>(rank)];
        ASSERT_EQ(mine.before, f32[static_cast<std::size_t>(rank)].before) << "the same backward before the sum";
        for (std::size_t i = 0; i < mine.after.size(); ++i) {
            // Dense: every rank contributes; expert: the ranks that hold the same expert slice.
            float want = 0, exact = 0;
            for (int q = 0; q < kWorld; ++q) {
                const ParallelLayout peer{kWorld, q, kEp};
                if (mine.expert[i] && peer.ep_rank() != me.ep_rank()) continue;
                const float g = bf16[static_cast<std::size_t>(q)].before[i];
                want += math::round_to_bf16(g);
                exact += g;
            }
            want = math::round_to_bf16(want);
            ASSERT_EQ(mine.after[i], want) << "rank " << rank << " element " << i;
            EXPECT_EQ(f32[static_cast<std::size_t>(rank)].after[i], exact) << "rank " << rank << " element " << i;
            rounded_differently += mine.after[i] != exact;
            ++checked;
        }
    }
    // The property is not vacuous: the bf16 sums differ from the exact ones somewhere.
    EXPECT_GT(rounded_differently, checked / 10) << "of " << checked;
}

// Overlapped (grads_ready + finish) and after the backward (reduce): the same sums, bitwise, in f32
// and in bf16; finish() without every stage announced once is an error, not a silent partial sum.
TEST(GradReduce, OverlappedEqualsAfterBackward) {
    LmConfig c = small_lm("scmoe-pos2");
    c.layers = 4;
    for (DType wire : {DType::kF32, DType::kBF16}) {
        run_train_ranks(kWorld, kEp, [&](int rank, const TrainComms& comms) {
            auto device = make_device("cpu");
            LanguageModel lm(c, *device, kTokens, comms.ep);
            lm.init_params(9);
            GradientReducer reducer(lm, {kWorld, rank, kEp}, comms, *device, wire);
            const auto in = random_tokens(kTokens, 300 + static_cast<std::uint64_t>(rank));
            const auto tgt = random_tokens(kTokens, 400 + static_cast<std::uint64_t>(rank));
            lm.forward_backward(in.data(), tgt.data(), kTokens, 1.0f / kTokens);
            reducer.reduce();
            lm.loss_sum();
            const std::vector<float> after = all_grads(lm);
            lm.forward_backward(in.data(), tgt.data(), kTokens, 1.0f / kTokens, true, nullptr, reducer.grads_ready());
            reducer.finish();
            lm.loss_sum();
            const std::vector<float> overlapped = all_grads(lm);
            ASSERT_EQ(after.size(), overlapped.size());
            EXPECT_EQ(0, std::memcmp(after.data(), overlapped.data(), after.size() * sizeof(float)))
                << dtype_name(wire) << " rank " << rank;
            EXPECT_THROW(reducer.finish(), Error);
        });
    }
}

TEST(GradReduceBf16, OtherWireDtypesAreRefused) {
    auto device = make_device("cpu");
    LanguageModel lm(small_lm(), *device, kTokens);
    EXPECT_THROW(GradientReducer(lm, {1, 0, 1}, {}, *device, DType::kI32), Error);
}

}  // namespace
}  // namespace scmoe::models
