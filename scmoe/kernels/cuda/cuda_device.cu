// The CUDA backend's Device, Stream and Event, and the per-stream resources (cuBLAS handle,
// scratch) ops look up from a cudaStream_t.
#include <cstdio>
#include <exception>
#include <memory>
#include <mutex>
#include <sstream>
#include <unordered_map>

#include "scmoe/kernels/cuda/check.cuh"
#include "scmoe/kernels/cuda/cuda_ops.h"
#include "scmoe/kernels/cuda/stream_resources.cuh"
#include "scmoe/kernels/host_syncs.h"

namespace scmoe::cuda {

const char* cublas_status_string(cublasStatus_t status) {
    switch (status) {
        case CUBLAS_STATUS_SUCCESS:
            return "CUBLAS_STATUS_SUCCESS";
        case CUBLAS_STATUS_NOT_INITIALIZED:
            return "CUBLAS_STATUS_NOT_INITIALIZED";
        case CUBLAS_STATUS_ALLOC_FAILED:
            return "CUBLAS_STATUS_ALLOC_FAILED";
        case CUBLAS_STATUS_INVALID_VALUE:
            return "CUBLAS_STATUS_INVALID_VALUE";
        case CUBLAS_STATUS_ARCH_MISMATCH:
            return "CUBLAS_STATUS_ARCH_MISMATCH";
        case CUBLAS_STATUS_MAPPING_ERROR:
            return "CUBLAS_STATUS_MAPPING_ERROR";
        case CUBLAS_STATUS_EXECUTION_FAILED:
            return "CUBLAS_STATUS_EXECUTION_FAILED";
        case CUBLAS_STATUS_INTERNAL_ERROR:
            return "CUBLAS_STATUS_INTERNAL_ERROR";
        case CUBLAS_STATUS_NOT_SUPPORTED:
            return "CUBLAS_STATUS_NOT_SUPPORTED";
        case CUBLAS_STATUS_LICENSE_ERROR:
            return "CUBLAS_STATUS_LICENSE_ERROR";
    }
    return "unknown cuBLAS status";
}

// ---- Per-stream resources ------------------------------------------------------------------

namespace {

std::mutex& registry_mutex() {
    static std::mutex mu;
    return mu;
}
// NOTES: intentionally leaked: handles of foreign streams live until exit, and destroying cuBLAS
// handles from a static destructor can run after the CUDA runtime has shut down.
std::unordered_map<cudaStream_t, std::unique_ptr<StreamResources>>& registry() {
    static auto* map = new std::unordered_map<cudaStream_t, std::unique_ptr<StreamResources>>();
    return *map;
}

std::unique_ptr<StreamResources> create_resources(cudaStream_t stream, int device) {
    auto res = std::make_unique<StreamResources>();
    res->device = device;
    SCMOE_CUDA_CHECK(cudaMalloc(&res->cublas_workspace, kCublasWorkspaceBytes));
    SCMOE_CUDA_CHECK(cudaMalloc(&res->scratch, kScratchBytes));
    SCMOE_CUBLAS_CHECK(cublasCreate(&res->cublas));
    SCMOE_CUBLAS_CHECK(cublasSetStream(res->cublas, stream));
    SCMOE_CUBLAS_CHECK(cublasSetWorkspace(res->cublas, res->cublas_workspace, kCublasWorkspaceBytes));
    return res;
}

void destroy_resources(StreamResources& res) noexcept {
    if (res.cublas) cublasDestroy(res.cublas);
    if (res.cublas_workspace) cudaFree(res.cublas_workspace);
    if (res.scratch) cudaFree(res.scratch);
    if (res.host_pinned) cudaFreeHost(res.host_pinned);
}

}  // namespace

void register_stream(cudaStream_t stream, int device) {
    auto res = create_resources(stream, device);
    std::scoped_lock lock(registry_mutex());
    auto& slot = registry()[stream];
    if (slot) destroy_resources(*slot);
    slot = std::move(res);
}

void unregister_stream(cudaStream_t stream) noexcept {
    std::unique_ptr<StreamResources> res;
    {
        std::scoped_lock lock(registry_mutex());
        auto it = registry().find(stream);
        if (it == registry().end()) return;
        res = std::move(it->second);
        registry().erase(it);
    }
    destroy_resources(*res);
}

cublasHandle_t cublas_handle(StreamResources& res) { return res.cublas; }

int stream_device(cudaStream_t stream) {
    {
        std::scoped_lock lock(registry_mutex());
        auto it = registry().find(stream);
        if (it != registry().end() && it->second) return it->second->device;
    }
    int device = 0;
    SCMOE_CUDA_CHECK(cudaStreamGetDevice(stream, &device));
    return device;
}

StreamResources& stream_resources(cudaStream_t stream) {
    // While the stream is captured, cudaStreamGetDevice is refused: trust the registered device
    // (the backend's streams unregister when destroyed, so a handle cannot be reused under it).
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    SCMOE_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
    if (capture != cudaStreamCaptureStatusNone) {
        std::scoped_lock lock(registry_mutex());
        auto it = registry().find(stream);
        SCMOE_CHECK(it != registry().end() && it->second,
                    "a CUDA stream scmoe has not used before is being captured into a graph: run one op on it "
                    "before capturing (its resources are set up outside the capture)");
        return *it->second;
    }
    int device = 0;
    SCMOE_CUDA_CHECK(cudaStreamGetDevice(stream, &device));
    std::scoped_lock lock(registry_mutex());
    auto& slot = registry()[stream];
    if (!slot || slot->device != device) {
        // A stream the backend did not create (or a recycled handle on another device).
        DeviceGuard guard(device);
        auto res = create_resources(stream, device);
        if (slot) destroy_resources(*slot);
        slot = std::move(res);
    }
    return *slot;
}

void* host_staging(StreamResources& res, std::size_t bytes) {
    if (res.host_pinned_bytes < bytes) {
        if (res.host_pinned) SCMOE_CUDA_CHECK(cudaFreeHost(res.host_pinned));
        res.host_pinned = nullptr;
        res.host_pinned_bytes = 0;
        SCMOE_CUDA_CHECK(cudaMallocHost(&res.host_pinned, bytes));
        res.host_pinned_bytes = bytes;
    }
    return res.host_pinned;
}

// ---- Device, Stream, Event -----------------------------------------------------------------

namespace {

// NOTES: a host task's state outlives the call that enqueued it; the callback owns it. The first
// exception a task throws is stored in the stream's shared state; later host tasks are skipped
// (their inputs may be garbage, as on the CPU backend) until synchronize() rethrows it.
struct HostTaskErrors {
    std::mutex mu;
    std::exception_ptr error;
};

struct HostTask {
    std::function<void()> fn;
    std::shared_ptr<HostTaskErrors> errors;
};

void CUDART_CB run_host_task(void* data) {
    std::unique_ptr<HostTask> task(static_cast<HostTask*>(data));
    {
        std::scoped_lock lock(task->errors->mu);
        if (task->errors->error) return;
    }
    try {
        task->fn();
    } catch (...) {
        std::scoped_lock lock(task->errors->mu);
        if (!task->errors->error) task->errors->error = std::current_exception();
    }
}

class CudaEvent;

class CudaStream final : public Stream {
  public:
    CudaStream(int device, StreamPriority priority) : device_(device), errors_(std::make_shared<HostTaskErrors>()) {
        DeviceGuard guard(device_);
        // CUDA priorities: lower numbers are higher; the range comes from the device.
        int least = 0, greatest = 0;
        SCMOE_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
        const int value = priority == StreamPriority::kHigh ? greatest : least;
        SCMOE_CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, value));
        try {
            register_stream(stream_, device_);
        } catch (...) {
            cudaStreamDestroy(stream_);
            throw;
        }
    }
    ~CudaStream() override {
        int previous = 0;
        const bool have_previous = cudaGetDevice(&previous) == cudaSuccess;
        cudaSetDevice(device_);
        cudaStreamSynchronize(stream_);  // NOTES: errors ignored: a destructor cannot throw
        unregister_stream(stream_);
        cudaStreamDestroy(stream_);
        if (have_previous) cudaSetDevice(previous);
    }
    CudaStream(const CudaStream&) = delete;
    CudaStream& operator=(const CudaStream&) = delete;

