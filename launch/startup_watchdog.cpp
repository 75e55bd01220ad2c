#include "launch/startup_watchdog.h"

#include <algorithm>
#include <chrono>
#include <sstream>

namespace scmoe::launch {

StartupWatchdog::StartupWatchdog(double timeout_s, std::function<void(const std::string&)> expire)
    : timeout_s_(timeout_s), expire_(std::move(expire)) {
    thread_ = std::thread([this] {
        std::unique_lock lock(mu_);
        // Clamped so that now() + timeout cannot overflow for absurdly large settings.
        const auto timeout = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
            std::chrono::duration<double>(std::min(timeout_s_, 1e9)));
        if (cv_.wait_for(lock, timeout, [this] { return disarmed_; })) return;
        std::ostringstream why;
        why << "startup did not finish within " << timeout_s_ << " s (in " << phase_
            << "; SCMOE_COMM_TIMEOUT_S sets the limit)";
        lock.unlock();
        expire_(why.str());
    });
}

StartupWatchdog::~StartupWatchdog() {
    disarm();
    thread_.join();
}

void StartupWatchdog::phase(std::string what) {
    std::scoped_lock lock(mu_);
    phase_ = std::move(what);
}

void StartupWatchdog::disarm() {
    {
        std::scoped_lock lock(mu_);
        disarmed_ = true;
    }
    cv_.notify_all();
}

}  // namespace scmoe::launch
