// The CPU backend's device layer: stream order, events across streams, error propagation, backend
// selection.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "gpu_presence.h"
#include "scmoe/kernels/device.h"
#include "scmoe/kernels/error.h"
#include "scmoe/kernels/workspace.h"
#include "rendezvous_util.h"

namespace scmoe {
namespace {

TEST(CpuStream, RunsTasksInOrder) {
    auto device = make_device("cpu");
    auto stream = device->create_stream();
    std::vector<int> order;
    for (int i = 0; i < 100; ++i) stream->host_task([&order, i] { order.push_back(i); });
    stream->synchronize();
    ASSERT_EQ(order.size(), 100u);
    for (int i = 0; i < 100; ++i) EXPECT_EQ(order[static_cast<std::size_t>(i)], i);
}

TEST(CpuStream, CopyAndFillAreStreamOrdered) {
    auto device = make_device("cpu");
    auto stream = device->create_stream();
    std::vector<float> a(64, 1.5f), b(64, 0.0f);
    stream->host_task([] { std::this_thread::sleep_for(std::chrono::milliseconds(20)); });
    stream->copy(b.data(), a.data(), a.size() * sizeof(float));
    stream->fill_zero(a.data(), a.size() * sizeof(float));
    stream->synchronize();
    EXPECT_EQ(b, std::vector<float>(64, 1.5f));
    EXPECT_EQ(a, std::vector<float>(64, 0.0f));
}

TEST(CpuStream, StreamsRunConcurrently) {
    auto device = make_device("cpu");
    auto s1 = device->create_stream();
    auto s2 = device->create_stream();
    std::atomic<bool> s2_ran{false};
    std::atomic<bool> s1_saw_s2{false};
    // s1 polls for s2's task: only possible if the streams are independent workers.
    s1->host_task([&] {
        for (int i = 0; i < 2000 && !s2_ran; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        s1_saw_s2 = s2_ran.load();
    });
    s2->host_task([&] { s2_ran = true; });
    s1->synchronize();
    s2->synchronize();
    EXPECT_TRUE(s1_saw_s2);
}

// The SM budget is a stream's setting (0: every SM); the CPU backend has no SMs and its ops ignore it.
TEST(CpuStream, SmBudgetIsKeptAndTheCpuHasNoSms) {
    auto device = make_device("cpu");
    EXPECT_EQ(device->sm_count(), 0);
    auto stream = device->create_stream();
    EXPECT_EQ(stream->sm_budget(), 0);
    stream->set_sm_budget(100);
    EXPECT_EQ(stream->sm_budget(), 100);
    stream->set_sm_budget(0);
    EXPECT_EQ(stream->sm_budget(), 0);
    EXPECT_THROW(stream->set_sm_budget(-1), Error);
}

TEST(CpuEvent, OrdersWorkAcrossStreams) {
    auto device = make_device("cpu");
    auto producer = device->create_stream();
    auto consumer = device->create_stream();
    auto ready = device->create_event();
    int value = 0;
    int seen = -1;
    producer->host_task([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(30));
        value = 42;
    });
    ready->record(*producer);
    consumer->wait(*ready);
    consumer->host_task([&] { seen = value; });
    consumer->synchronize();
    EXPECT_EQ(seen, 42);
    producer->synchronize();
}

// b waits for the event's first generation, and only starts that wait once the second has been
// recorded; a blocks until b's next task has run before it completes the second. If the wait were
// released by the second generation instead, b's task could only run after a's gate, which waits
// for it: the gate fails after its timeout naming both, and the failure reaches b through the
// event. No duration is asserted.
TEST(CpuEvent, ReRecordingDoesNotReleaseEarlierWaiterLate) {
    using testing::Rendezvous;
    auto device = make_device("cpu");
    auto a = device->create_stream();
    auto b = device->create_stream();
    auto e = device->create_event();
    Rendezvous recorded_twice("b's stream", "the second record", 30.0);
    Rendezvous gate("a's task before the second record", "b's task after its wait for the first", 30.0);
    recorded_twice.arrive_on(*b, Rendezvous::kFirst);
    e->record(*a);  // generation 1
    b->wait(*e);    // waits for generation 1 only
    gate.arrive_on(*b, Rendezvous::kSecond);
    gate.arrive_on(*a, Rendezvous::kFirst);
    e->record(*a);  // generation 2: after the gate
    recorded_twice.arrive(Rendezvous::kSecond);
    EXPECT_NO_THROW(b->synchronize());
    EXPECT_NO_THROW(a->synchronize());
    EXPECT_TRUE(gate.met());
}

TEST(CpuEvent, ElapsedTime) {
    auto device = make_device("cpu");
    auto s = device->create_stream();
    auto start = device->create_event();
    auto stop = device->create_event();
    start->record(*s);
    s->host_task([] { std::this_thread::sleep_for(std::chrono::milliseconds(20)); });
    stop->record(*s);
    stop->synchronize();
    EXPECT_GE(stop->elapsed_ms_since(*start), 19.0f);
}

TEST(CpuStream, ErrorIsRethrownAtSynchronizeAndLaterWorkSkipped) {
    auto device = make_device("cpu");
    auto stream = device->create_stream();
    bool later_ran = false;
    stream->host_task([] { SCMOE_FAIL("boom in task"); });
    stream->host_task([&] { later_ran = true; });
    try {
        stream->synchronize();
        FAIL() << "synchronize did not rethrow";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("boom in task"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(later_ran);
    // The stream is usable again after the error was reported.
    bool ran = false;
    stream->host_task([&] { ran = true; });
    stream->synchronize();
    EXPECT_TRUE(ran);
}

// Stream::check_at_sync: a check runs once, after the sync has waited for the work enqueued before
// it (it sees that work's result), and its error is the sync's. On every backend without a GPU.
TEST(StreamChecks, RunAfterTheNextSyncAndThrowThere) {
    for (const char* backend : {"cpu", "emu"}) {
        SCOPED_TRACE(backend);
        auto device = std::string(backend) == "emu" ? make_device("emu", 0, "a800") : make_device("cpu");
        auto stream = device->create_stream();
        auto* src = static_cast<std::int64_t*>(device->allocate_host(sizeof(std::int64_t)));
        auto* dst = static_cast<std::int64_t*>(device->allocate_host(sizeof(std::int64_t)));
        *src = 7;
        *dst = 0;
        stream->copy(dst, src, sizeof(std::int64_t));
        int runs = 0;
        std::int64_t seen = -1;
        stream->check_at_sync([&] {
            ++runs;
            seen = *dst;
        });
        EXPECT_EQ(runs, 0) << "a check ran before any sync";
        stream->synchronize();
        EXPECT_EQ(runs, 1);
        EXPECT_EQ(seen, 7) << "the check ran before the copy enqueued ahead of it";
        stream->synchronize();
        EXPECT_EQ(runs, 1) << "a check ran twice";

        // Every check runs; the first error is the sync's; the stream is fine afterwards.
        bool second_ran = false;
        stream->check_at_sync([] { SCMOE_FAIL("first check failed"); });
        stream->check_at_sync([&] {
            second_ran = true;
            SCMOE_FAIL("second check failed");
        });
        try {
            stream->synchronize();
            ADD_FAILURE() << "synchronize did not throw the check's error";
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find("first check failed"), std::string::npos) << e.what();
        }
        EXPECT_TRUE(second_ran);
        EXPECT_NO_THROW(stream->synchronize());
        device->deallocate_host(src);
        device->deallocate_host(dst);
    }
}

// Graph capture is CUDA's: the other backends say so instead of running the work.
TEST(StreamGraphs, CaptureNeedsCuda) {
    for (const char* backend : {"cpu", "emu"}) {
        auto device = make_device(backend);
        auto stream = device->create_stream();
        EXPECT_FALSE(stream->capturing());
        bool ran = false;
        try {
            device->capture(*stream, [&](Stream&) { ran = true; });
            ADD_FAILURE() << backend << ": capture did not throw";
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find("needs the CUDA backend"), std::string::npos) << e.what();
        }
        EXPECT_FALSE(ran) << backend << ": the work ran eagerly";
    }
}

TEST(Backend, AutoPicksCpuWithoutGpuAndCudaWithoutGpuIsAClearError) {
    if (cuda_device_available()) GTEST_SKIP() << "a CUDA device is present: this test covers machines without one";
    EXPECT_EQ(make_device("auto")->backend(), Backend::kCpu);
    const std::string reason = cuda_unavailable_reason();
    EXPECT_FALSE(reason.empty()) << "no device, yet no reason";
    try {
        make_device("cuda");
        FAIL() << "make_device(\"cuda\") succeeded without a device";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("--backend cuda"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find(reason), std::string::npos) << "the error hides CUDA's reason: " << e.what();
    }
}

// Review L3: a GPU test skips only where there is no GPU. nvidia-smi -L's listing decides.
TEST(GpuPresence, TestsFailInsteadOfSkippingWhenNvidiaSmiListsAGpu) {
    using testing::GpuTestAction;
    EXPECT_TRUE(testing::lists_gpu("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1234)\n"));
    EXPECT_TRUE(testing::lists_gpu("GPU 0: A\nGPU 1: B\n"));
    EXPECT_FALSE(testing::lists_gpu(""));
    EXPECT_FALSE(testing::lists_gpu("No devices were found\n"));
    EXPECT_FALSE(testing::lists_gpu(
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. GPU 0: mentioned mid-line\n"));
    EXPECT_EQ(testing::gpu_test_action(true, true), GpuTestAction::kRun);
    EXPECT_EQ(testing::gpu_test_action(true, false), GpuTestAction::kRun);
    EXPECT_EQ(testing::gpu_test_action(false, true), GpuTestAction::kFail);
    EXPECT_EQ(testing::gpu_test_action(false, false), GpuTestAction::kSkip);
}

TEST(Backend, UnknownNameIsRejected) { EXPECT_THROW(make_device("tpu"), Error); }

TEST(Workspace, SizingPassMatchesRealPass) {
    WorkspaceCarver sizing(nullptr);
    sizing.take<float>(3);
    sizing.take<double>(100);
    std::vector<std::byte> memory(sizing.bytes_used() + WorkspaceCarver::kAlignment);
    WorkspaceCarver real(memory.data());
    auto* a = real.take<float>(3);
    auto* b = real.take<double>(100);
    EXPECT_EQ(real.bytes_used(), sizing.bytes_used());
    EXPECT_EQ(reinterpret_cast<std::byte*>(b) - reinterpret_cast<std::byte*>(a), 256);
}

}  // namespace
}  // namespace scmoe
