#include "scmoe/kernels/emu/emu_device.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>

#include "scmoe/kernels/emu/cost_model.h"
#include "scmoe/kernels/error.h"
#include "scmoe/kernels/host_syncs.h"

namespace scmoe::emu {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;

class EmuDeviceImpl;

class EmuEventImpl final : public Event {
public:
    void record(Stream& stream) override;
    void synchronize() const override {
        detail::count_host_sync();
        if (!timeline_) return;
        timeline_->synchronize(state_, state_->recorded);
    }
    float elapsed_ms_since(const Event& start) const override {
        const auto& s = dynamic_cast<const EmuEventImpl&>(start);
        SCMOE_CHECK(timeline_ && s.timeline_, "emu: elapsed time of an event that was never recorded");
        synchronize();
        s.synchronize();
        const double end = timeline_->event_time_us(*state_, state_->recorded);
        const double begin = s.timeline_->event_time_us(*s.state_, s.state_->recorded);
        return static_cast<float>((end - begin) / 1000.0);
    }
    const std::shared_ptr<EventState>& state() const { return state_; }

private:
    std::shared_ptr<EventState> state_ = std::make_shared<EventState>();
    Timeline* timeline_ = nullptr;
};

class EmuStreamImpl final : public EmuStream {
public:
    EmuStreamImpl(EmuDeviceImpl& device, StreamPriority priority);
    ~EmuStreamImpl() override;
    Backend backend() const override { return Backend::kEmu; }
    void* native_handle() const override { return nullptr; }
    EmuDevice& device() override;
    int id() const override { return id_; }

