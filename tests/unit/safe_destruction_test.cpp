// Destroying objects while their stream still runs work that uses them (issue 15's first finding:
// an exception after forward() unwinds the scope). On the CPU backend, memory used to be freed at
// once, under the stream's feet; CpuDevice::deallocate now frees it only after the work already
// enqueued has run, as cudaFree waits for the device. The CI runs this under AddressSanitizer, which
// reported a heap-use-after-free in the stream's worker before the fix.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include "scmoe/kernels/device.h"
#include "scmoe/moe/moe_layer.h"
#include "scmoe/moe/params.h"

namespace scmoe {
namespace {

MoeConfig layer_config() {
    MoeConfig c;
    c.hidden = 32;
    c.ffn = 64;
    c.num_experts = 4;
    c.top_k = 2;
    c.shared_expert = true;
    return c;
}

// Holds `stream` until `go` is set, so everything enqueued after it is still pending.
void hold(Stream& stream, std::atomic<bool>& go) {
    stream.host_task([&go] {
        while (!go.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    });
}

TEST(SafeDestruction, AnExceptionAfterForwardUnwindsWhileTheStreamWorks) {
    auto device = make_device("cpu");
    auto stream = device->create_stream();
    const MoeConfig c = layer_config();
    const std::int64_t T = 64;
    std::atomic<bool> go{false};
    try {
        MoeLayer layer(c, *device, T);
        MoeParamStore params(*device, c, DType::kF32), grads(*device, c, DType::kF32);
        params.init(1, *stream);  // synchronizes
        DeviceBuffer x(*device, T * c.hidden * sizeof(float)), y(*device, T * c.hidden * sizeof(float));
        DeviceBuffer dy(*device, T * c.hidden * sizeof(float)), dx(*device, T * c.hidden * sizeof(float));
        hold(*stream, go);  // from here on nothing runs until the scope is gone
        stream->fill_zero(x.data(), x.bytes());
        stream->fill_zero(dy.data(), dy.bytes());
        const Tensor tx(x.data(), DType::kF32, {T, c.hidden}), ty(y.data(), DType::kF32, {T, c.hidden});
        layer.forward(tx, Tensor(), params.view(), ty, *stream);
        layer.backward(Tensor(dy.data(), DType::kF32, {T, c.hidden}), params.view(), grads.view(),
                       Tensor(dx.data(), DType::kF32, {T, c.hidden}), Tensor(), *stream);
        throw std::runtime_error("the caller fails after enqueueing");
    } catch (const std::runtime_error&) {
    }
    // The layer, its parameters and buffers are gone; their work has not started yet.
    go = true;
    EXPECT_NO_THROW(stream->synchronize());
}

// A buffer freed while two streams still use it is released once both have passed the free; a
// stream that failed still releases it; idle streams free at once.
TEST(SafeDestruction, FreesWaitForEveryBusyStreamOfTheDevice) {
    auto device = make_device("cpu");
    auto a = device->create_stream(), b = device->create_stream();
    std::atomic<bool> go{false};
    std::vector<float> src(1024, 1.0f), seen_a(1024), seen_b(1024);
    {
        DeviceBuffer buf(*device, src.size() * sizeof(float));
        a->copy(buf.data(), src.data(), buf.bytes());
        a->synchronize();
        hold(*a, go);
        hold(*b, go);
        a->copy(seen_a.data(), buf.data(), buf.bytes());
        b->host_task([] { throw std::runtime_error("stream b fails"); });
        b->copy(seen_b.data(), buf.data(), buf.bytes());  // skipped: b has failed
    }
    go = true;
    a->synchronize();
    EXPECT_THROW(b->synchronize(), std::runtime_error);
    EXPECT_EQ(seen_a, src) << "stream a read the buffer after it was destroyed on the host";
    // Idle streams: freed at once (nothing to wait for), and the device keeps working.
    { DeviceBuffer idle(*device, 4096); }
    EXPECT_NO_THROW(a->synchronize());
}

// An event destroyed while its record, and a wait on it, are still queued (a Tracer's events when a
// host error unwinds a trainer mid-step): as with cudaEventDestroy, the queued work still runs in
// order. Under AddressSanitizer this was a heap-use-after-free in the stream's worker.
TEST(SafeDestruction, EventsDestroyedWhileQueuedStillOrderTheStreams) {
    auto device = make_device("cpu");
    auto a = device->create_stream(), b = device->create_stream();
    std::atomic<bool> go{false};
    std::atomic<int> order{0};
    int a_done_at = -1, b_ran_at = -1;
    hold(*a, go);
    a->host_task([&] { a_done_at = order.fetch_add(1); });
    {
        auto event = device->create_event();
        event->record(*a);
        b->wait(*event);
    }
    b->host_task([&] { b_ran_at = order.fetch_add(1); });
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // b would run early if the wait were lost
    go = true;
    a->synchronize();
    b->synchronize();
    EXPECT_EQ(a_done_at, 0);
    EXPECT_EQ(b_ran_at, 1) << "stream b did not wait for the destroyed event";
}

}  // namespace
}  // namespace scmoe
