// The CUDA device layer: construction errors, description, copies, fill, events, and errors raised
// by host tasks coming back through Stream::synchronize().
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpu_test_util.h"
#include "scmoe/kernels/error.h"

namespace scmoe {
namespace {

using namespace gpu_testing;

// Without a GPU, "cuda" is a clear error and "auto" falls back to the CPU; with one, both give the
// GPU. Never skips, so launch/gpu_check.sh can fail on any skip while a GPU is present.
TEST(GpuDevice, MakeCudaWithoutDeviceThrows) {
    if (cuda_device_available()) {
        EXPECT_EQ(make_device("cuda")->backend(), Backend::kCuda);
        EXPECT_EQ(make_device("auto")->backend(), Backend::kCuda);
        return;
    }
    EXPECT_THROW(make_device("cuda"), Error);
    try {
        make_device("cuda");
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("cuda"), std::string::npos) << e.what();
    }
    auto fallback = make_device("auto");
    EXPECT_EQ(fallback->backend(), Backend::kCpu);
}

TEST(GpuDevice, DescribesItself) {
    SCMOE_REQUIRE_GPU();
    auto dev = make_device("cuda");
    EXPECT_EQ(dev->backend(), Backend::kCuda);
    EXPECT_EQ(dev->compute_dtype(), DType::kBF16);
    const std::string d = dev->description();
    EXPECT_EQ(d.rfind("cuda:0 ", 0), 0u) << d;
    EXPECT_NE(d.find("sm_"), std::string::npos) << d;
    EXPECT_NE(d.find("SMs"), std::string::npos) << d;
    EXPECT_THROW(make_device("cuda", 4096), Error);
}

TEST(GpuDevice, CopyFillAndHostTasksRunInOrder) {
    SCMOE_REQUIRE_GPU();
    Backends b;
    const std::size_t n = 1000;
    std::vector<float> host(n);
    for (std::size_t i = 0; i < n; ++i) host[i] = static_cast<float>(i);
    DeviceBuffer d1(*b.gpu, n * sizeof(float)), d2(*b.gpu, n * sizeof(float));
    auto* pinned = static_cast<float*>(b.gpu->allocate_host(n * sizeof(float)));
    Stream& s = *b.gpu_stream;
    s.copy(d1.data(), host.data(), n * sizeof(float));
    s.copy(d2.data(), d1.data(), n * sizeof(float));
    s.fill_zero(d1.data(), n / 2 * sizeof(float));
    s.copy(pinned, d2.data(), n * sizeof(float));
    std::atomic<float> seen{-1.0f};
    s.host_task([&] { seen = pinned[n - 1]; });
    s.synchronize();
    EXPECT_EQ(seen.load(), static_cast<float>(n - 1));
    for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(pinned[i], static_cast<float>(i));
    std::vector<float> back(n);
    s.copy(back.data(), d1.data(), n * sizeof(float));
    s.synchronize();
    for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(back[i], i < n / 2 ? 0.0f : static_cast<float>(i));
    b.gpu->deallocate_host(pinned);
}

TEST(GpuDevice, HostTaskErrorIsRethrownBySynchronize) {
    SCMOE_REQUIRE_GPU();
    Backends b;
    Stream& s = *b.gpu_stream;
    bool later_task_ran = false;
    s.host_task([] { SCMOE_FAIL("NaN in input"); });
    s.host_task([&] { later_task_ran = true; });
    try {
        s.synchronize();
        FAIL() << "synchronize() did not rethrow the host task's error";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("NaN in input"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(later_task_ran) << "host tasks after a failed one are skipped, as on the CPU backend";
    // The error is reported once; the stream is usable again.
    bool ran = false;
    s.host_task([&] { ran = true; });
    EXPECT_NO_THROW(s.synchronize());
    EXPECT_TRUE(ran);
}

// check_at_sync on a CUDA stream: the check runs at the next synchronize, after the copy enqueued
// before it, and its error is the sync's.
TEST(GpuDevice, SyncChecksReadWhatTheStreamCopied) {
    SCMOE_REQUIRE_GPU();
    Backends b;
    Stream& s = *b.gpu_stream;
    DeviceBuffer d(*b.gpu, sizeof(float));
    auto* pinned = static_cast<float*>(b.gpu->allocate_host(sizeof(float)));
    const float value = 3.5f;
    *pinned = 0.0f;
    s.copy(d.data(), &value, sizeof(float));
    s.copy(pinned, d.data(), sizeof(float));
    float seen = -1.0f;
    s.check_at_sync([&] {
        seen = *pinned;
        if (seen != 0.0f) SCMOE_FAIL("flag set: " << seen);
    });
    try {
        s.synchronize();
        ADD_FAILURE() << "the check's error did not come out of synchronize";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("flag set: 3.5"), std::string::npos) << e.what();
    }
    EXPECT_EQ(seen, 3.5f);
    EXPECT_NO_THROW(s.synchronize());
    b.gpu->deallocate_host(pinned);
}

TEST(GpuDevice, EventsOrderStreamsAndTime) {
    SCMOE_REQUIRE_GPU();
    Backends b;
    auto other = b.gpu->create_stream();
    auto start = b.gpu->create_event(), done = b.gpu->create_event();
    const std::size_t bytes = std::size_t{64} << 20;
    DeviceBuffer src(*b.gpu, bytes), dst(*b.gpu, bytes);
    std::vector<std::uint8_t> host(16, 0xff);
    start->record(*b.gpu_stream);
    b.gpu_stream->fill_zero(src.data(), bytes);
    b.gpu_stream->copy(dst.data(), src.data(), bytes);
    done->record(*b.gpu_stream);
    other->wait(*done);
    other->copy(host.data(), dst.data(), host.size());
    other->synchronize();
    for (std::uint8_t v : host) EXPECT_EQ(v, 0);
    done->synchronize();
    EXPECT_GE(done->elapsed_ms_since(*start), 0.0f);
}

}  // namespace
}  // namespace scmoe
