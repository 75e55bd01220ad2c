// The block variants (block_variant, scmoe/moe/block_stack.h): topK for any K up to the router's
// limit is the standard pair with K routed experts, the every-block baselines put their MoE in every
// block, and unknown names and absurd K are refused naming the valid ones.
#include <gtest/gtest.h>

#include <string>

#include "block_test_util.h"

namespace scmoe {
namespace {

// The paper's other workloads: topK for any K up to the router's limit (standard MoE in every other
// block, like the pair variants) and the LLaMA2-MoE baselines with an MoE in every block.
TEST(BlockVariants, TopKIsTheStandardPairWithKRoutedExperts) {
    for (int k = 1; k <= 4; ++k) {
        const std::string name = "top" + std::to_string(k);
        ASSERT_TRUE(is_block_variant(name)) << name;
        ASSERT_TRUE(block_variant_is_pair(name)) << name;
        const BlockStackConfig c = testing::small_variant(name);  // 4 experts
        EXPECT_EQ(c.moe.top_k, k) << name;
        EXPECT_FALSE(c.moe.shared_expert) << name;
        ASSERT_EQ(c.blocks.size(), 2u) << name;
        EXPECT_EQ(c.blocks[0].ffn, FfnKind::kDense) << name;
        EXPECT_EQ(c.blocks[1].ffn, FfnKind::kMoe) << name;
        EXPECT_EQ(c.blocks[1].shortcut, ShortcutSource::kCurrent) << name;
    }
    EXPECT_TRUE(is_block_variant("top8"));
    for (const char* bad : {"top0", "top9", "top03", "top", "top-3", "top3x", "every-block-top3"})
        EXPECT_FALSE(is_block_variant(bad)) << bad;
    auto error_of = [](const std::string& name) -> std::string {
        try {
            MoeConfig moe = testing::small_moe();
            moe.num_experts = 16;
            block_variant(name, testing::small_backbone(), moe);
        } catch (const Error& e) {
            return e.what();
        }
        return "";
    };
    EXPECT_NE(error_of("top9").find("top-9 exceeds the router's limit of 8 experts per token (top1 .. top8)"),
              std::string::npos)
        << error_of("top9");
    EXPECT_NE(error_of("top0").find("unknown block variant 'top0'"), std::string::npos) << error_of("top0");
    EXPECT_NE(error_of("top0").find("every-block-shared, dense; topK for any K in 1..8"), std::string::npos)
        << error_of("top0");
    // More routed experts per token than there are experts: MoeConfig names it.
    try {
        testing::small_variant("top5");
        ADD_FAILURE() << "top5 of 4 experts accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("MoeConfig.top_k = 5: exceeds num_experts = 4"), std::string::npos)
            << e.what();
    }
}

TEST(BlockVariants, EveryBlockBaselinesPutTheirMoeInEveryBlock) {
    struct Want {
        const char* name;
        int top_k;
        bool shared;
        ShortcutSource shortcut;
    };
    for (const Want& w : {Want{"every-block-pos1", 1, true, ShortcutSource::kPos1},
                          Want{"every-block-top2", 2, false, ShortcutSource::kCurrent},
                          Want{"every-block-shared", 1, true, ShortcutSource::kCurrent}}) {
        ASSERT_TRUE(is_block_variant(w.name)) << w.name;
        EXPECT_FALSE(block_variant_is_pair(w.name)) << w.name;
        for (bool cg : {true, false}) {
            const BlockStackConfig c =
                block_variant(w.name, testing::small_backbone(), testing::small_moe(), cg, 5);
            EXPECT_EQ(c.moe.top_k, w.top_k) << w.name;
            EXPECT_EQ(c.moe.shared_expert, w.shared) << w.name;
            EXPECT_EQ(c.moe.coefficient_gate, w.shared && cg) << w.name;
            ASSERT_EQ(c.blocks.size(), 5u) << w.name;
            for (const BlockSpec& b : c.blocks) {
                EXPECT_EQ(b.ffn, FfnKind::kMoe) << w.name;
                EXPECT_EQ(b.shortcut, w.shortcut) << w.name;
            }
        }
    }
}

}  // namespace
}  // namespace scmoe