    Backend backend() const override { return Backend::kCuda; }
    void* native_handle() const override { return stream_; }
    bool capturing() const override {
        cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
        SCMOE_CUDA_CHECK(cudaStreamIsCapturing(stream_, &status));
        return status != cudaStreamCaptureStatusNone;
    }

    void synchronize() override {
        detail::count_host_sync();
        auto checks = take_sync_checks();
        DeviceGuard guard(device_);
        SCMOE_CUDA_CHECK(cudaStreamSynchronize(stream_));
        SCMOE_CUDA_CHECK(cudaGetLastError());
        std::exception_ptr e;
        {
            std::scoped_lock lock(errors_->mu);
            e = std::exchange(errors_->error, nullptr);
        }
        if (e) std::rethrow_exception(e);
        run_sync_checks(checks);
    }
    void wait(const Event& event) override;
    void copy(void* dst, const void* src, std::size_t bytes) override {
        if (bytes == 0) return;
        DeviceGuard guard(device_);
        SCMOE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_));
    }
    void fill_zero(void* dst, std::size_t bytes) override {
        if (bytes == 0) return;
        DeviceGuard guard(device_);
        SCMOE_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, stream_));
    }
    void host_task(std::function<void()> fn) override {
        // A captured host node would replay a task that deletes itself after its first run.
        SCMOE_CHECK(!capturing(), "a host task cannot be captured into a CUDA graph");
        DeviceGuard guard(device_);
        auto task = std::make_unique<HostTask>(HostTask{std::move(fn), errors_});
        SCMOE_CUDA_CHECK(cudaLaunchHostFunc(stream_, run_host_task, task.get()));
        task.release();  // owned by the callback now
    }

  protected:
    // The ops read the budget from the stream's resources (they get the cudaStream_t only).
    void sm_budget_changed(int sms) override { stream_resources(stream_).sm_budget = sms; }

  private:
    int device_;
    cudaStream_t stream_ = nullptr;
    std::shared_ptr<HostTaskErrors> errors_;
};