    void synchronize() override;
    void wait(const Event& event) override {
        const auto& e = dynamic_cast<const EmuEventImpl&>(event);
        Work w;
        w.kind = WorkKind::kWait;
        w.name = "wait_event";
        w.event = e.state();
        w.generation = e.state()->recorded;
        if (w.generation == 0) return;  // never recorded: nothing to wait for (as CUDA)
        timeline().enqueue(id_, std::move(w), 0.0);
    }
    void copy(void* dst, const void* src, std::size_t bytes) override;
    void fill_zero(void* dst, std::size_t bytes) override;
    void host_task(std::function<void()> fn) override {
        Work w;
        w.kind = WorkKind::kHostTask;
        w.name = "host_task";
        w.work_us = spec().host_task_us;
        w.effect = std::move(fn);
        timeline().enqueue(id_, std::move(w), spec().launch_us);
    }
    void launch(const std::string& name, const OpCost& cost, std::function<void()> effect) override {
        Work w = kernel(name, std::move(effect));
        // The stream's SM budget is not applied: on CUDA only the persistent grouped GEMM honours it,
        // and its sm_limit already carries it (grouped_gemm_sm_limit).
        const KernelTime t = model_kernel(cost, spec(), 0, small_gemm_fraction(stack(), cost));
        w.work_us = t.work_us;
        w.demand = t.demand;
        timeline().enqueue(id_, std::move(w), launch_host_us());
    }
    void launch_sized_at_start(const std::string& name, std::function<OpCost()> cost,
                               std::function<void()> effect) override {
        launch_shaped_at_start(name, std::move(cost), KernelShape{}, std::move(effect));
    }
    void launch_shaped_at_start(const std::string& name, std::function<OpCost()> cost, KernelShape shape,
                                std::function<void()> effect) override {
        Work w = kernel(name, std::move(effect));
        // shape.sm_limit: the kernel's own grid limit (the grouped GEMM's carries the stream's SM
        // budget from when it was enqueued, as CUDA's launch fixes the grid then).
        w.at_start = [cost = std::move(cost), s = &spec(), st = &stack(), shape](Work& work) {
            const OpCost c = cost();
            const KernelTime t = model_kernel(c, *s, shape.sm_limit, small_gemm_fraction(*st, c));
            work.work_us = t.work_us;
            work.demand = t.demand;
            if (shape.persistent) {
                const int grid = shape.sm_limit > 0 ? std::min(shape.sm_limit, s->sms) : s->sms;
                const double tiles = std::ceil(c.threads / 256.0);  // cost_model.h: one 256-thread block per tile
                work.resident_sms = static_cast<int>(std::min(static_cast<double>(grid), tiles));
                work.block = shape.block;
                if (work.resident_sms > 0) work.demand = static_cast<double>(work.resident_sms) / s->sms;
            }
        };
        timeline().enqueue(id_, std::move(w), launch_host_us());
    }
    // Enqueues a record of `state`; the host-side generation bump (as CpuEvent's) makes waits
    // enqueued from now on wait for it.
    void record(const std::shared_ptr<EventState>& state) {
        Work w;
        w.kind = WorkKind::kRecord;
        w.name = "record_event";
        w.event = state;
        w.generation = ++state->recorded;
        timeline().enqueue(id_, std::move(w), 0.0);
    }
    Timeline& timeline();

private:
    const GpuSpec& spec() const;
    const Stack& stack() const;
    double launch_host_us() const;
    // A kernel's Work without its time: the stream's kernel gap first, `effect` at its end.
    Work kernel(const std::string& name, std::function<void()> effect) const {
        Work w;
        w.kind = WorkKind::kKernel;
        w.name = name;
        w.fixed_us = spec().kernel_gap_us;
        w.effect = std::move(effect);
        return w;
    }
    EmuDeviceImpl& device_;
    int id_;
};

class EmuDeviceImpl final : public EmuDevice {
public:
    explicit EmuDeviceImpl(EmuOptions options) : options_(std::move(options)), timeline_(options_.spec) {}
    ~EmuDeviceImpl() override {
        std::scoped_lock lock(mu_);
        for (auto& [p, bytes] : allocations_) munmap(reinterpret_cast<void*>(p), bytes);
        for (auto& [p, bytes] : pinned_) munmap(reinterpret_cast<void*>(p), bytes);
    }
    Backend backend() const override { return Backend::kEmu; }
    std::string description() const override {
        return "emu: " + describe(options_.spec) + " (modeled, nothing computed); routing " +
               emu::describe(options_.routing) +
               (options_.stack.name == "scmoe" ? std::string() : "; stack " + emu::describe(options_.stack));
    }
    DType compute_dtype() const override { return options_.spec.compute_dtype; }
    void* allocate(std::size_t bytes) override {
        if (bytes == 0) return nullptr;
        const std::size_t rounded = (bytes + 255) / 256 * 256;
        std::scoped_lock lock(mu_);
        const std::uint64_t capacity = options_.spec.memory_bytes;
        if (stats_.in_use + rounded > capacity) {
            std::ostringstream os;
            os.setf(std::ios::fixed);
            os.precision(1);
            os << "emulated cudaMalloc(" << static_cast<double>(bytes) / kMiB << " MiB) failed: out of memory on "
               << options_.spec.description << " (" << static_cast<double>(stats_.in_use) / kMiB << " MiB in use of "
               << static_cast<double>(capacity) / kMiB << " MiB; peak "
               << static_cast<double>(stats_.peak) / kMiB << " MiB)";
            throw Error(os.str());
        }
        void* p = mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        SCMOE_CHECK(p != MAP_FAILED, "emu: reserving " << rounded << " bytes of address space failed: "
                                                       << std::strerror(errno));
        allocations_[reinterpret_cast<std::uintptr_t>(p)] = rounded;
        stats_.in_use += rounded;
        stats_.peak = std::max(stats_.peak, stats_.in_use);
        return p;
    }
    void deallocate(void* ptr) override {
        if (!ptr) return;
        std::scoped_lock lock(mu_);
        auto it = allocations_.find(reinterpret_cast<std::uintptr_t>(ptr));
        if (it == allocations_.end()) return;
        munmap(ptr, it->second);
        stats_.in_use -= it->second;
        allocations_.erase(it);
    }
    // Pinned host memory is real host memory (copies to the host are performed), not counted in the
    // GPU's memory (cudaHostAlloc takes none of it). Reserved like device memory (MAP_NORESERVE):
    // a payload no op writes (offloaded experts, scmoe/models/expert_cache.h) costs no host memory.
    void* allocate_host(std::size_t bytes) override {
        if (bytes == 0) return nullptr;
        const std::size_t rounded = (bytes + 255) / 256 * 256;
        void* p = mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) throw std::bad_alloc();
        std::scoped_lock lock(mu_);
        pinned_[reinterpret_cast<std::uintptr_t>(p)] = rounded;
        return p;
    }
    void deallocate_host(void* ptr) override {
        if (!ptr) return;
        std::scoped_lock lock(mu_);
        auto it = pinned_.find(reinterpret_cast<std::uintptr_t>(ptr));
        if (it == pinned_.end()) return;
        munmap(ptr, it->second);
        pinned_.erase(it);
    }
    std::unique_ptr<Event> create_event() override { return std::make_unique<EmuEventImpl>(); }
    double host_time_us() const override { return timeline_.host_time_us(); }

