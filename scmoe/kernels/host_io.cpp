#include "scmoe/kernels/host_io.h"

#include "scmoe/kernels/error.h"
#include "scmoe/kernels/math.h"

namespace scmoe {

DeviceTensor::DeviceTensor(Device& device, DType dtype, std::initializer_list<std::int64_t> shape)
    : view_(nullptr, dtype, shape) {
    buffer_ = DeviceBuffer(device, view_.bytes());
    view_.data = buffer_.data();
}

namespace {
void check_float_tensor(const Tensor& t, const char* what) {
    SCMOE_CHECK(t.data != nullptr || t.numel() == 0, what << ": the tensor " << describe(t) << " has no memory");
    SCMOE_CHECK(t.dtype == DType::kF32 || t.dtype == DType::kBF16,
                what << ": expected an f32 or bf16 tensor, got " << describe(t));
}
}  // namespace

void copy_from_host(const float* host, const Tensor& dst, Stream& stream) {
    check_float_tensor(dst, "copy_from_host");
    const auto n = static_cast<std::size_t>(dst.numel());
    std::vector<std::uint16_t> bits;  // bf16: the converted values, alive until the copy has run
    if (dst.dtype == DType::kF32) {
        stream.copy(dst.data, host, n * sizeof(float));
    } else {
        bits.resize(n);
        for (std::size_t i = 0; i < n; ++i) bits[i] = math::f32_to_bf16_bits(host[i]);
        stream.copy(dst.data, bits.data(), n * sizeof(std::uint16_t));
    }
    stream.synchronize();
}

void copy_from_host(const std::vector<float>& host, const Tensor& dst, Stream& stream) {
    SCMOE_CHECK(static_cast<std::int64_t>(host.size()) == dst.numel(),
                "copy_from_host: " << host.size() << " host values for the tensor " << describe(dst));
    copy_from_host(host.data(), dst, stream);
}

std::vector<float> copy_to_host(const Tensor& src, Stream& stream) {
    check_float_tensor(src, "copy_to_host");
    const auto n = static_cast<std::size_t>(src.numel());
    std::vector<float> out(n);
    if (src.dtype == DType::kF32) {
        stream.copy(out.data(), src.data, n * sizeof(float));
        stream.synchronize();
        return out;
    }
    std::vector<std::uint16_t> bits(n);
    stream.copy(bits.data(), src.data, n * sizeof(std::uint16_t));
    stream.synchronize();
    for (std::size_t i = 0; i < n; ++i) out[i] = math::bf16_bits_to_f32(bits[i]);
    return out;
}

}  // namespace scmoe
