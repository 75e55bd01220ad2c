#include "scmoe/kernels/cpu/cpu_device.h"

#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <new>
#include <thread>
#include <vector>

#include "scmoe/kernels/env.h"
#include "scmoe/kernels/error.h"
#include "scmoe/kernels/host_syncs.h"

namespace scmoe::cpu {
namespace {

using Clock = std::chrono::steady_clock;

// NOTES: an Event is a generation counter. record() bumps `recorded` on the host and enqueues a
// task that raises `completed` to that generation; a wait captures the generation at enqueue time,
// so re-recording an event never releases an earlier waiter early or late. The record task runs
// even on a stream that has failed (a skipped record would hang every waiter) and carries the
// failure along: a stream that waits on it fails with the same error instead of computing on
// inputs that were never written. The state is shared by the Event and the record and wait tasks
// enqueued on it: as cudaEventDestroy, destroying an Event whose record or wait is still queued is
// safe (an exception unwinding a scope that owns events, e.g. a Tracer, while streams still work).
struct EventState {
    mutable std::mutex mu;
    mutable std::condition_variable cv;
    std::uint64_t recorded = 0;
    std::uint64_t completed = 0;
    Clock::time_point time{};
    std::exception_ptr error;

    void synchronize() const {
        detail::count_host_sync();
        std::unique_lock lock(mu);
        std::uint64_t target = recorded;
        cv.wait(lock, [&] { return completed >= target; });
    }
    // Blocks until `generation` is reached; rethrows the recording stream's failure, if any.
    void wait_for(std::uint64_t generation) const {
        std::unique_lock lock(mu);
        cv.wait(lock, [&] { return completed >= generation; });
        if (error) std::rethrow_exception(error);
    }
    // Notifies under the lock: a waiter can see the new generation without being woken, return,
    // and release the state, so the condition variable must not be touched after the unlock.
    void complete(std::uint64_t generation, std::exception_ptr stream_error) {
        std::scoped_lock lock(mu);
        time = Clock::now();
        if (completed < generation) {
            completed = generation;
            error = stream_error;
        }
        cv.notify_all();
    }
    std::uint64_t recorded_generation() const {
        std::scoped_lock lock(mu);
        return recorded;
    }
    std::uint64_t next_generation() {
        std::scoped_lock lock(mu);
        return ++recorded;
    }
};

class CpuEvent final : public Event {
public:
    void record(Stream& stream) override;
    void synchronize() const override { state_->synchronize(); }
    float elapsed_ms_since(const Event& start) const override {
        const auto& s = dynamic_cast<const CpuEvent&>(start);
        synchronize();
        s.synchronize();
        std::scoped_lock lock(state_->mu, s.state_->mu);
        return std::chrono::duration<float, std::milli>(state_->time - s.state_->time).count();
    }
    const std::shared_ptr<EventState>& state() const { return state_; }

private:
    std::shared_ptr<EventState> state_ = std::make_shared<EventState>();
};

// NOTES: OpenBLAS's own thread pool is built for one caller at a time: GEMMs issued concurrently
// from several stream threads (two streams of a rank, several in-process ranks) oversubscribe the
// cores and spin against each other, several times slower than single-threaded BLAS. So while more
// than one CPU stream exists in the process each GEMM runs on its stream's thread alone (the
// streams are the parallelism); with one stream BLAS uses every core. SCMOE_CPU_BLAS_THREADS=N
// (default: unset = that policy) pins N threads instead.
class BlasThreads {
public:
    static void stream_created() { update(+1); }
    static void stream_destroyed() { update(-1); }

private:
    static void update(int delta) {
        static std::mutex mu;
        static int live = 0;
        static const int pinned = cpu_blas_threads_setting();
        static const int all = openblas_get_num_threads();
        std::scoped_lock lock(mu);
        const int before = live;
        live += delta;
        if (pinned) {
            if (before == 0 && live > 0) openblas_set_num_threads(pinned);
            return;
        }
        if (before <= 1 && live > 1) openblas_set_num_threads(1);
        if (before > 1 && live <= 1) openblas_set_num_threads(all);
    }
};

class CpuStream;

// The streams of one CpuDevice, so that freeing memory can wait in stream order for the work
// already enqueued (CpuDevice::deallocate). Shared by the device and its streams: either may go
// first.
struct StreamRegistry {
    std::mutex mu;
    std::vector<CpuStream*> streams;
};

// NOTES: tasks run in enqueue order on one worker thread. The first exception a task throws is
// kept; later tasks are skipped (their inputs may be garbage) until synchronize() rethrows it.
// Release tasks (run_always) run even then: they free memory, whatever the stream computed.
class CpuStream final : public Stream {
public:
    explicit CpuStream(std::shared_ptr<StreamRegistry> registry)
        : registry_(std::move(registry)), worker_((BlasThreads::stream_created(), [this] { run(); })) {
        std::scoped_lock lock(registry_->mu);
        registry_->streams.push_back(this);
    }
    // True while work enqueued so far has not finished.
    bool busy() {
        std::scoped_lock lock(mu_);
        return finished_ < enqueued_;
    }
    // Enqueues fn to run after the work enqueued so far, even on a failed stream.
    void run_always(std::function<void()> fn) { enqueue({std::move(fn), {}, true}); }
    ~CpuStream() override {
        {
            std::scoped_lock lock(registry_->mu);
            std::erase(registry_->streams, this);
        }
        BlasThreads::stream_destroyed();
        {
            std::scoped_lock lock(mu_);
            stopping_ = true;
        }
        cv_.notify_all();
        worker_.join();
    }
    Backend backend() const override { return Backend::kCpu; }
    void* native_handle() const override { return nullptr; }