    std::uint64_t next_router_draw() override { return router_draws_++; }
    const GpuSpec& spec() const override { return options_.spec; }
    const RoutingModel& routing() const override { return options_.routing; }
    const Stack& stack() const override { return options_.stack; }
    Timeline& timeline() override { return timeline_; }
    MemoryStats memory() const override {
        std::scoped_lock lock(mu_);
        MemoryStats m = stats_;
        m.capacity = options_.spec.memory_bytes;
        return m;
    }
    void hold(const void* key, int slot, std::size_t bytes) override {
        release(key, slot);
        void* p = allocate(bytes);
        std::scoped_lock lock(held_mu_);
        held_[{key, slot}] = p;
    }
    void release(const void* key, int slot) override {
        void* p = nullptr;
        {
            std::scoped_lock lock(held_mu_);
            auto it = held_.find({key, slot});
            if (it == held_.end()) return;
            p = it->second;
            held_.erase(it);
        }
        deallocate(p);
    }
    bool is_device_memory(const void* ptr, std::size_t bytes) const override {
        std::scoped_lock lock(mu_);
        return contains(allocations_, ptr, bytes);
    }
    bool is_pinned(const void* ptr, std::size_t bytes) const {
        std::scoped_lock lock(mu_);
        return contains(pinned_, ptr, bytes);
    }

protected:
    std::unique_ptr<Stream> make_stream(StreamPriority priority) override {
        return std::make_unique<EmuStreamImpl>(*this, priority);
    }

private:
    static bool contains(const std::map<std::uintptr_t, std::size_t>& ranges, const void* ptr, std::size_t bytes) {
        const auto p = reinterpret_cast<std::uintptr_t>(ptr);
        auto it = ranges.upper_bound(p);
        if (it == ranges.begin()) return false;
        --it;
        return p >= it->first && p + bytes <= it->first + it->second;
    }

    EmuOptions options_;
    Timeline timeline_;
    mutable std::mutex mu_;
    std::map<std::uintptr_t, std::size_t> allocations_, pinned_;
    MemoryStats stats_;
    std::mutex held_mu_;
    std::map<std::pair<const void*, int>, void*> held_;  // hold(): (key, slot) -> allocation
    std::atomic<std::uint64_t> router_draws_{0};
};

EmuStreamImpl::EmuStreamImpl(EmuDeviceImpl& device, StreamPriority priority)
    : device_(device), id_(device.timeline().add_stream(priority == StreamPriority::kHigh ? 1 : 0)) {}

EmuStreamImpl::~EmuStreamImpl() { device_.timeline().remove_stream(id_); }

