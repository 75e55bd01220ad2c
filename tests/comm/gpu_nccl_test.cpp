// NcclCommunicator on one GPU: a 1-rank communicator bootstrapped through a file in a temporary
// directory, every collective checked exactly. Skips with a message where no CUDA device answers
// (and in builds without CUDA, where NcclCommunicator does not exist).
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "kernels/device.h"
#include "kernels/error.h"
#if SCMOE_WITH_CUDA
#include "comm/nccl_communicator.h"
#endif

namespace scmoe {
namespace {

TEST(GpuNccl, OneRankFileBootstrapCollectivesExact) {
    if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device: GPU test skipped";
#if SCMOE_WITH_CUDA
    const auto dir = std::filesystem::temp_directory_path() /
                     ("scmoe_gpu_nccl_" + std::to_string(getpid()) + "_" +
                      std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()));
    std::filesystem::create_directories(dir);
    const std::string id_path = (dir / "nccl.id").string();
    auto device = make_device("cuda");
    auto stream = device->create_stream();
    auto comm = NcclCommunicator::from_file(id_path, /*rank=*/0, /*size=*/1, /*device=*/0, 60.0);
    EXPECT_EQ(comm->rank(), 0);
    EXPECT_EQ(comm->size(), 1);
    EXPECT_FALSE(std::filesystem::exists(id_path)) << "rank 0 removes the id file once every rank joined";

    // all_to_all_v to itself: 5 elements, host counts.
    constexpr std::int64_t kCount = 5;
    std::vector<float> host(kCount);
    for (std::int64_t i = 0; i < kCount; ++i) host[static_cast<std::size_t>(i)] = static_cast<float>(10 * i + 3);
    DeviceBuffer send(*device, kCount * sizeof(float)), recv(*device, (kCount + 1) * sizeof(float));
    stream->copy(send.data(), host.data(), kCount * sizeof(float));
    stream->fill_zero(recv.data(), (kCount + 1) * sizeof(float));
    std::vector<std::int64_t> send_counts = {kCount}, recv_counts = {-7};
    comm->all_to_all_v(send.data(), send_counts.data(), recv.data(), recv_counts.data(), DType::kF32, *stream);
    EXPECT_EQ(recv_counts[0], kCount) << "filled in when all_to_all_v returns";
    std::vector<float> got(kCount + 1, -1.0f);
    stream->copy(got.data(), recv.data(), (kCount + 1) * sizeof(float));
    comm->wait(*stream);
    for (std::int64_t i = 0; i < kCount; ++i)
        EXPECT_EQ(got[static_cast<std::size_t>(i)], host[static_cast<std::size_t>(i)]);
    EXPECT_EQ(got[kCount], 0.0f) << "wrote past what it receives";

    // all_reduce_sum, all_gather, broadcast and barrier on one rank leave the data as it is.
    std::vector<std::int32_t> ints = {1, -2, 300, 1 << 30};
    DeviceBuffer ibuf(*device, ints.size() * sizeof(std::int32_t)),
        gathered(*device, ints.size() * sizeof(std::int32_t));
    stream->copy(ibuf.data(), ints.data(), ints.size() * sizeof(std::int32_t));
    comm->all_reduce_sum(ibuf.data(), static_cast<std::int64_t>(ints.size()), DType::kI32, *stream);
    comm->broadcast(ibuf.data(), static_cast<std::int64_t>(ints.size()), DType::kI32, 0, *stream);
    comm->all_gather(ibuf.data(), static_cast<std::int64_t>(ints.size()), gathered.data(), DType::kI32, *stream);
    comm->barrier(*stream);
    std::vector<std::int32_t> back(ints.size(), 0);
    stream->copy(back.data(), gathered.data(), ints.size() * sizeof(std::int32_t));
    comm->wait(*stream);
    EXPECT_EQ(back, ints);
    comm.reset();
    std::filesystem::remove_all(dir);
#endif
}

}  // namespace
}  // namespace scmoe
