#include "kernels/cpu/cpu_device.h"

#include <cblas.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <new>
#include <thread>

#include "kernels/error.h"

namespace scmoe::cpu {
namespace {

using Clock = std::chrono::steady_clock;

// NOTES: an Event is a generation counter. record() bumps `recorded_` on the host and enqueues a
// task that raises `completed_` to that generation; a wait captures the generation at enqueue time,
// so re-recording an event never releases an earlier waiter early or late.
class CpuEvent final : public Event {
public:
    void record(Stream& stream) override;
    void synchronize() const override {
        std::unique_lock lock(mu_);
        std::uint64_t target = recorded_;
        cv_.wait(lock, [&] { return completed_ >= target; });
    }
    float elapsed_ms_since(const Event& start) const override {
        const auto& s = dynamic_cast<const CpuEvent&>(start);
        synchronize();
        s.synchronize();
        std::scoped_lock lock(mu_, s.mu_);
        return std::chrono::duration<float, std::milli>(time_ - s.time_).count();
    }
    void wait_for(std::uint64_t generation) const {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] { return completed_ >= generation; });
    }
    std::uint64_t recorded_generation() const {
        std::scoped_lock lock(mu_);
        return recorded_;
    }

private:
    mutable std::mutex mu_;
    mutable std::condition_variable cv_;
    std::uint64_t recorded_ = 0;
    std::uint64_t completed_ = 0;
    Clock::time_point time_{};
};

// NOTES: tasks run in enqueue order on one worker thread. The first exception a task throws is
// kept; later tasks are skipped (their inputs may be garbage) until synchronize() rethrows it.
class CpuStream final : public Stream {
public:
    CpuStream() : worker_([this] { run(); }) {}
    ~CpuStream() override {
        {
            std::scoped_lock lock(mu_);
            stopping_ = true;
        }
        cv_.notify_all();
        worker_.join();
    }
    Backend backend() const override { return Backend::kCpu; }
    void* native_handle() const override { return nullptr; }

    void host_task(std::function<void()> fn) override {
        {
            std::scoped_lock lock(mu_);
            queue_.push_back(std::move(fn));
            ++enqueued_;
        }
        cv_.notify_all();
    }
    void synchronize() override {
        std::unique_lock lock(mu_);
        std::uint64_t target = enqueued_;
        done_cv_.wait(lock, [&] { return finished_ >= target; });
        if (error_) {
            std::exception_ptr e = error_;
            error_ = nullptr;
            std::rethrow_exception(e);
        }
    }
    void wait(const Event& event) override {
        const auto& e = dynamic_cast<const CpuEvent&>(event);
        std::uint64_t generation = e.recorded_generation();
        host_task([&e, generation] { e.wait_for(generation); });
    }
    void copy(void* dst, const void* src, std::size_t bytes) override {
        host_task([=] { std::memcpy(dst, src, bytes); });
    }
    void fill_zero(void* dst, std::size_t bytes) override {
        host_task([=] { std::memset(dst, 0, bytes); });
    }

private:
    void run() {
        for (;;) {
            std::function<void()> task;
            {
                std::unique_lock lock(mu_);
                cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
                if (queue_.empty()) return;
                task = std::move(queue_.front());
                queue_.pop_front();
            }
            bool skip;
            {
                std::scoped_lock lock(mu_);
                skip = error_ != nullptr;
            }
            if (!skip) {
                try {
                    task();
                } catch (...) {
                    std::scoped_lock lock(mu_);
                    error_ = std::current_exception();
                }
            }
            {
                std::scoped_lock lock(mu_);
                ++finished_;
            }
            done_cv_.notify_all();
        }
    }

    std::mutex mu_;
    std::condition_variable cv_, done_cv_;
    std::deque<std::function<void()>> queue_;
    std::uint64_t enqueued_ = 0, finished_ = 0;
    std::exception_ptr error_;
    bool stopping_ = false;
    std::thread worker_;
};

void CpuEvent::record(Stream& stream) {
    std::uint64_t generation;
    {
        std::scoped_lock lock(mu_);
        generation = ++recorded_;
    }
    stream.host_task([this, generation] {
        {
            std::scoped_lock lock(mu_);
            time_ = Clock::now();
            if (completed_ < generation) completed_ = generation;
        }
        cv_.notify_all();
    });
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
        void* p = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
        if (!p) throw std::bad_alloc();
        return p;
    }
    void deallocate(void* ptr) override { std::free(ptr); }
    void* allocate_host(std::size_t bytes) override { return allocate(bytes); }
    void deallocate_host(void* ptr) override { deallocate(ptr); }
    std::unique_ptr<Stream> create_stream() override { return std::make_unique<CpuStream>(); }
    std::unique_ptr<Event> create_event() override { return std::make_unique<CpuEvent>(); }
};

}  // namespace

std::unique_ptr<Device> make_device() { return std::make_unique<CpuDevice>(); }

}  // namespace scmoe::cpu