EmuDevice& EmuStreamImpl::device() { return device_; }
Timeline& EmuStreamImpl::timeline() { return device_.timeline(); }
const GpuSpec& EmuStreamImpl::spec() const { return device_.spec(); }
const Stack& EmuStreamImpl::stack() const { return device_.stack(); }
double EmuStreamImpl::launch_host_us() const { return device_.launch_host_us(); }

void EmuStreamImpl::synchronize() {
    detail::count_host_sync();
    auto checks = take_sync_checks();
    timeline().synchronize(id_);
    run_sync_checks(checks);
}

void EmuStreamImpl::copy(void* dst, const void* src, std::size_t bytes) {
    if (bytes == 0) return;
    const bool dst_device = device_.is_device_memory(dst, bytes);
    const bool src_device = device_.is_device_memory(src, bytes);
    const bool pageable = (!dst_device && !device_.is_pinned(dst, bytes)) ||
                          (!src_device && !device_.is_pinned(src, bytes));
    Work w;
    w.kind = WorkKind::kCopy;
    w.name = dst_device ? (src_device ? "memcpy_d2d" : "memcpy_h2d") : (src_device ? "memcpy_d2h" : "memcpy_h2h");
    w.fixed_us = spec().kernel_gap_us;
    w.work_us = dst_device && src_device ? device_copy_us(static_cast<double>(bytes), spec())
                                         : host_copy_us(static_cast<double>(bytes), spec());
    // Over the host link (timeline.h: one direction's copies share it); host-to-host copies take none.
    w.link = dst_device == src_device ? 0 : (dst_device ? 1 : 2);
    if (!dst_device || bytes <= kRealCopyBytes) w.effect = [=] { std::memcpy(dst, src, bytes); };
    timeline().enqueue(id_, std::move(w), launch_host_us());
    if (pageable) synchronize();
}

void EmuStreamImpl::fill_zero(void* dst, std::size_t bytes) {
    if (bytes == 0) return;
    // Large fills of device or pinned memory are payload (timed, not performed); pageable memory is the
    // host's own.
    const bool payload = device_.is_device_memory(dst, bytes) || device_.is_pinned(dst, bytes);
    const bool real = !payload || bytes <= kRealCopyBytes;
    OpCost cost = elementwise_cost(0, static_cast<std::int64_t>(bytes), DType::kI32, 0.0);
    cost.bytes = static_cast<double>(bytes);
    launch("memset", cost, real ? std::function<void()>([=] { std::memset(dst, 0, bytes); }) : nullptr);
}

void EmuEventImpl::record(Stream& stream) {
    auto& s = dynamic_cast<EmuStreamImpl&>(stream);
    timeline_ = &s.timeline();
    s.record(state_);
}

}  // namespace

std::unique_ptr<Device> make_device(EmuOptions options) {
    SCMOE_CHECK(options.spec.sms > 0 && options.spec.bf16_tflops > 0 && options.spec.hbm_gbps > 0 &&
                    options.spec.memory_bytes > 0 && options.spec.gemm_efficiency > 0 &&
                    options.spec.bandwidth_efficiency > 0 && options.spec.host_link_gbps > 0,
                "emulated GPU '" << options.spec.name << "': its spec needs SMs, peaks, capacity and efficiencies > 0");
    check_stack(options.stack);
    return std::make_unique<EmuDeviceImpl>(std::move(options));
}

EmuDevice& as_emu(Device& device) {
    auto* d = dynamic_cast<EmuDevice*>(&device);
    SCMOE_CHECK(d, "expected an emulated device, got the " << backend_name(device.backend()) << " backend");
    return *d;
}

EmuStream& as_emu(Stream& stream) {
    auto* s = dynamic_cast<EmuStream*>(&stream);
    SCMOE_CHECK(s, "expected a stream of an emulated device, got the " << backend_name(stream.backend()) << " backend");
    return *s;
}

}  // namespace scmoe::emu
