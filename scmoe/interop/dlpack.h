// DLPack interop: scmoe::Tensor views to and from DLPack tensors (DLManagedTensorVersioned, DLPack >= 1.0,
// and the legacy DLManagedTensor), the exchange PyTorch, JAX, CuPy and TVM share. Nothing is copied:
// an exported DLPack tensor points at the Tensor's memory, an imported Tensor at the DLPack tensor's.
//
// Memory: host memory on the CPU backend (DLPack device kDLCPU; kDLCUDAHost, pinned host memory, is
// taken too), device memory on CUDA (kDLCUDA with device_id = Device::ordinal(); kDLCUDAManaged is
// taken too). The emu backend's memory is modeled, not computed on, and is refused. Element types:
// f32 (kDLFloat, 32 bits), bf16 (kDLBfloat, 16 bits), i32 (kDLInt, 32 bits), one lane. Layout: an
// scmoe::Tensor is row-major and compact, so imported strides must be NULL or compact row-major
// (a dimension of extent 1 may carry any stride; so may every dimension of an empty tensor).
//
// Lifetimes. Neither direction owns the other side's memory:
//   - An exported DLManagedTensor(Versioned)'s deleter frees only what the export allocated (the
//     struct, its shape and strides), never the Tensor's memory: that memory must outlive the DLPack
//     tensor and everything a consumer made from it (e.g. a torch::Tensor from torch::fromDLPack).
//   - DLPackTensor holds an imported DLPack tensor and calls the producer's deleter when destroyed; its
//     tensor() view is valid until then.
// Streams: DLPack's C structs carry none. CUDA work on an imported tensor must be ordered after the
// producer's writes by the caller (e.g. synchronize the producer's stream, or make scmoe's stream wait
// on it), and the producer must not reuse the memory before scmoe's stream has finished with it.
#pragma once

#include <dlpack/dlpack.h>

#include "scmoe/kernels/device.h"
#include "scmoe/kernels/tensor.h"

// The layout of DLManagedTensorVersioned is fixed for every 1.x header (a minor version adds enum
// values only); a 0.x header (e.g. Debian's libdlpack-dev 0.6) has no versioned struct.
static_assert(DLPACK_MAJOR_VERSION == 1,
              "scmoe/interop/dlpack.h needs a DLPack 1.x dlpack.h: the <dlpack/dlpack.h> found first is another "
              "major version (scmoe ships 1.1 under include/scmoe/third_party/dlpack)");

namespace scmoe {

// Exports `t` (memory of `device`) as a DLPack 1.x tensor: device from `device`, dtype from t.dtype,
// shape t.dims[0, ndim), compact row-major strides (never NULL), byte_offset 0, flags
// DLPACK_FLAG_BITMASK_READ_ONLY when read_only (consumers must then not write), version 1.1. The caller
// owns the result until it hands it to a consumer (e.g. torch::fromDLPackVersioned), which calls its
// deleter. Throws scmoe::Error for the emu backend, a negative dimension or null data of a non-empty tensor.
DLManagedTensorVersioned* to_dlpack_versioned(const Tensor& t, const Device& device, bool read_only = false);
// The same as the legacy (pre-1.0) struct, for consumers that take only that (no version, no flags).
DLManagedTensor* to_dlpack(const Tensor& t, const Device& device);

// The Tensor view of `t` for use with `device`, after checking every field against what scmoe::Tensor
// and `device` can hold: device type (and, on CUDA, device_id == device.ordinal()), dtype (f32, bf16,
// i32; one lane), 0 <= ndim <= 4, shape >= 0, strides NULL or compact row-major, data + byte_offset
// non-null for a non-empty tensor and aligned to the element size. data of the result = t.data +
// t.byte_offset. Throws scmoe::Error "<what>: DLPack <field> ...", naming the field and the value.
Tensor tensor_from_dlpack(const DLTensor& t, const Device& device, const char* what);

// Whether an imported tensor will be written (checked against DLPACK_FLAG_BITMASK_READ_ONLY).
enum class DLPackAccess { kRead, kWrite };

// An imported DLPack tensor: owns the producer's DLManagedTensor(Versioned) and calls its deleter once,
// when destroyed (also when the constructor throws: a refused tensor is released, as DLPack requires).
// Move-only.
class DLPackTensor {
  public:
    DLPackTensor() = default;
    // Takes ownership of `managed` (nullptr throws). Checks the version (major 1; another major is
    // released unread, as the DLPack spec says), the read-only flag against `access`, and the tensor
    // as tensor_from_dlpack does.
    DLPackTensor(DLManagedTensorVersioned* managed, const Device& device, const char* what,
                 DLPackAccess access = DLPackAccess::kWrite);
    // The legacy struct carries no flags: `access` cannot be checked and is not asked for.
    DLPackTensor(DLManagedTensor* managed, const Device& device, const char* what);
    ~DLPackTensor();
    DLPackTensor(DLPackTensor&& other) noexcept;
    DLPackTensor& operator=(DLPackTensor&& other) noexcept;
    DLPackTensor(const DLPackTensor&) = delete;
    DLPackTensor& operator=(const DLPackTensor&) = delete;

    // The view; valid while this object holds the DLPack tensor.
    const Tensor& tensor() const { return tensor_; }
    bool holds() const { return versioned_ != nullptr || legacy_ != nullptr; }
    // Calls the producer's deleter now (idempotent); tensor() is undefined afterwards.
    void reset();

  private:
    DLManagedTensorVersioned* versioned_ = nullptr;
    DLManagedTensor* legacy_ = nullptr;
    Tensor tensor_;
};

}  // namespace scmoe
