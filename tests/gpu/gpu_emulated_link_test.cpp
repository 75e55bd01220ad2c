// EmulatedLink on CUDA streams (review L2): the link's hold is a device-side timer, not a host
// callback that sleeps, so a host task on another stream runs while a link op holds its stream,
// and the op still holds its stream for at least the modelled time with the wrapped op's data. The
// hold is timed by the host's clock, apart from the device stamps the link measures itself with (the
// hold kernel cannot end before its own stamp says the time is up, so those prove nothing).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "scmoe/comm/emulated_link.h"
#include "scmoe/comm/local_communicator.h"
#include "gpu_test_util.h"
#include "scmoe/kernels/error.h"

namespace scmoe {
namespace {

TEST(GpuEmulatedLink, HoldsItsStreamOnTheDeviceWithoutStallingOtherCallbacks) {
    SCMOE_REQUIRE_GPU();
    constexpr int kRanks = 2;
    constexpr double kHoldUs = 1.5e6;  // a latency-only link: every op holds its stream 1.5 s
    const LinkModel model = parse_link_model("gbps=1000,latency_us=" + std::to_string(kHoldUs));
    auto group = LocalGroup::create(kRanks, 60.0);
    std::vector<std::string> errors(kRanks);
    std::vector<std::int64_t> ops_at_callback(kRanks, -1);
    std::vector<LinkCounters> counters(kRanks);
    std::vector<float> summed(kRanks, 0.0f);
    std::vector<double> host_held_us(kRanks, 0.0);
    std::vector<std::thread> threads;
    for (int r = 0; r < kRanks; ++r)
        threads.emplace_back([&, r] {
            try {
                auto device = make_device("cuda");
                auto link_stream = device->create_stream(), other = device->create_stream();
                EmulatedLink link(group->communicator(r), model);
                DeviceBuffer buf(*device, sizeof(float));
                const float mine = static_cast<float>(r + 1);
                link_stream->copy(buf.data(), &mine, sizeof(float));
                link_stream->synchronize();
                const auto enqueued = std::chrono::steady_clock::now();
                link.all_reduce_sum(buf.data(), 1, DType::kF32, *link_stream);
                // Enqueued after the link op, on the driver's callback thread, where the old
                // host-side sleep would have kept it until the hold ended (and counted the op).
                bool ran = false;
                other->host_task([&] { ran = true; });
                other->synchronize();
                ops_at_callback[r] = ran ? link.counters(LinkOp::kAllReduceSum).ops : -1;
                link_stream->synchronize();
                host_held_us[r] =
                    std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - enqueued).count();
                link_stream->copy(&summed[r], buf.data(), sizeof(float));
                link_stream->synchronize();
                counters[r] = link.counters(LinkOp::kAllReduceSum);
            } catch (const std::exception& e) {
                errors[r] = e.what();
            }
        });
    for (auto& t : threads) t.join();
    for (int r = 0; r < kRanks; ++r) {
        SCOPED_TRACE("rank " + std::to_string(r));
        ASSERT_EQ(errors[r], "");
        EXPECT_EQ(summed[r], 3.0f) << "the wrapped all_reduce_sum's result";
        EXPECT_EQ(counters[r].ops, 1);
        EXPECT_GE(host_held_us[r], kHoldUs) << "the link stream was free before the modelled time (host clock)";
        EXPECT_GE(counters[r].measured_us, kHoldUs) << "the link's own measure is below the modelled time";
        EXPECT_LE(counters[r].wrapped_us, counters[r].measured_us);
        EXPECT_EQ(ops_at_callback[r], 0) << "the other stream's callback waited for the link's hold to end";
    }
}

}  // namespace
}  // namespace scmoe
