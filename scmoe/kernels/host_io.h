// Moving values between host f32 arrays and tensors of any backend and dtype: what an embedder needs
// to feed the layer its inputs and read its outputs without knowing whether the device is a CPU (f32
// host memory) or a GPU (bf16 device memory). These calls block the host (they synchronize the
// stream), so they belong to setup, checks and inspection, not to a training step's hot path.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <vector>

#include "scmoe/kernels/device.h"
#include "scmoe/kernels/tensor.h"

namespace scmoe {

// A tensor that owns its memory on a device: `tensor()` is the view the ops take.
class DeviceTensor {
  public:
    DeviceTensor() = default;
    // Allocates numel(shape) elements of `dtype` on `device` (contents undefined until written).
    DeviceTensor(Device& device, DType dtype, std::initializer_list<std::int64_t> shape);
    const Tensor& tensor() const { return view_; }
    operator const Tensor&() const { return view_; }  // pass it where an op takes a Tensor

  private:
    DeviceBuffer buffer_;
    Tensor view_;
};

// Writes host[0, dst.numel()) into dst, converted to dst.dtype (f32, or bf16 with round-to-nearest-
// even; i32 tensors are refused). Enqueued on `stream` after the work already there; returns once
// the copy has completed (synchronizes `stream`, rethrowing an error of earlier work).
void copy_from_host(const float* host, const Tensor& dst, Stream& stream);
void copy_from_host(const std::vector<float>& host, const Tensor& dst, Stream& stream);  // sizes must match

// Reads src (f32 or bf16) into host f32 values once the work enqueued on `stream` so far has run
// (synchronizes `stream`).
std::vector<float> copy_to_host(const Tensor& src, Stream& stream);

}  // namespace scmoe
