// copy_from_host / copy_to_host / DeviceTensor: the embedder's way to feed and read tensors.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "scmoe/kernels/error.h"
#include "scmoe/kernels/host_io.h"
#include "scmoe/kernels/math.h"

namespace scmoe {
namespace {

TEST(HostIo, F32RoundTripIsExact) {
    auto device = make_device("cpu");
    auto stream = device->create_stream();
    DeviceTensor t(*device, DType::kF32, {3, 5});
    std::vector<float> v(15);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = std::sin(static_cast<float>(i)) * 1e3f + 1e-7f;
    copy_from_host(v, t, *stream);
    EXPECT_EQ(copy_to_host(t, *stream), v);
}

TEST(HostIo, Bf16RoundsToNearestEvenAndReadsBackWidened) {
    auto device = make_device("cpu");
    auto stream = device->create_stream();
    DeviceTensor t(*device, DType::kBF16, {4});
    // 1 + 2^-8 is halfway between bf16 1 and 1 + 2^-7: ties to even (1); 1 + 3*2^-8 rounds up.
    const std::vector<float> v = {1.0f + 1.0f / 256, 1.0f + 3.0f / 256, -2.5f, 0.0f};
    copy_from_host(v, t, *stream);
    const auto* bits = static_cast<const std::uint16_t*>(t.tensor().data);
    EXPECT_EQ(bits[0], math::f32_to_bf16_bits(1.0f));
    const std::vector<float> back = copy_to_host(t, *stream);
    EXPECT_EQ(back, (std::vector<float>{1.0f, 1.0f + 4.0f / 256, -2.5f, 0.0f}));
}

TEST(HostIo, RefusesWrongSizesAndIntegerTensors) {
    auto device = make_device("cpu");
    auto stream = device->create_stream();
    DeviceTensor t(*device, DType::kF32, {2, 2});
    EXPECT_THROW(copy_from_host(std::vector<float>(3), t, *stream), Error);
    DeviceTensor i(*device, DType::kI32, {2});
    EXPECT_THROW(copy_to_host(i, *stream), Error);
}

}  // namespace
}  // namespace scmoe
