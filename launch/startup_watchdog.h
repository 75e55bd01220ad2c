// StartupWatchdog: bounds a multi-process job's startup (the hello barrier, splitting MPI_COMM_WORLD,
// creating the communicators) by the comm timeout. Those calls block without a timeout of their
// own: a rank that never arrives (a host that hangs, a rank stopped) would hold its peers forever.
//
//   StartupWatchdog watchdog(comm_timeout_seconds(), [&](const std::string& why) { abort_job(why); });
//   watchdog.phase("the hello barrier");
//   ...
//   watchdog.disarm();  // startup done: training has timeouts of its own
//
// If not disarmed within `timeout_s`, calls `expire` once, on the watchdog's thread, with
// "startup did not finish within T s (in PHASE)"; `expire` is expected to end the process.
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace scmoe::launch {

class StartupWatchdog {
  public:
    StartupWatchdog(double timeout_s, std::function<void(const std::string&)> expire);
    ~StartupWatchdog();  // disarms
    StartupWatchdog(const StartupWatchdog&) = delete;
    StartupWatchdog& operator=(const StartupWatchdog&) = delete;

    // What startup is doing now, named in the message if it expires.
    void phase(std::string what);
    // Startup finished: the watchdog never fires. Idempotent.
    void disarm();

  private:
    double timeout_s_;
    std::function<void(const std::string&)> expire_;
    std::mutex mu_;
    std::condition_variable cv_;
    std::string phase_ = "startup";
    bool disarmed_ = false;
    std::thread thread_;
};

}  // namespace scmoe::launch
