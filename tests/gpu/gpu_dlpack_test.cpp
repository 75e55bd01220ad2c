// DLPack interop on the CUDA backend (scmoe/interop/dlpack.h): device memory exported as kDLCUDA with
// the device's ordinal and imported back without a copy (f32 and bf16), usable by the device's streams
// through the imported view; host tensors are refused by the CUDA backend and device tensors by the CPU
// backend. Skips without a GPU, like every Gpu* test.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "gpu_test_util.h"
#include "scmoe/interop/dlpack.h"
#include "scmoe/kernels/error.h"

namespace scmoe {
namespace {

using gpu_testing::Backends;

std::string error_of(const std::function<void()>& fn) {
    try {
        fn();
    } catch (const Error& e) {
        return e.what();
    }
    return "(no error)";
}

TEST(GpuDLPack, F32RoundTripIsTheSameDeviceMemory) {
    SCMOE_REQUIRE_GPU();
    Backends b;
    DeviceBuffer buf(*b.gpu, 8 * 16 * sizeof(float));
    const Tensor t(buf.data(), DType::kF32, {8, 16});
    DLManagedTensorVersioned* m = to_dlpack_versioned(t, *b.gpu);
    EXPECT_EQ(m->dl_tensor.device.device_type, kDLCUDA);
    EXPECT_EQ(m->dl_tensor.device.device_id, b.gpu->ordinal());
    EXPECT_EQ(m->dl_tensor.data, buf.data());
    DLPackTensor back(m, *b.gpu, "x");
    ASSERT_EQ(back.tensor().data, buf.data());
    EXPECT_EQ(describe(back.tensor()), "[8, 16] f32");

    // Written through the imported view by the device's stream, read back from the original buffer.
    std::vector<float> host(128), out(128, 0.0f);
    for (std::size_t i = 0; i < host.size(); ++i) host[i] = 0.25f * static_cast<float>(i);
    b.gpu_stream->copy(back.tensor().data, host.data(), host.size() * sizeof(float));
    b.gpu_stream->copy(out.data(), buf.data(), out.size() * sizeof(float));
    b.gpu_stream->synchronize();
    EXPECT_EQ(out, host);
}

TEST(GpuDLPack, Bf16RoundTripThroughTheLegacyStruct) {
    SCMOE_REQUIRE_GPU();
    Backends b;
    DeviceBuffer buf(*b.gpu, 4 * 32 * sizeof(std::uint16_t));
    DLManagedTensor* m = to_dlpack(Tensor(buf.data(), DType::kBF16, {4, 32}), *b.gpu);
    EXPECT_EQ(m->dl_tensor.dtype.code, kDLBfloat);
    EXPECT_EQ(m->dl_tensor.dtype.bits, 16);
    EXPECT_EQ(m->dl_tensor.device.device_type, kDLCUDA);
    DLPackTensor back(m, *b.gpu, "x");
    EXPECT_EQ(back.tensor().data, buf.data());
    EXPECT_EQ(describe(back.tensor()), "[4, 32] bf16");
}

TEST(GpuDLPack, EachBackendRefusesTheOthersMemory) {
    SCMOE_REQUIRE_GPU();
    Backends b;
    DeviceBuffer buf(*b.gpu, 64 * sizeof(float));
    DLManagedTensorVersioned* on_gpu = to_dlpack_versioned(Tensor(buf.data(), DType::kF32, {64}), *b.gpu);
    const std::string id = std::to_string(b.gpu->ordinal());
    EXPECT_NE(error_of([&] {
                  DLPackTensor(on_gpu, *b.cpu, "x");
              }).find("x: DLPack device kDLCUDA:" + id + " is not host memory"),
              std::string::npos);

    std::vector<float> host(64);
    DLManagedTensorVersioned* on_host = to_dlpack_versioned(Tensor(host.data(), DType::kF32, {64}), *b.cpu);
    EXPECT_NE(error_of([&] {
                  DLPackTensor(on_host, *b.gpu, "x");
              }).find("x: DLPack device kDLCPU:0 is not CUDA device memory"),
              std::string::npos);

    DLManagedTensorVersioned* other = to_dlpack_versioned(Tensor(buf.data(), DType::kF32, {64}), *b.gpu);
    other->dl_tensor.device.device_id = b.gpu->ordinal() + 1;
    EXPECT_NE(error_of([&] { DLPackTensor(other, *b.gpu, "x"); }).find("is another GPU than this device, cuda:" + id),
              std::string::npos);
}

}  // namespace
}  // namespace scmoe
