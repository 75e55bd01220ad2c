// The stack's gradient all-reduce (emu::Stack::grad_reduce, grad_reduce_dtype): the paper stack sums
// fp16-sized gradients after the backward, as fairseq's legacy_ddp under --fp16 does; scmoe overlaps
// f32 sums with the backward. launch::apply_grad_reduce carries it into an emulated training run,
// where the traced all-reduce then sits on the model's stream, at half the bytes.
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "launch/emu_choice.h"
#include "launch/emu_stack.h"
#include "launch/train_comms.h"
#include "models/train_test_util.h"
#include "scmoe/moe/trace.h"

namespace scmoe {
namespace {

TEST(EmuGradReduce, ThePaperStackSumsHalfPrecisionGradientsAfterTheBackward) {
    const emu::Stack& paper = emu::builtin_stack("paper");
    EXPECT_EQ(paper.grad_reduce, emu::GradReduce::kAfterBackward);
    EXPECT_EQ(paper.grad_reduce_dtype, DType::kBF16);
    const emu::Stack& scmoe = emu::builtin_stack("scmoe");
    EXPECT_EQ(scmoe.grad_reduce, emu::GradReduce::kOverlapped);
    EXPECT_EQ(scmoe.grad_reduce_dtype, DType::kF32);
    models::TrainConfig config;
    launch::apply_grad_reduce(paper, config);
    EXPECT_FALSE(config.overlap_grad_reduce);
    EXPECT_EQ(config.grad_reduce_dtype, DType::kBF16);
    launch::apply_grad_reduce(scmoe, config);
    EXPECT_TRUE(config.overlap_grad_reduce);
    EXPECT_EQ(config.grad_reduce_dtype, DType::kF32);
    EXPECT_NE(emu::describe(paper).find("gradient all-reduce after the backward in bf16"), std::string::npos)
        << emu::describe(paper);
}

// Rank 0's gradient all-reduce entries in the second step of an emulated dp-only run (2 A800s on
// NVLink, every expert on each rank so only the dense gradients travel, over the world) under
// `stack`, its dtype optionally overridden as scmoe-train's --grad-reduce-dtype would.
struct GradReduceTrace {
    std::vector<std::string> lanes;
    double us = 0;
};
GradReduceTrace traced_grad_reduce(const std::string& stack, std::optional<DType> wire = std::nullopt) {
    const int world = 2;
    models::TrainConfig config = testing::small_training(2);
    config.model.backbone.hidden = 1024;  // tens of MB of gradients: the bytes, not the latencies and
    config.model.backbone.ffn = 4096;     // the per-op host times, set the all-reduce's time
    config.model.moe.ffn = 4096;
    launch::apply_grad_reduce(launch::load_stack(stack), config);
    if (wire) config.grad_reduce_dtype = *wire;
    launch::EmuChoice choice = launch::resolve_emu_choice("a800", "balanced", launch::ClusterFlags{}, world);
    choice.stack = stack;
    launch::LocalTrainGroups groups(world, 1, launch::emulated_topology(choice.topology, stack));
    GradReduceTrace out;
    launch::run_local_ranks(groups, world, [&](int rank, const launch::RankComms& comms) {
        auto device = launch::make_emu_device(choice);
        models::Trainer t(config, *device, {world, rank, 1}, comms.comms());
        t.step();
        Tracer trace(*device, rank);
        t.set_trace(&trace);
        t.step();
        t.set_trace(nullptr);
        trace.collect();
        if (rank != 0) return;
        for (const TraceEntry& e : trace.entries())
            if (e.name.rfind("grad_allreduce", 0) == 0) out.lanes.push_back(e.lane), out.us += e.duration_us;
    });
    return out;
}

TEST(EmuGradReduce, AnEmulatedRunReducesAsItsStackSays) {
    const GradReduceTrace scmoe = traced_grad_reduce("scmoe");
    const GradReduceTrace paper = traced_grad_reduce("paper");
    const GradReduceTrace paper_f32 = traced_grad_reduce("paper", DType::kF32);
    ASSERT_FALSE(scmoe.lanes.empty());
    ASSERT_FALSE(paper.lanes.empty());
    for (const std::string& lane : scmoe.lanes) EXPECT_EQ(lane, "grad_reduce");  // the reducer's own stream
    for (const std::string& lane : paper.lanes) EXPECT_EQ(lane, "backbone");     // behind the backward
    // Half the bytes on the wire, two conversions around them: less time than the f32 sums, yet
    // more than half of it.
    EXPECT_LT(paper.us, paper_f32.us);
    EXPECT_GT(paper.us, 0.5 * paper_f32.us);
}

}  // namespace
}  // namespace scmoe
