#include "scmoe/kernels/device.h"

#include <chrono>
#include <exception>
#include <utility>

#include "scmoe/kernels/cpu/cpu_device.h"
#include "scmoe/kernels/emu/emu_device.h"
#include "scmoe/kernels/error.h"
#if SCMOE_WITH_CUDA
#include "scmoe/kernels/cuda/cuda_ops.h"
#endif

namespace scmoe {

const char* backend_name(Backend b) {
    switch (b) {
        case Backend::kCpu: return "cpu";
        case Backend::kCuda: return "cuda";
        case Backend::kEmu: return "emu";
    }
    return "?";
}

void Stream::check_at_sync(std::function<void()> check) {
    SCMOE_CHECK(!capturing(), "a sync check cannot be captured into a graph: a replay would not register it");
    std::scoped_lock lock(sync_checks_mu_);
    sync_checks_.push_back(std::move(check));
}

void Stream::set_sm_budget(int sms) {
    SCMOE_CHECK(sms >= 0, "Stream::set_sm_budget(" << sms << "): the SMs a kernel may take, or 0 for every SM");
    if (sms == sm_budget_) return;
    sm_budget_ = sms;
    sm_budget_changed(sms);
}

std::vector<std::function<void()>> Stream::take_sync_checks() {
    std::scoped_lock lock(sync_checks_mu_);
    return std::exchange(sync_checks_, {});
}

void Stream::run_sync_checks(std::vector<std::function<void()>>& checks) {
    std::exception_ptr first;
    for (auto& check : checks) {
        try {
            check();
        } catch (...) {
            if (!first) first = std::current_exception();
        }
    }
    checks.clear();
    if (first) std::rethrow_exception(first);
}

std::unique_ptr<StreamGraph> Device::capture(Stream&, const std::function<void(Stream&)>&) {
    SCMOE_FAIL("graph capture needs the CUDA backend; the " << backend_name(backend()) << " backend runs work eagerly");
}

double Device::host_time_us() const {
    using Clock = std::chrono::steady_clock;
    static const Clock::time_point origin = Clock::now();
    return std::chrono::duration<double, std::micro>(Clock::now() - origin).count();
}

bool cuda_backend_built() { return SCMOE_WITH_CUDA != 0; }

bool cuda_device_available() {
#if SCMOE_WITH_CUDA
    return cuda::device_count() > 0;
#else
    return false;
#endif
}

std::string cuda_unavailable_reason() {
#if SCMOE_WITH_CUDA
    return cuda::unavailable_reason();
#else
    return "this build has no CUDA backend (configure with -DSCMOE_WITH_CUDA=ON)";
#endif
}

std::unique_ptr<Device> make_device(std::string_view backend, [[maybe_unused]] int index, std::string_view gpu) {
    if (backend == "emu") {
        emu::EmuOptions options;
        options.spec = emu::builtin_gpu_spec(gpu.empty() ? "h100" : gpu);
        return emu::make_device(std::move(options));
    }
    SCMOE_CHECK(gpu.empty(), "--gpu " << gpu << " names an emulated GPU: it needs --backend emu");
    if (backend == "cpu") return cpu::make_device();
    if (backend == "cuda" || backend == "auto") {
        if (cuda_device_available()) {
#if SCMOE_WITH_CUDA
            int count = cuda::device_count();
            SCMOE_CHECK(index >= 0 && index < count, "CUDA device index " << index << " out of range: " << count
                                                                           << " device(s) visible");
            return cuda::make_device(index);
#endif
        }
        if (backend == "auto") return cpu::make_device();
        SCMOE_FAIL("--backend cuda asked for, but " << cuda_unavailable_reason()
                                                    << (cuda_backend_built() ? " (check nvidia-smi and CUDA_VISIBLE_DEVICES)"
                                                                             : ""));
    }
    SCMOE_FAIL("unknown backend '" << backend << "': expected auto, cpu, cuda or emu");
}

DeviceBuffer::DeviceBuffer(Device& device, std::size_t bytes)
    : device_(&device), ptr_(device.allocate(bytes)), bytes_(bytes) {}
DeviceBuffer::~DeviceBuffer() {
    if (device_ && ptr_) device_->deallocate(ptr_);
}
DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : device_(std::exchange(other.device_, nullptr)),
      ptr_(std::exchange(other.ptr_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)) {}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
        if (device_ && ptr_) device_->deallocate(ptr_);
        device_ = std::exchange(other.device_, nullptr);
        ptr_ = std::exchange(other.ptr_, nullptr);
        bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
}

}  // namespace scmoe
