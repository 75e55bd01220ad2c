// CUDA runtime helpers shared by the communicators' CUDA paths (NcclCommunicator, LocalCommunicator
// on CUDA streams). Private to comm/; included only in builds with CUDA.
#pragma once

#include <cuda_runtime.h>

#include "scmoe/kernels/error.h"

namespace scmoe::comm_detail {

// Sets the current device for a scope and restores the previous one.
class DeviceScope {
  public:
    explicit DeviceScope(int device) {
        if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
        const cudaError_t e = cudaSetDevice(device);
        SCMOE_CHECK(e == cudaSuccess, "cudaSetDevice(" << device << "): " << cudaGetErrorString(e));
    }
    ~DeviceScope() {
        if (previous_ >= 0) cudaSetDevice(previous_);  // NOTES: cannot throw from a destructor
    }
    DeviceScope(const DeviceScope&) = delete;
    DeviceScope& operator=(const DeviceScope&) = delete;

  private:
    int previous_ = -1;
};

// What CUDA knows about `ptr`; pageable host memory is cudaMemoryTypeUnregistered.
inline cudaPointerAttributes pointer_attributes(const void* ptr) {
    cudaPointerAttributes attr{};
    if (cudaPointerGetAttributes(&attr, ptr) != cudaSuccess) {
        cudaGetLastError();  // unregistered host memory on old drivers: clear the non-sticky error
        attr = cudaPointerAttributes{};
        attr.type = cudaMemoryTypeUnregistered;
    }
    return attr;
}

// True when `ptr` is memory the GPU owns (device or managed); host pointers, registered or not,
// are read and written by the host directly.
inline bool is_device_pointer(const void* ptr) {
    const cudaMemoryType type = pointer_attributes(ptr).type;
    return type == cudaMemoryTypeDevice || type == cudaMemoryTypeManaged;
}

}  // namespace scmoe::comm_detail
