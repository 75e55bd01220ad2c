// NcclCommunicator on one GPU: a 1-rank communicator bootstrapped through a file in a temporary
// directory, every collective checked exactly (i32, f32 and bf16; counts in host and in device
// memory), and an MoeLayer constructed with it equal bitwise to the layer without a communicator.
// Skips with a message where no CUDA device answers (and in builds without CUDA, where
// NcclCommunicator does not exist).
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include "gpu/gpu_test_util.h"
#include "scmoe/kernels/device.h"
#include "scmoe/kernels/error.h"
#include "scmoe/kernels/math.h"
#include "scmoe/moe/moe_layer.h"
#include "scmoe/moe/params.h"
#if SCMOE_WITH_CUDA
#include "scmoe/comm/nccl_communicator.h"
#endif

namespace scmoe {
namespace {

#if SCMOE_WITH_CUDA
// A 1-rank NcclCommunicator on device 0, bootstrapped through a file in a fresh temporary directory
// that goes with this object.
struct OneRankNccl {
    std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                ("scmoe_gpu_nccl_" + std::to_string(getpid()) + "_" +
                                 std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()));
    std::unique_ptr<NcclCommunicator> comm;

    OneRankNccl() {
        std::filesystem::create_directories(dir);
        comm = NcclCommunicator::from_file((dir / "nccl.id").string(), /*rank=*/0, /*size=*/1, /*device=*/0, 60.0);
    }
    ~OneRankNccl() {
        comm.reset();
        std::error_code ec;
        std::filesystem::remove_all(dir, ec);
    }
    OneRankNccl(const OneRankNccl&) = delete;
    OneRankNccl& operator=(const OneRankNccl&) = delete;
};
#endif

TEST(GpuNccl, OneRankFileBootstrapCollectivesExact) {
    SCMOE_REQUIRE_GPU();
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

// Every collective of a 1-rank group is a copy (or nothing) whatever the dtype; all_to_all_v also
// takes its counts from device memory; all_gather in place.
TEST(GpuNccl, OneRankCollectivesEveryDtypeAndDeviceCounts) {
    SCMOE_REQUIRE_GPU();
#if SCMOE_WITH_CUDA
    OneRankNccl nccl;
    NcclCommunicator& comm = *nccl.comm;
    auto device = make_device("cuda");
    auto stream = device->create_stream();
    const std::vector<float> values = {1.5f, -2.0f, 1e8f, 3.0f / 128.0f, 0.0f, -7.25f};
    const auto n = static_cast<std::int64_t>(values.size());
    std::vector<std::uint16_t> bits(values.size());
    for (std::size_t i = 0; i < values.size(); ++i) bits[i] = math::f32_to_bf16_bits(values[i]);
    DeviceBuffer f32(*device, values.size() * sizeof(float)), bf16(*device, bits.size() * sizeof(std::uint16_t));
    stream->copy(f32.data(), values.data(), values.size() * sizeof(float));
    stream->copy(bf16.data(), bits.data(), bits.size() * sizeof(std::uint16_t));
    comm.all_reduce_sum(f32.data(), n, DType::kF32, *stream);
    comm.all_reduce_sum(bf16.data(), n, DType::kBF16, *stream);
    comm.broadcast(f32.data(), n, DType::kF32, 0, *stream);
    comm.broadcast(bf16.data(), n, DType::kBF16, 0, *stream);
    comm.all_gather(f32.data(), n, f32.data(), DType::kF32, *stream);  // in place: rank 0's block is all of it

    // all_to_all_v with send_counts and recv_counts in device memory, bf16 data.
    const std::int64_t count = n;
    DeviceBuffer counts(*device, 2 * sizeof(std::int64_t)), recv(*device, bits.size() * sizeof(std::uint16_t));
    stream->copy(counts.data(), &count, sizeof(count));
    comm.all_to_all_v(bf16.data(), counts.as<std::int64_t>(), recv.data(), counts.as<std::int64_t>() + 1, DType::kBF16,
                      *stream);
    comm.barrier(*stream);
    std::vector<float> got_f32(values.size());
    std::vector<std::uint16_t> got_bf16(bits.size()), got_recv(bits.size());
    std::int64_t got_counts[2] = {-1, -1};
    stream->copy(got_f32.data(), f32.data(), values.size() * sizeof(float));
    stream->copy(got_bf16.data(), bf16.data(), bits.size() * sizeof(std::uint16_t));
    stream->copy(got_recv.data(), recv.data(), bits.size() * sizeof(std::uint16_t));
    stream->copy(got_counts, counts.data(), sizeof(got_counts));
    comm.wait(*stream);
    EXPECT_EQ(got_f32, values);
    EXPECT_EQ(got_bf16, bits);
    EXPECT_EQ(got_recv, bits);
    EXPECT_EQ(got_counts[0], count);
    EXPECT_EQ(got_counts[1], count) << "recv_counts in device memory";
#endif
}

// An MoeLayer given a 1-rank NCCL communicator computes exactly what the layer without one does:
// forward, stats and every gradient bitwise (ep size 1 moves nothing).
TEST(GpuNccl, OneRankLayerEqualsLayerWithoutCommunicatorBitwise) {
    SCMOE_REQUIRE_GPU();
#if SCMOE_WITH_CUDA
    using gpu_testing::F;
    OneRankNccl nccl;
    gpu_testing::Backends b;
    MoeConfig c;
    c.hidden = 64;
    c.ffn = 128;
    c.num_experts = 4;
    c.top_k = 2;
    c.capacity_factor = 1.0f;
    c.dispatch = DispatchMode::kDropless;
    c.dtype = DType::kBF16;
    c.shared_expert = true;
    c.coefficient_gate = true;
    constexpr std::int64_t kTokens = 64;
    const std::int64_t H = c.hidden;
    std::int64_t numel = 0;
    for (const ParamSpec& p : moe_param_specs(c)) numel += p.numel();
    const DeviceBuffer params_bf16 = gpu_testing::upload(b, gpu_testing::random_uniform(numel, 0.1f, 31), DType::kBF16);
    const DeviceBuffer x = gpu_testing::upload(b, gpu_testing::random_uniform(kTokens * H, 1.0f, 32), DType::kBF16);
    const DeviceBuffer gy = gpu_testing::upload(b, gpu_testing::random_uniform(kTokens * H, 1.0f, 33), DType::kBF16);
    auto run = [&](Communicator* ep) {
        MoeLayer layer(c, *b.gpu, kTokens, ep);
        MoeParamStore params(*b.gpu, c, DType::kBF16), grads(*b.gpu, c, DType::kF32);
        b.gpu_stream->copy(params.data(), params_bf16.data(), params.bytes());
        DeviceBuffer y(*b.gpu, static_cast<std::size_t>(kTokens * H) * 2), gx(*b.gpu, y.bytes());
        auto t = [&](void* p) { return Tensor(p, DType::kBF16, {kTokens, H}); };
        layer.forward(t(x.data()), Tensor(), params.view(), t(y.data()), *b.gpu_stream);
        const MoeStats stats = layer.stats(*b.gpu_stream);
        layer.backward(t(gy.data()), params.view(), grads.view(), t(gx.data()), Tensor(), *b.gpu_stream);
        std::vector<F> out = {gpu_testing::download(b, y.data(), kTokens * H, DType::kBF16),
                              gpu_testing::download(b, gx.data(), kTokens * H, DType::kBF16),
                              gpu_testing::download(b, grads.data(), grads.numel(), DType::kF32),
                              F{static_cast<float>(stats.dropped_tokens), stats.aux_loss, stats.z_loss}};
        return out;
    };
    const std::vector<F> alone = run(nullptr);
    const std::vector<F> with_nccl = run(nccl.comm.get());
    const char* what[] = {"y", "grad_x", "weight grads", "stats"};
    for (std::size_t i = 0; i < alone.size(); ++i) gpu_testing::expect_bitwise_equal(with_nccl[i], alone[i], what[i]);
#endif
}

}  // namespace
}  // namespace scmoe
