// Where emulated GPUs meet (timeline.h): a collective's Work on each GPU of its group meets at a
// Rendezvous, the host threads of several GPUs at a HostMeeting.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

namespace scmoe::emu {

class Timeline;

// Where a collective's Work meets across GPUs. Member m completes at
// max(arrival of every member) + durations[m].
class Rendezvous {
  public:
    explicit Rendezvous(std::vector<double> durations_us);
    // A rendezvous whose durations are known only once every member has issued its call (an
    // all-to-all with known counts: each member knows only its own row). Until set_durations,
    // end_us() is the latest arrival: a lower bound, which holds the timelines back, never forward.
    static std::shared_ptr<Rendezvous> deferred(int members);
    // Once, by the host thread of the last member to issue, before its Work is enqueued (so before
    // the rendezvous can resolve).
    void set_durations(std::vector<double> durations_us);
    int members() const { return members_; }
    // Every member arrived, or the rendezvous failed (a member will never arrive).
    bool resolved() const { return arrived_ == members() || !failure_.empty(); }
    // Why it failed ("" while it has not): its Work then completes at once with a CommError on
    // each stream that reaches it, and moves no data.
    const std::string& failure() const { return failure_; }
    // Member's end once resolved; before that, its earliest possible end (the latest arrival so far
    // plus its duration, if known).
    double end_us(int member) const {
        return latest_ + (known_.load(std::memory_order_acquire) ? durations_[static_cast<std::size_t>(member)] : 0.0);
    }
    // Under the world lock.
    void arrive(int member, double time_us);
    // Fails the rendezvous with `why` (the first failure wins) and lets every timeline move on.
    // Takes the world lock: call it without holding a lock a Work's effect may take.
    void fail(const std::string& why);

  private:
    std::string failure_;
    std::vector<double> durations_;
    int members_ = 0;
    std::atomic<bool> known_{true};
    std::vector<bool> here_;
    int arrived_ = 0;
    double latest_ = 0;
};

// Where the host threads of several GPUs meet (a blocking count exchange): each leaves at the
// latest arrival's host time plus latency_us.
class HostMeeting {
  public:
    HostMeeting(int members, double latency_us);
    int members() const { return members_; }

  private:
    friend class Timeline;
    int members_;
    double latency_us_;
    int arrived_ = 0;
    double latest_ = 0;
};

}  // namespace scmoe::emu
