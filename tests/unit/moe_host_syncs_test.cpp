// Host syncs per MoE layer per training step (scmoe/kernels/host_syncs.h counts every Stream and Event
// synchronize of the calling thread), on the CPU backend and on emulated GPUs, where the emulated
// NCCL blocks the host exactly where NcclCommunicator does. README, "Host syncs", lists the counts.
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "scmoe/comm/emu_communicator.h"
#include "scmoe/kernels/host_syncs.h"
#include "scmoe/moe/moe_layer.h"
#include "scmoe/moe/params.h"

namespace scmoe {
namespace {

struct SyncCounts {
    std::uint64_t forward = 0, backward = 0;
};

MoeConfig layer_config(DispatchMode dispatch, DType dtype) {
    MoeConfig c;
    c.hidden = 64;
    c.ffn = 128;
    c.num_experts = 4;
    c.top_k = 2;
    c.dispatch = dispatch;
    c.dtype = dtype;
    return c;
}

// One forward and one backward of a layer (zero parameters and inputs), the syncs each issues on
// this thread; the stream is synchronized only after counting.
SyncCounts count_step(Device& device, const MoeConfig& config, Communicator* ep = nullptr) {
    const std::int64_t T = 32, H = config.hidden;
    const int ep_size = ep ? ep->size() : 1;
    auto stream = device.create_stream();
    MoeLayer layer(config, device, T, ep);
    MoeParamStore params(device, config, config.dtype, ep_size);
    MoeParamStore grads(device, config, DType::kF32, ep_size);
    const std::size_t bytes = static_cast<std::size_t>(T * H) * dtype_size(config.dtype);
    DeviceBuffer x(device, bytes), y(device, bytes), dy(device, bytes), dx(device, bytes);
    for (DeviceBuffer* b : {&x, &dy}) stream->fill_zero(b->data(), bytes);
    const Tensor tx(x.data(), config.dtype, {T, H}), ty(y.data(), config.dtype, {T, H});
    const Tensor tdy(dy.data(), config.dtype, {T, H}), tdx(dx.data(), config.dtype, {T, H});
    stream->synchronize();
    SyncCounts n;
    const std::uint64_t start = host_syncs_this_thread();
    layer.forward(tx, Tensor{}, params.view(), ty, *stream);
    n.forward = host_syncs_this_thread() - start;
    layer.backward(tdy, params.view(), grads.view(), tdx, Tensor{}, *stream);
    n.backward = host_syncs_this_thread() - start - n.forward;
    stream->synchronize();
    return n;
}

// Expert parallelism over `ranks` emulated A800s (one thread each); every rank's counts.
std::vector<SyncCounts> count_ep_step(DispatchMode dispatch, int ranks) {
    std::vector<int> members(static_cast<std::size_t>(ranks));
    for (int r = 0; r < ranks; ++r) members[static_cast<std::size_t>(r)] = r;  // global ranks
    auto group = EmuGroup::create(cluster_topology("a800-nvlink-8"), members);
    std::vector<SyncCounts> counts(static_cast<std::size_t>(ranks));
    std::vector<std::string> errors(static_cast<std::size_t>(ranks));
    std::vector<std::thread> threads;
    for (int r = 0; r < ranks; ++r)
        threads.emplace_back([&, r] {
            try {
                auto device = make_device("emu", 0, "a800");
                auto comm = group->communicator(r);
                counts[static_cast<std::size_t>(r)] = count_step(*device, layer_config(dispatch, DType::kBF16), comm.get());
            } catch (const std::exception& e) {
                errors[static_cast<std::size_t>(r)] = e.what();
            }
        });
    for (auto& t : threads) t.join();
    for (int r = 0; r < ranks; ++r) EXPECT_EQ(errors[static_cast<std::size_t>(r)], "") << "rank " << r;
    return counts;
}

// The counter itself: each synchronize counts once, on the thread that waits, on every backend.
TEST(HostSyncs, EverySynchronizeCountsOnceOnTheCallingThread) {
    for (const char* backend : {"cpu", "emu"}) {
        auto device = make_device(backend);
        auto stream = device->create_stream();
        auto event = device->create_event();
        const std::uint64_t start = host_syncs_this_thread();
        stream->synchronize();
        event->record(*stream);
        event->synchronize();
        EXPECT_EQ(host_syncs_this_thread() - start, 2u) << backend;
        std::uint64_t other = 0;
        std::thread([&] { other = host_syncs_this_thread(); }).join();
        EXPECT_EQ(other, 0u) << backend << ": another thread's count";
    }
}

// One rank: no exchange, so nothing waits for the device, capacity or dropless, on the CPU and on
// an emulated GPU (the target: 0).
TEST(HostSyncs, OneRankLayerNeverWaitsForTheDevice) {
    for (DispatchMode dispatch : {DispatchMode::kCapacity, DispatchMode::kDropless}) {
        auto cpu = make_device("cpu");
        const SyncCounts c = count_step(*cpu, layer_config(dispatch, DType::kF32));
        EXPECT_EQ(c.forward, 0u) << dispatch_mode_name(dispatch);
        EXPECT_EQ(c.backward, 0u) << dispatch_mode_name(dispatch);
        auto emu = make_device("emu", 0, "a800");
        const SyncCounts e = count_step(*emu, layer_config(dispatch, DType::kBF16));
        EXPECT_EQ(e.forward, 0u) << dispatch_mode_name(dispatch);
        EXPECT_EQ(e.backward, 0u) << dispatch_mode_name(dispatch);
    }
}

// Expert parallelism on emulated GPUs, where an all_to_all_v waits for its counts as NCCL's does:
// 1 sync per forward (dispatch waits for the per-expert count exchange, which sizes everything
// after it) and none in the backward: every data exchange is an all_to_all_v_known with the counts
// the layer holds. Before that, collect and both backward exchanges re-exchanged their counts and
// the forward's data exchange its own: 3 and 2.
TEST(HostSyncs, ExpertParallelLayerWaitsOncePerForward) {
    for (DispatchMode dispatch : {DispatchMode::kCapacity, DispatchMode::kDropless})
        for (const SyncCounts& c : count_ep_step(dispatch, 2)) {
            EXPECT_EQ(c.forward, 1u) << dispatch_mode_name(dispatch);
            EXPECT_EQ(c.backward, 0u) << dispatch_mode_name(dispatch);
        }
}

}  // namespace
}  // namespace scmoe
