// Capacity mode pads every expert to its capacity, as Tutel's fast_dispatch does (the `paper` stack
// relies on it; docs/emu-sources.md, "Stacks"): the expert-parallel layer's all-to-all and expert
// GEMMs run over E x C rows whatever the routing keeps, so a skewed routing (most assignments on a
// few experts, many dropped) costs the same modeled time as a balanced one. Dropless runs over the
// kept rows: there the routing changes the time.
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "scmoe/comm/emu_communicator.h"
#include "scmoe/comm/topology.h"
#include "scmoe/kernels/emu/emu_device.h"
#include "scmoe/kernels/emu/gpu_spec.h"
#include "scmoe/kernels/emu/routing.h"
#include "scmoe/moe/moe_layer.h"
#include "scmoe/moe/params.h"

namespace scmoe {
namespace {

struct StageTimes {
    double dispatch_us = 0, experts_us = 0, collect_us = 0;
    MoeStats stats;
};

// Rank 0's modeled times of one forward's dispatch, experts and collect stages on two emulated
// A800s (expert parallel, 4 of the 8 experts each): 1024 tokens per rank, hidden 256, ffn 512, top-2,
// bf16, capacity factor 2.0 in capacity mode.
StageTimes stage_times(DispatchMode mode, const std::string& routing) {
    auto group = EmuGroup::create(cluster_topology("a800-nvlink-8"), {0, 1});
    std::vector<StageTimes> times(2);
    std::vector<std::string> errors(2);
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r)
        threads.emplace_back([&, r] {
            try {
                emu::EmuOptions o;
                o.spec = emu::builtin_gpu_spec("a800");
                o.routing = emu::parse_routing_model(routing);
                auto device = emu::make_device(o);
                auto comm = group->communicator(r);
                MoeConfig c;
                c.hidden = 256, c.ffn = 512, c.num_experts = 8, c.top_k = 2;
                c.activation = Activation::kGeLU, c.dtype = DType::kBF16;
                c.dispatch = mode, c.capacity_factor = 2.0f;
                const std::int64_t T = 1024;
                MoeLayer layer(c, *device, T, comm.get());
                MoeParamStore params(*device, c, DType::kBF16, 2);
                DeviceBuffer x(*device, T * c.hidden * 2), y(*device, T * c.hidden * 2);
                Tensor in(x.data(), DType::kBF16, {T, c.hidden}), out(y.data(), DType::kBF16, {T, c.hidden});
                auto stream = device->create_stream();
                auto e0 = device->create_event(), e1 = device->create_event(), e2 = device->create_event(),
                     e3 = device->create_event();
                layer.route(in, params.view(), *stream);
                layer.permute(*stream);
                e0->record(*stream);
                layer.dispatch(*stream);
                e1->record(*stream);
                layer.experts(params.view(), *stream);
                e2->record(*stream);
                layer.collect(*stream);
                e3->record(*stream);
                layer.combine(out, *stream);
                stream->synchronize();
                StageTimes& t = times[static_cast<std::size_t>(r)];
                t.dispatch_us = e1->elapsed_ms_since(*e0) * 1000.0;
                t.experts_us = e2->elapsed_ms_since(*e1) * 1000.0;
                t.collect_us = e3->elapsed_ms_since(*e2) * 1000.0;
                t.stats = layer.stats(*stream);
            } catch (const std::exception& e) {
                errors[static_cast<std::size_t>(r)] = e.what();
            }
        });
    for (auto& t : threads) t.join();
    for (int r = 0; r < 2; ++r) EXPECT_EQ(errors[static_cast<std::size_t>(r)], "") << "rank " << r;
    return times[0];
}

TEST(EmuCapacityPadding, CapacityModeChargesEveryExpertsFullCapacityWhateverTheRoutingKeeps) {
    const StageTimes balanced = stage_times(DispatchMode::kCapacity, "balanced");
    const StageTimes skewed = stage_times(DispatchMode::kCapacity, "zipf:2");
    // C = ceil(2.0 * 1024 * 2 / 8) = 512 rows per expert: E x C = 4096 rows leave each rank, twice the
    // 2048 assignments. Under zipf:2 the first experts overflow: assignments are dropped, so the kept
    // rows are fewer than under balanced routing.
    EXPECT_EQ(balanced.stats.capacity, 512);
    EXPECT_EQ(skewed.stats.capacity, 512);
    EXPECT_EQ(balanced.stats.dropped_tokens, 0);
    EXPECT_GT(skewed.stats.dropped_tokens, 100);
    // The charged time follows the E x C padded rows, not the kept ones: bit for bit the same.
    EXPECT_GT(balanced.experts_us, 0);
    EXPECT_EQ(skewed.dispatch_us, balanced.dispatch_us);
    EXPECT_EQ(skewed.experts_us, balanced.experts_us);
    EXPECT_EQ(skewed.collect_us, balanced.collect_us);
}

TEST(EmuCapacityPadding, DroplessRunsOverTheKeptRowsSoTheRoutingChangesTheTime) {
    const StageTimes balanced = stage_times(DispatchMode::kDropless, "balanced");
    const StageTimes skewed = stage_times(DispatchMode::kDropless, "zipf:2");
    EXPECT_EQ(balanced.stats.capacity, 0);
    EXPECT_EQ(skewed.stats.dropped_tokens, 0);
    // Rank 0 owns experts 0-3, the heavy ones under zipf: more rows to receive and compute.
    EXPECT_GT(skewed.experts_us, balanced.experts_us);
    EXPECT_GT(skewed.dispatch_us, balanced.dispatch_us);
}

}  // namespace
}  // namespace scmoe
