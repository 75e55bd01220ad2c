#include "scmoe/kernels/emu/rendezvous.h"

#include <algorithm>
#include <mutex>
#include <utility>

#include "scmoe/kernels/emu/detail/world.h"
#include "scmoe/kernels/error.h"

namespace scmoe::emu {

Rendezvous::Rendezvous(std::vector<double> durations_us)
    : durations_(std::move(durations_us)),
      members_(static_cast<int>(durations_.size())),
      here_(durations_.size(), false) {
    SCMOE_CHECK(!durations_.empty(), "emu Rendezvous: no members");
}

std::shared_ptr<Rendezvous> Rendezvous::deferred(int members) {
    SCMOE_CHECK(members >= 1, "emu Rendezvous: " << members << " members");
    auto r = std::make_shared<Rendezvous>(std::vector<double>(static_cast<std::size_t>(members), 0.0));
    r->known_.store(false, std::memory_order_relaxed);
    return r;
}

void Rendezvous::set_durations(std::vector<double> durations_us) {
    SCMOE_CHECK(!known_.load(std::memory_order_acquire) && static_cast<int>(durations_us.size()) == members_,
                "emu Rendezvous: durations set twice, or " << durations_us.size() << " for " << members_ << " members");
    durations_ = std::move(durations_us);
    known_.store(true, std::memory_order_release);
}

void Rendezvous::arrive(int member, double time_us) {
    SCMOE_CHECK(member >= 0 && member < members() && !here_[static_cast<std::size_t>(member)],
                "emu Rendezvous: member " << member << " arrived twice or is out of range");
    here_[static_cast<std::size_t>(member)] = true;
    latest_ = arrived_ == 0 ? time_us : std::max(latest_, time_us);
    ++arrived_;
}

void Rendezvous::fail(const std::string& why) {
    World& w = World::get();
    std::scoped_lock lock(w.mu);
    if (!failure_.empty() || arrived_ == members()) return;
    failure_ = why.empty() ? "failed" : why;
    w.pump();
    ++w.progress;
    w.cv.notify_all();
}

HostMeeting::HostMeeting(int members, double latency_us) : members_(members), latency_us_(latency_us) {
    SCMOE_CHECK(members >= 1 && latency_us >= 0, "emu HostMeeting: members " << members << ", latency " << latency_us);
}

}  // namespace scmoe::emu