class CudaEvent final : public Event {
  public:
    explicit CudaEvent(int device) : device_(device) {
        DeviceGuard guard(device_);
        SCMOE_CUDA_CHECK(cudaEventCreate(&event_));  // default flags: timing enabled
    }
    ~CudaEvent() override { cudaEventDestroy(event_); }
    CudaEvent(const CudaEvent&) = delete;
    CudaEvent& operator=(const CudaEvent&) = delete;

    void record(Stream& stream) override {
        SCMOE_CHECK(stream.backend() == Backend::kCuda,
                    "CUDA event recorded on a " << backend_name(stream.backend()) << " stream");
        DeviceGuard guard(device_);
        SCMOE_CUDA_CHECK(cudaEventRecord(event_, static_cast<cudaStream_t>(stream.native_handle())));
    }
    void synchronize() const override {
        detail::count_host_sync();
        DeviceGuard guard(device_);
        SCMOE_CUDA_CHECK(cudaEventSynchronize(event_));
    }
    float elapsed_ms_since(const Event& start) const override {
        const auto& s = dynamic_cast<const CudaEvent&>(start);
        DeviceGuard guard(device_);
        float ms = 0.0f;
        SCMOE_CUDA_CHECK(cudaEventSynchronize(event_));
        SCMOE_CUDA_CHECK(cudaEventElapsedTime(&ms, s.event_, event_));
        return ms;
    }
    cudaEvent_t native() const { return event_; }

  private:
    int device_;
    cudaEvent_t event_ = nullptr;
};

// A captured and instantiated graph (Device::capture).
class CudaGraph final : public StreamGraph {
  public:
    CudaGraph(int device, cudaGraph_t graph) : device_(device), graph_(graph) {
        DeviceGuard guard(device_);
        const cudaError_t e = cudaGraphInstantiate(&exec_, graph_, 0);
        if (e != cudaSuccess) {
            cudaGraphDestroy(graph_);
            SCMOE_FAIL("cudaGraphInstantiate failed: " << cudaGetErrorString(e));
        }
    }
    ~CudaGraph() override {
        cudaGraphExecDestroy(exec_);
        cudaGraphDestroy(graph_);
    }
    CudaGraph(const CudaGraph&) = delete;
    CudaGraph& operator=(const CudaGraph&) = delete;
    void replay(Stream& stream) override {
        SCMOE_CHECK(stream.backend() == Backend::kCuda,
                    "a CUDA graph replayed on a " << backend_name(stream.backend()) << " stream");
        DeviceGuard guard(device_);
        SCMOE_CUDA_CHECK(cudaGraphLaunch(exec_, static_cast<cudaStream_t>(stream.native_handle())));
    }

  private:
    int device_;
    cudaGraph_t graph_ = nullptr;
    cudaGraphExec_t exec_ = nullptr;
};

void CudaStream::wait(const Event& event) {
    const auto& e = dynamic_cast<const CudaEvent&>(event);
    DeviceGuard guard(device_);
    SCMOE_CUDA_CHECK(cudaStreamWaitEvent(stream_, e.native(), 0));
}

class CudaDevice final : public Device {
  public:
    explicit CudaDevice(int index) : index_(index) {
        DeviceGuard guard(index_);
        SCMOE_CUDA_CHECK(cudaGetDeviceProperties(&props_, index_));
        SCMOE_CUDA_CHECK(cudaFree(nullptr));  // creates the context now, not inside the first op
    }

    Backend backend() const override { return Backend::kCuda; }
    std::string description() const override {
        std::ostringstream os;
        os << "cuda:" << index_ << ' ' << props_.name << " (sm_" << props_.major << props_.minor << ", "
           << (props_.totalGlobalMem >> 30) << " GiB, " << props_.multiProcessorCount << " SMs)";
        return os.str();
    }
    DType compute_dtype() const override { return DType::kBF16; }
    int sm_count() const override { return props_.multiProcessorCount; }
    int ordinal() const override { return index_; }

