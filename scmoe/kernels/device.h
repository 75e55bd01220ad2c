// The device layer: Device, Stream and Event behind one interface with three backends.
//
// Every op in kernels/ takes a Stream last and is ordered on it; cross-stream order only via
// Event. On the CPU backend a Stream is an in-order worker thread, so two CPU streams really run
// concurrently (comm and compute overlap on CPU the way they do on a GPU). On the emu backend
// (scmoe/kernels/emu/) a Stream is a lane of an emulated GPU's timeline: ops hold it for a modeled time
// and do not compute, with CUDA's rules for when the host blocks.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "scmoe/kernels/dtype.h"

namespace scmoe {

enum class Backend { kCpu, kCuda, kEmu };

const char* backend_name(Backend b);

class Event;

// Stream priority, as cudaStreamCreateWithPriority: when both have work ready, the GPU's block
// scheduler starts a high-priority stream's blocks first. The CPU backend ignores it.
enum class StreamPriority { kNormal, kHigh };

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
    // True while Device::capture records this stream's work into a graph; work that a graph cannot
    // replay faithfully (host tasks, sync checks) refuses then.
    virtual bool capturing() const { return false; }

    // SM budget: the most SMs a compute kernel enqueued on this stream from now on may occupy; 0 (the
    // default) = every SM. A kernel meant to run beside one of this stream's (an exchange's NCCL
    // kernels on another stream) can only become resident on SMs this stream's kernels leave free,
    // and a persistent kernel (CUTLASS's grouped GEMM) otherwise holds every SM until it ends (review
    // 2, #6). Honoured at enqueue by the persistent kernel, the cutlass-grouped GEMM
    // (GroupedGemmArgs::sm_limit: its grid, which leaves the results' bits unchanged); modeled the
    // same way by the emulated GPU (scmoe/kernels/emu/); ignored by the CPU backend
    // (Device::sm_count() is 0 there). Not passed on to cuBLAS or cuDNN: cuBLAS's SM count target
    // changes its kernel choice and so the bits (overlap on and off must agree bitwise), and cuDNN's
    // SDPA engines refuse a count below the device's (both seen on an H100, CUDA 13, cuDNN 9.19);
    // their kernels are not persistent, so an exchange's kernels get SMs as their blocks finish.
    // The LayerScheduler sets it on its backbone stream while an exchange overlaps backbone
    // compute. Throws for a negative count.
    void set_sm_budget(int sms);
    int sm_budget() const { return sm_budget_; }

    // Registers `check` to run on the host once the next synchronize() of this stream has waited
    // for the work enqueued before this call, in the thread that synchronizes. A check that throws
    // makes that synchronize() throw (the first error; every check taken still runs). The way to
    // read a flag the device wrote (copied to host memory) at a sync the caller makes anyway,
    // without a host_task in the stream: on CUDA those run on the driver's one callback thread and
    // hold up every other stream's callbacks (review L2). Checks registered while a synchronize()
    // waits run at the following one. A stream destroyed unsynchronized drops its checks.
    void check_at_sync(std::function<void()> check);

protected:
    // Each backend's synchronize(): take the checks before waiting, run them after the wait
    // succeeded (a failed wait's own error wins and the checks are dropped).
    std::vector<std::function<void()>> take_sync_checks();
    static void run_sync_checks(std::vector<std::function<void()>>& checks);
    // A backend whose ops read the budget elsewhere than from this Stream (CUDA: the stream's
    // resources, which ops reach by the cudaStream_t) takes it here.
    virtual void sm_budget_changed(int /*sms*/) {}

private:
    int sm_budget_ = 0;
    std::mutex sync_checks_mu_;
    std::vector<std::function<void()>> sync_checks_;
};

// Stream work recorded once (Device::capture) and replayed: a CUDA graph. replay() enqueues all of
// it on `stream`, reading and writing the same memory as when it was recorded, with the launch
// cost of one graph instead of one per kernel.
class StreamGraph {
public:
    virtual ~StreamGraph() = default;
    virtual void replay(Stream& stream) = 0;
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
    std::unique_ptr<Stream> create_stream(StreamPriority priority = StreamPriority::kNormal) {
        return make_stream(priority);
    }
    virtual std::unique_ptr<Event> create_event() = 0;
    // Records the work fn enqueues on `stream` as a graph instead of running it (CUDA: stream capture
    // in thread-local mode). fn must not synchronize, allocate, run host tasks or use another
    // stream; what it decides on the host (sizes, providers, a noise key) is fixed in the graph. Run
    // fn once eagerly first, so libraries allocate their workspaces outside the capture. CUDA only:
    // the other backends throw.
    virtual std::unique_ptr<StreamGraph> capture(Stream& stream, const std::function<void(Stream&)>& fn);
    // The issuing host thread's clock in microseconds, for timing host-side spans (a step, a
    // calibration): steady_clock on CPU and CUDA; the emulated host's clock on emu, which advances
    // by the modeled launch costs and jumps where the host blocks. Only differences are meaningful.
    virtual double host_time_us() const;
    // Streaming multiprocessors of the device (CUDA: cudaDevAttrMultiProcessorCount; emu: its spec's);
    // 0 on the CPU backend, which has none (its streams ignore SM budgets).
    virtual int sm_count() const { return 0; }
    // The device's index among its backend's devices (CUDA: the ordinal make_device got, as
    // cudaSetDevice takes it); 0 on the CPU and emu backends, which have one.
    virtual int ordinal() const { return 0; }

protected:
    virtual std::unique_ptr<Stream> make_stream(StreamPriority priority) = 0;
};

// True when the CUDA backend is built in and at least one device answers.
bool cuda_device_available();
// Why cuda_device_available() is false ("" when it is true): no CUDA backend in this build, no
// device, or the CUDA runtime's error (e.g. a driver too old for this runtime), never hidden.
std::string cuda_unavailable_reason();
// True when this build contains the CUDA backend.
bool cuda_backend_built();

// Creates a device: "cpu", "cuda" (error if none answers), "auto" (CUDA when a device answers,
// else CPU) or "emu" (an emulated GPU). `index` selects the GPU. `gpu` names the emulated GPU for
// "emu": a built-in spec (a30, a800, h100, h200; default h100) or a profile JSON file's path; it
// must be empty for the other backends.
std::unique_ptr<Device> make_device(std::string_view backend, int index = 0, std::string_view gpu = {});

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
