// The device layer: Device, Stream and Event behind one interface with a CPU and a CUDA backend.
//
// Every op in kernels/ takes a Stream last and is ordered on it; cross-stream order only via
// Event. On the CPU backend a Stream is an in-order worker thread, so two CPU streams really run
// concurrently (comm and compute overlap on CPU the way they do on a GPU).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "kernels/dtype.h"

namespace scmoe {

enum class Backend { kCpu, kCuda };

const char* backend_name(Backend b);

class Event;

class Stream {
public:
    virtual ~Stream() = default;
    virtual Backend backend() const = 0;

    // Blocks until all work enqueued so far has finished; rethrows the first error raised by that
    // work (CPU) or reported by the device (CUDA).
    virtual void synchronize() = 0;
    // Work enqueued after this call starts only once `event` has completed.
    virtual void wait(const Event& event) = 0;
    // Stream-ordered copy of `bytes` bytes; either side may be host or device memory.
    virtual void copy(void* dst, const void* src, std::size_t bytes) = 0;
    // Stream-ordered memset to zero.
    virtual void fill_zero(void* dst, std::size_t bytes) = 0;
    // Enqueues a host function that runs in stream order (CPU: on the worker; CUDA: host callback).
    // It must not call back into the stream.
    virtual void host_task(std::function<void()> fn) = 0;
    // cudaStream_t on CUDA, nullptr on CPU.
    virtual void* native_handle() const = 0;
};

class Event {
public:
    virtual ~Event() = default;
    // Marks the point in `stream` reached by the work enqueued so far.
    virtual void record(Stream& stream) = 0;
    // Blocks the host until the recorded point is reached.
    virtual void synchronize() const = 0;
    // Milliseconds between `start` (recorded earlier) and this event; both must have completed.
    virtual float elapsed_ms_since(const Event& start) const = 0;
};

class Device {
public:
    virtual ~Device() = default;
    virtual Backend backend() const = 0;
    // One line for preambles: "cpu: 2 threads, OpenBLAS 0.3.21" / "cuda:0 NVIDIA H100 (sm_90, 80 GiB)".
    virtual std::string description() const = 0;
    // The dtype activations and weights are stored in: f32 on CPU, bf16 on CUDA.
    virtual DType compute_dtype() const = 0;
    // Memory the device's ops can read and write (256-byte aligned). Freed with deallocate().
    virtual void* allocate(std::size_t bytes) = 0;
    virtual void deallocate(void* ptr) = 0;
    // Host memory that stream copies can target asynchronously (pinned on CUDA).
    virtual void* allocate_host(std::size_t bytes) = 0;
    virtual void deallocate_host(void* ptr) = 0;
    virtual std::unique_ptr<Stream> create_stream() = 0;
    virtual std::unique_ptr<Event> create_event() = 0;
};

// True when the CUDA backend is built in and at least one device answers.
bool cuda_device_available();
// True when this build contains the CUDA backend.
bool cuda_backend_built();

// Creates a device: "cpu", "cuda" (error if none answers) or "auto" (CUDA when a device answers,
// else CPU). `index` selects the GPU.
std::unique_ptr<Device> make_device(std::string_view backend, int index = 0);

// Owns `bytes` of a device's memory for its lifetime.
class DeviceBuffer {
public:
    DeviceBuffer() = default;
    DeviceBuffer(Device& device, std::size_t bytes);
    ~DeviceBuffer();
    DeviceBuffer(DeviceBuffer&& other) noexcept;
    DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;

    void* data() const { return ptr_; }
    std::size_t bytes() const { return bytes_; }
    template <class T>
    T* as() const {
        return static_cast<T*>(ptr_);
    }

private:
    Device* device_ = nullptr;
    void* ptr_ = nullptr;
    std::size_t bytes_ = 0;
};

}  // namespace scmoe