    void* allocate(std::size_t bytes) override {
        if (bytes == 0) return nullptr;
        DeviceGuard guard(index_);
        void* p = nullptr;
        cudaError_t err = cudaMalloc(&p, bytes);
        if (err != cudaSuccess) {
            cudaGetLastError();
            std::size_t free_bytes = 0, total_bytes = 0;
            cudaMemGetInfo(&free_bytes, &total_bytes);
            SCMOE_FAIL("cudaMalloc(" << bytes << " bytes) on cuda:" << index_ << " failed: " << cudaGetErrorString(err)
                                     << " (" << (free_bytes >> 20) << " MiB free of " << (total_bytes >> 20)
                                     << " MiB)");
        }
        return p;
    }
    void deallocate(void* ptr) override {
        if (!ptr) return;
        int previous = 0;
        const bool have_previous = cudaGetDevice(&previous) == cudaSuccess;
        cudaSetDevice(index_);
        cudaError_t err = cudaFree(ptr);  // NOTES: called from destructors: report, never throw
        if (err != cudaSuccess) std::fprintf(stderr, "scmoe: cudaFree failed: %s\n", cudaGetErrorString(err));
        if (have_previous) cudaSetDevice(previous);
    }
    void* allocate_host(std::size_t bytes) override {
        if (bytes == 0) return nullptr;
        DeviceGuard guard(index_);
        void* p = nullptr;
        SCMOE_CUDA_CHECK(cudaMallocHost(&p, bytes));
        return p;
    }
    void deallocate_host(void* ptr) override {
        if (!ptr) return;
        cudaError_t err = cudaFreeHost(ptr);
        if (err != cudaSuccess) std::fprintf(stderr, "scmoe: cudaFreeHost failed: %s\n", cudaGetErrorString(err));
    }
    std::unique_ptr<Stream> make_stream(StreamPriority priority) override {
        return std::make_unique<CudaStream>(index_, priority);
    }
    std::unique_ptr<Event> create_event() override { return std::make_unique<CudaEvent>(index_); }
    std::unique_ptr<StreamGraph> capture(Stream& stream, const std::function<void(Stream&)>& fn) override;

  private:
    int index_;
    cudaDeviceProp props_{};
};

std::unique_ptr<StreamGraph> CudaDevice::capture(Stream& stream, const std::function<void(Stream&)>& fn) {
    SCMOE_CHECK(stream.backend() == Backend::kCuda, "capture on a " << backend_name(stream.backend()) << " stream");
    DeviceGuard guard(index_);
    auto s = static_cast<cudaStream_t>(stream.native_handle());
    SCMOE_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    cudaGraph_t graph = nullptr;
    try {
        fn(stream);
    } catch (...) {
        cudaStreamEndCapture(s, &graph);  // ends the capture; the partial graph is dropped
        if (graph) cudaGraphDestroy(graph);
        cudaGetLastError();
        throw;
    }
    const cudaError_t e = cudaStreamEndCapture(s, &graph);
    if (e != cudaSuccess) {
        if (graph) cudaGraphDestroy(graph);
        cudaGetLastError();
        SCMOE_FAIL("CUDA graph capture failed: " << cudaGetErrorString(e)
                                                 << " (the captured work synchronized, allocated or used another "
                                                    "stream without joining it)");
    }
    return std::make_unique<CudaGraph>(index_, graph);
}

}  // namespace

namespace {
// One cudaGetDeviceCount: the count, or 0 and why.
std::pair<int, std::string> probe_devices() {
    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    if (err == cudaSuccess && count > 0) return {count, ""};
    cudaGetLastError();  // not sticky: clear it for later calls
    if (err == cudaSuccess || err == cudaErrorNoDevice) return {0, "no CUDA device (cudaErrorNoDevice)"};
    return {0, std::string("cudaGetDeviceCount failed: ") + cudaGetErrorName(err) + ": " + cudaGetErrorString(err) +
                   (err == cudaErrorInsufficientDriver
                        ? " (no NVIDIA driver, or one older than this CUDA " + std::to_string(CUDART_VERSION / 1000) +
                              " runtime: install or update the driver)"
                        : std::string())};
}
}  // namespace

int device_count() { return probe_devices().first; }

std::string unavailable_reason() { return probe_devices().second; }

std::unique_ptr<Device> make_device(int index) {
    const int count = device_count();
    SCMOE_CHECK(index >= 0 && index < count,
                "CUDA device index " << index << " out of range: " << count << " device(s) visible");
    return std::make_unique<CudaDevice>(index);
}

}  // namespace scmoe::cuda