    void host_task(std::function<void()> fn) override { enqueue({std::move(fn), nullptr}); }
    // Completes the event in stream order, also after a failure (which it passes on).
    void record_event(std::shared_ptr<EventState> event, std::uint64_t generation) {
        enqueue({nullptr, {std::move(event), generation}});
    }
    void synchronize() override {
        detail::count_host_sync();
        auto checks = take_sync_checks();
        {
            std::unique_lock lock(mu_);
            std::uint64_t target = enqueued_;
            done_cv_.wait(lock, [&] { return finished_ >= target; });
            if (error_) {
                std::exception_ptr e = error_;
                error_ = nullptr;
                std::rethrow_exception(e);
            }
        }
        run_sync_checks(checks);
    }
    void wait(const Event& event) override {
        std::shared_ptr<EventState> e = dynamic_cast<const CpuEvent&>(event).state();
        const std::uint64_t generation = e->recorded_generation();
        host_task([e = std::move(e), generation] { e->wait_for(generation); });
    }
    // Zero bytes is a no-op (memcpy/memset with a null pointer would be undefined even then).
    void copy(void* dst, const void* src, std::size_t bytes) override {
        if (bytes) host_task([=] { std::memcpy(dst, src, bytes); });
    }
    void fill_zero(void* dst, std::size_t bytes) override {
        if (bytes) host_task([=] { std::memset(dst, 0, bytes); });
    }

private:
    struct EventRecord {
        std::shared_ptr<EventState> event;
        std::uint64_t generation = 0;
    };
    struct Task {
        std::function<void()> fn;
        EventRecord record;
        bool always = false;  // runs on a failed stream too (memory releases)
    };
    void enqueue(Task task) {
        {
            std::scoped_lock lock(mu_);
            queue_.push_back(std::move(task));
            ++enqueued_;
        }
        cv_.notify_all();
    }
    // Runs one task (or skips it after a failure). The worker's copy of the stream's error dies on
    // return, before run() marks the task finished: the thread that synchronize() hands the error
    // to is then its last owner and frees it. (A copy kept past the notification made the worker
    // free it too, at any time after that thread read the message: ThreadSanitizer, which does not
    // see libstdc++'s atomic exception_ptr count, reported that free as a race.)
    void execute(Task& task) {
        std::exception_ptr failed;
        {
            std::scoped_lock lock(mu_);
            failed = error_;
        }
        if (task.record.event) {
            task.record.event->complete(task.record.generation, failed);
        } else if (!failed || task.always) {
            try {
                task.fn();
            } catch (...) {
                std::scoped_lock lock(mu_);
                error_ = std::current_exception();
            }
        }
    }
    void run() {
        for (;;) {
            Task task;
            {
                std::unique_lock lock(mu_);
                cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
                if (queue_.empty()) return;
                task = std::move(queue_.front());
                queue_.pop_front();
            }
            execute(task);
            {
                std::scoped_lock lock(mu_);
                ++finished_;
            }
            done_cv_.notify_all();
        }
    }

    std::mutex mu_;
    std::condition_variable cv_, done_cv_;
    std::deque<Task> queue_;
    std::uint64_t enqueued_ = 0, finished_ = 0;
    std::exception_ptr error_;
    bool stopping_ = false;
    std::shared_ptr<StreamRegistry> registry_;
    std::thread worker_;
};

void CpuEvent::record(Stream& stream) {
    const std::uint64_t generation = state_->next_generation();
    dynamic_cast<CpuStream&>(stream).record_event(state_, generation);
}

class CpuDevice final : public Device {
public:
    Backend backend() const override { return Backend::kCpu; }
    std::string description() const override {
        std::string config = openblas_get_config();
        return "cpu: " + std::to_string(std::thread::hardware_concurrency()) + " hardware threads, " + config;
    }
    DType compute_dtype() const override { return DType::kF32; }
    void* allocate(std::size_t bytes) override {
        if (bytes == 0) return nullptr;
        void* p = bytes <= SIZE_MAX - 255 ? std::aligned_alloc(256, (bytes + 255) / 256 * 256) : nullptr;
        SCMOE_CHECK(p != nullptr, "cpu: allocating " << bytes << " bytes (" << static_cast<double>(bytes) / (1ull << 30)
                                                     << " GiB) of host memory failed: out of memory");
        return p;
    }
    // NOTES: as cudaFree, which waits for the device, memory is freed only once the work already
    // enqueued on this device's streams has run (it may still read or write it: an object destroyed
    // while its stream works, e.g. by an exception unwinding the scope). Without waiting: the last
    // busy stream to reach a release task frees it; with every stream idle it is freed at once.
    void deallocate(void* ptr) override {
        if (!ptr) return;
        std::scoped_lock lock(registry_->mu);
        std::vector<CpuStream*> busy;
        for (CpuStream* s : registry_->streams)
            if (s->busy()) busy.push_back(s);
        if (busy.empty()) {
            std::free(ptr);
            return;
        }
        auto pending = std::make_shared<std::atomic<std::size_t>>(busy.size());
        for (CpuStream* s : busy)
            s->run_always([ptr, pending] {
                if (pending->fetch_sub(1) == 1) std::free(ptr);
            });
    }
    void* allocate_host(std::size_t bytes) override { return allocate(bytes); }
    void deallocate_host(void* ptr) override { deallocate(ptr); }
    std::unique_ptr<Stream> make_stream(StreamPriority) override { return std::make_unique<CpuStream>(registry_); }
    std::unique_ptr<Event> create_event() override { return std::make_unique<CpuEvent>(); }

private:
    std::shared_ptr<StreamRegistry> registry_ = std::make_shared<StreamRegistry>();
};

}  // namespace

std::unique_ptr<Device> make_device() { return std::make_unique<CpuDevice>(); }

}  // namespace scmoe::cpu
