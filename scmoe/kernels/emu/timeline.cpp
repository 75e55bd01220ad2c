#include "scmoe/kernels/emu/timeline.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <sstream>

#include "scmoe/kernels/emu/detail/world.h"
#include "scmoe/kernels/env.h"
#include "scmoe/kernels/error.h"

namespace scmoe::emu {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
// Model times are sums of microsecond durations; below this they are the same instant.
constexpr double kEps = 1e-7;
// Completion times kept per event: a wait enqueued before a re-record still finds its generation.
constexpr std::size_t kKeptGenerations = 256;

// Seconds a host may wait without the model moving before the run is declared stuck
// (SCMOE_EMU_STALL_S, default 300).
double stall_limit_s() {
    static const double limit = emu_stall_seconds_setting();
    return limit;
}

}  // namespace

Timeline::Timeline(GpuSpec spec) : spec_(std::move(spec)) {
    stall_limit_s();  // a malformed SCMOE_EMU_STALL_S fails here, not at the first stall (or never)
    World& w = World::get();
    std::scoped_lock lock(w.mu);
    w.timelines.push_back(this);
}

Timeline::~Timeline() {
    try {
        synchronize_all();
    } catch (...) {  // NOTES: a destructor cannot throw; the streams' errors were theirs to report
    }
    World& w = World::get();
    std::scoped_lock lock(w.mu);
    w.timelines.erase(std::find(w.timelines.begin(), w.timelines.end(), this));
    w.cv.notify_all();
}

int Timeline::add_stream(int priority) {
    std::scoped_lock lock(World::get().mu);
    StreamState s;
    s.priority = priority;
    s.free_at = host_;
    streams_.push_back(std::move(s));
    return static_cast<int>(streams_.size()) - 1;
}

void Timeline::remove_stream(int stream) {
    try {
        synchronize(stream);
    } catch (...) {  // NOTES: the stream's owner is gone; its error has no one to go to
    }
    std::scoped_lock lock(World::get().mu);
    streams_[static_cast<std::size_t>(stream)].live = false;
}

void Timeline::enqueue(int stream, Work work, double host_cost_us) {
    World& w = World::get();
    std::scoped_lock lock(w.mu);
    StreamState& s = streams_.at(static_cast<std::size_t>(stream));
    SCMOE_CHECK(s.live, "emu: enqueue on a destroyed stream");
    host_ += std::max(0.0, host_cost_us);
    work.enqueued_at = host_;
    work.demand = std::clamp(work.demand, 1e-3, 1.0);
    s.queue.push_back(std::move(work));
    ++s.enqueued;
}

double Timeline::host_time_us() const {
    std::scoped_lock lock(World::get().mu);
    return host_;
}

void Timeline::advance_host(double us) {
    std::scoped_lock lock(World::get().mu);
    host_ += std::max(0.0, us);
}

double Timeline::event_time_us(const EventState& event, std::uint64_t generation) const {
    std::scoped_lock lock(World::get().mu);
    SCMOE_CHECK(event.completed >= generation && generation > 0, "emu: event generation " << generation
                                                                   << " has not completed");
    auto it = event.times.find(generation);
    SCMOE_CHECK(it != event.times.end(), "emu: event generation " << generation << " is too old");
    return it->second;
}

TimelineStats Timeline::stats() const {
    std::scoped_lock lock(World::get().mu);
    return stats_;
}

void Timeline::synchronize(int stream) {
    World& w = World::get();
    std::unique_lock lock(w.mu);
    StreamState& s = streams_.at(static_cast<std::size_t>(stream));
    const std::uint64_t target = s.enqueued;
    wait_until(lock, [this, stream, target] { return streams_[static_cast<std::size_t>(stream)].finished >= target; },
               "cudaStreamSynchronize");
    StreamState& done = streams_[static_cast<std::size_t>(stream)];
    if (done.error) {
        std::exception_ptr e = done.error;
        done.error = nullptr;
        std::rethrow_exception(e);
    }
}

void Timeline::synchronize(const std::shared_ptr<EventState>& event, std::uint64_t generation) {
    if (generation == 0) return;
    World& w = World::get();
    std::unique_lock lock(w.mu);
    wait_until(lock, [&event, generation] { return event->completed >= generation; }, "cudaEventSynchronize");
}

void Timeline::synchronize_all() {
    World& w = World::get();
    std::unique_lock lock(w.mu);
    std::vector<std::uint64_t> targets;
    for (const StreamState& s : streams_) targets.push_back(s.enqueued);
    wait_until(
        lock,
        [this, targets] {
            for (std::size_t i = 0; i < targets.size(); ++i)
                if (streams_[i].finished < targets[i]) return false;
            return true;
        },
        "cudaDeviceSynchronize");
}

void Timeline::meet(HostMeeting& m) {
    World& w = World::get();
    std::unique_lock lock(w.mu);
    m.latest_ = m.arrived_ == 0 ? host_ : std::max(m.latest_, host_);
    ++m.arrived_;
    host_state_ = HostState::kWaitingPeers;
    relaxed_ = false;
    w.pump();
    const auto started = std::chrono::steady_clock::now();
    std::uint64_t seen = w.progress;
    while (m.arrived_ < m.members_) {
        w.cv.wait_for(lock, std::chrono::milliseconds(200));
        if (w.progress != seen || m.arrived_ >= m.members_) {
            seen = w.progress;
            continue;
        }
        const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
        SCMOE_CHECK(waited < stall_limit_s(), "emu: a host waited " << waited << " s for " << m.members_ - m.arrived_
                                                                     << " peer(s) of a meeting; the model is stuck:"
                                                                     << w.describe());
    }
    host_ = std::max(host_, m.latest_ + m.latency_us_);
    host_state_ = HostState::kRunning;
    relaxed_ = false;
    w.cv.notify_all();
}

// NOTES: the waiting host lets its GPU run without bound until the awaited Work completes; from
// then on the horizon is that completion time, so nothing later runs before the host could have
// enqueued more. Meanwhile other hosts' waits may need this GPU: pump() advances all of them.
void Timeline::wait_until(std::unique_lock<std::mutex>& lock, const std::function<bool()>& done, const char* what) {
    World& w = World::get();
    if (done()) {
        // Already complete: the call returns after its own latency.
        host_ += spec_.sync_us;
        return;
    }
    host_state_ = HostState::kWaitingGpu;
    waited_ = done;
    waited_done_at_.reset();
    w.pump();
    const auto started = std::chrono::steady_clock::now();
    std::uint64_t seen = w.progress;
    while (!waited_done_at_) {
        w.cv.wait_for(lock, std::chrono::milliseconds(200));
        if (waited_done_at_) break;
        w.pump();
        if (w.progress != seen) {
            seen = w.progress;
            continue;
        }
        const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
        if (waited >= stall_limit_s()) {
            host_state_ = HostState::kRunning;
            waited_ = nullptr;
            SCMOE_FAIL("emu: " << what << " waited " << waited << " s and the model did not move; it is stuck:"
                               << w.describe());
        }
    }
    host_ = std::max(host_, *waited_done_at_) + spec_.sync_us;
    host_state_ = HostState::kRunning;
    waited_ = nullptr;
    waited_done_at_.reset();
    w.cv.notify_all();
}

double Timeline::horizon() const {
    switch (host_state_) {
        case HostState::kRunning: return host_;
        case HostState::kWaitingGpu: return waited_done_at_ ? *waited_done_at_ : kInf;
        case HostState::kWaitingPeers: return relaxed_ ? kInf : host_;
    }
    return host_;
}

// The earliest time the stream's next Work can start, or +inf while it waits on an event.
double Timeline::ready_time(const StreamState& s) const {
    if (s.active || s.queue.empty()) return kInf;
    const Work& w = s.queue.front();
    double t = std::max(w.enqueued_at, s.free_at);
    if (w.kind == WorkKind::kWait) {
        if (w.event->completed < w.generation) return kInf;
        auto it = w.event->times.find(w.generation);
        if (it != w.event->times.end()) t = std::max(t, it->second);
    } else if (w.kind == WorkKind::kHostTask) {
        t = std::max(t, lane_free_);
    }
    return t;
}

void Timeline::start(StreamState& s, double at) {
    Work w = std::move(s.queue.front());
    s.queue.pop_front();
    if (w.at_start) {
        w.at_start(w);
        w.demand = std::clamp(w.demand, 1e-3, 1.0);
    }
    const double ready = std::max(w.enqueued_at, s.free_at);
    // A comm Work that waited for SMs (admit) was considered at blocked_since: the wait from then is
    // residency, not lateness.
    const double considered = s.blocked_since >= 0 ? s.blocked_since : at;
    if (s.blocked_since >= 0) {
        if (at > s.blocked_since + kEps) {
            ++stats_.residency_waits;
            stats_.residency_wait_us += at - s.blocked_since;
        }
        s.blocked_since = -1;
    }
    if (ready + kEps < considered && w.kind != WorkKind::kWait && w.kind != WorkKind::kHostTask) {
        // Ready in the model's past: the GPU side ran ahead of this host (a relaxed meeting).
        ++stats_.late_starts;
        stats_.late_us += considered - ready;
    }
    Active a;
    a.start = at;
    a.priority = s.priority;
    switch (w.kind) {
        case WorkKind::kRecord: {
            EventState& e = *w.event;
            e.completed = std::max(e.completed, w.generation);
            e.times[w.generation] = at;
            while (e.times.size() > kKeptGenerations) e.times.erase(e.times.begin());
            break;
        }
        case WorkKind::kWait: break;
        case WorkKind::kKernel:
            a.fixed_left = w.fixed_us;
            a.work_left = w.work_us;
            break;
        case WorkKind::kCopy:
            if (w.link != 0) {  // the setup, then its bytes at its share of the link
                a.fixed_left = w.fixed_us;
                a.work_left = w.work_us;
            } else {
                a.fixed_left = w.fixed_us + w.work_us;
            }
            break;
        case WorkKind::kHostTask:
            a.fixed_left = w.fixed_us + w.work_us;
            lane_free_ = at + a.fixed_left;
            break;
        case WorkKind::kComm: w.rendezvous->arrive(w.member, at); break;
    }
    a.work = std::move(w);
    s.active = std::move(a);
    if (finished(*s.active)) complete(s);
}

// Whether active Work has nothing left at now_: records and waits at once, a collective at its
// (resolved) end, a kernel after its gap and work, anything else after its fixed time.
bool Timeline::finished(const Active& a) const {
    switch (a.work.kind) {
        case WorkKind::kRecord:
        case WorkKind::kWait: return true;
        case WorkKind::kComm:
            return a.work.rendezvous->resolved() && a.work.rendezvous->end_us(a.work.member) <= now_ + kEps;
        case WorkKind::kKernel: return a.fixed_left <= kEps && a.work_left <= kEps;
        case WorkKind::kCopy: return a.fixed_left <= kEps && (a.work.link == 0 || a.work_left <= kEps);
        default: return a.fixed_left <= kEps;
    }
}

void Timeline::complete(StreamState& s) {
    Active a = std::move(*s.active);
    s.active.reset();
    s.free_at = now_;
    if (a.work.kind == WorkKind::kComm && !a.work.rendezvous->failure().empty()) {
        if (!s.error) {
            try {
                SCMOE_COMM_FAIL(a.work.name << " failed: " << a.work.rendezvous->failure());
            } catch (...) {
                s.error = std::current_exception();
            }
        }
    } else if (a.work.effect && !s.error) {
        try {
            a.work.effect();
        } catch (...) {
            s.error = std::current_exception();
        }
    }
    ++s.finished;
    ++stats_.works;
    if (a.work.kind == WorkKind::kHostTask) ++stats_.host_tasks;
    if (waited_ && !waited_done_at_ && waited_()) waited_done_at_ = now_;
}

// The SMs held by resident holders whose blocks leave no room for one of w's (residency.h); w fits
// when there are none, or when its own SMs fit beside theirs.
bool Timeline::fits_now(const Work& w) const {
    if (w.resident_sms <= 0) return true;
    long long conflicting = 0;
    for (const StreamState& s : streams_) {
        if (!s.active) continue;
        const Active& a = *s.active;
        const bool holds = a.work.resident_sms > 0 &&
                           (a.work.kind == WorkKind::kComm || (a.work.kind == WorkKind::kKernel && a.holding));
        if (holds && !fits_beside(spec_, a.work.block, w.block)) conflicting += a.work.resident_sms;
    }
    return conflicting == 0 || conflicting + w.resident_sms <= spec_.sms;
}

bool Timeline::admit(StreamState& s) {
    if (s.active) {
        Active& a = *s.active;
        const bool waiting = a.work.kind == WorkKind::kKernel && a.work.resident_sms > 0 && !a.holding &&
                             a.fixed_left <= kEps && a.work_left > kEps;
        if (!waiting) return false;
        if (a.waiting_since < 0) a.waiting_since = now_;
        if (!fits_now(a.work)) return false;
        a.holding = true;
        if (now_ > a.waiting_since + kEps) {
            ++stats_.residency_waits;
            stats_.residency_wait_us += now_ - a.waiting_since;
        }
        return true;
    }
    if (s.queue.empty() || ready_time(s) > now_ + kEps) return false;
    const Work& w = s.queue.front();
    if (w.kind != WorkKind::kComm || w.resident_sms <= 0) return false;
    if (!fits_now(w)) {
        if (s.blocked_since < 0) s.blocked_since = now_;
        return false;
    }
    start(s, now_);
    return true;
}

// Work that holds SMs is admitted first, high stream priority first (see the header); then the rest
// starts in stream order. A comm Work whose blocks do not fit stays queued (blocked_since).
void Timeline::start_ready() {
    bool started = true;
    while (started) {
        started = false;
        for (int priority : {1, 0})
            for (StreamState& s : streams_)
                if (s.priority == priority && admit(s)) started = true;
        for (StreamState& s : streams_) {
            if (s.active || s.queue.empty() || ready_time(s) > now_ + kEps) continue;
            const Work& w = s.queue.front();
            if (w.kind == WorkKind::kComm && w.resident_sms > 0) continue;  // admit() decides
            start(s, now_);
            started = true;
        }
    }
}

// The next time something happens, or +inf. `blocked`: the next thing could be the end of a
// collective whose peers have not all arrived (nothing at or after its earliest end may run yet).
double Timeline::next_event(bool& blocked) const {
    double next = kInf, bound = kInf;
    for (const StreamState& s : streams_) {
        if (!s.active) {
            // A Work waiting for SMs can only start when a holder ends, itself an event.
            if (s.blocked_since < 0) next = std::min(next, ready_time(s));
            continue;
        }
        const Active& a = *s.active;
        switch (a.work.kind) {
            case WorkKind::kComm:
                if (a.work.rendezvous->resolved())
                    next = std::min(next, std::max(now_, a.work.rendezvous->end_us(a.work.member)));
                else
                    bound = std::min(bound, std::max(now_, a.work.rendezvous->end_us(a.work.member)));
                break;
            case WorkKind::kKernel:
            case WorkKind::kCopy:
                if (a.fixed_left > kEps)
                    next = std::min(next, now_ + a.fixed_left);
                else if (a.rate > 0)
                    next = std::min(next, now_ + a.work_left / a.rate);
                break;
            default: next = std::min(next, now_ + a.fixed_left); break;
        }
    }
    blocked = bound <= next;
    return blocked ? kInf : next;
}

// Processor sharing of the SMs (see the header).
void Timeline::set_rates() {
    double capacity = 1.0;
    std::vector<Active*> kernels;
    for (StreamState& s : streams_) {
        if (!s.active) continue;
        Active& a = *s.active;
        if (a.work.kind == WorkKind::kComm) capacity -= a.work.demand;
        if (a.work.kind == WorkKind::kKernel) {
            a.rate = 0;
            if (a.work.resident_sms > 0) {
                // Persistent: resident on its own SMs at full speed, or waiting for them.
                if (a.holding) {
                    a.rate = 1;
                    capacity -= static_cast<double>(a.work.resident_sms) / spec_.sms;
                }
                continue;
            }
            if (a.fixed_left <= kEps) kernels.push_back(&a);
        }
    }
    // The host link: the copies of one direction past their setup share it equally.
    for (int link : {1, 2}) {
        std::vector<Active*> copies;
        for (StreamState& s : streams_)
            if (s.active && s.active->work.kind == WorkKind::kCopy && s.active->work.link == link &&
                s.active->fixed_left <= kEps)
                copies.push_back(&*s.active);
        for (Active* c : copies) c->rate = 1.0 / static_cast<double>(copies.size());
    }
    capacity = std::max(0.0, capacity);
    for (int priority : {1, 0}) {
        std::vector<Active*> group;
        for (Active* k : kernels)
            if (k->priority == priority) group.push_back(k);
        std::sort(group.begin(), group.end(), [](const Active* x, const Active* y) { return x->work.demand < y->work.demand; });
        for (std::size_t i = 0; i < group.size(); ++i) {
            const double fair = capacity / static_cast<double>(group.size() - i);
            const double share = std::min(group[i]->work.demand, fair);
            group[i]->rate = share / group[i]->work.demand;
            capacity -= share;
        }
    }
}

void Timeline::progress_to(double t) {
    const double dt = t - now_;
    if (dt <= 0) return;
    for (StreamState& s : streams_) {
        if (!s.active) continue;
        Active& a = *s.active;
        if (a.work.kind == WorkKind::kComm) continue;
        if (a.fixed_left > kEps)
            a.fixed_left -= dt;
        else if (a.work.kind == WorkKind::kKernel || (a.work.kind == WorkKind::kCopy && a.work.link != 0))
            a.work_left -= a.rate * dt;
    }
    now_ = t;
}

bool Timeline::advance() {
    bool moved = false;
    for (;;) {
        start_ready();
        set_rates();
        bool blocked = false;
        const double next = next_event(blocked);
        if (blocked || next == kInf || next > horizon() + kEps) break;
        progress_to(next);
        moved = true;
        for (StreamState& s : streams_)
            if (s.active && finished(*s.active)) complete(s);
    }
    return moved;
}

std::string Timeline::describe_state() const {
    std::ostringstream os;
    os << spec_.name << ", GPU time " << now_ << " us, host time " << host_ << " us, host "
       << (host_state_ == HostState::kRunning      ? "running"
           : host_state_ == HostState::kWaitingGpu ? "waiting for its GPU"
                                                   : "waiting for peers");
    for (std::size_t i = 0; i < streams_.size(); ++i) {
        const StreamState& s = streams_[i];
        if (!s.live || (!s.active && s.queue.empty())) continue;
        os << "; stream " << i << ": ";
        if (s.active) os << "running " << s.active->work.name;
        if (s.active && s.active->work.resident_sms > 0 && s.active->work.kind == WorkKind::kKernel &&
            !s.active->holding && s.active->fixed_left <= kEps)
            os << " (waiting for SMs)";
        if (!s.active && s.blocked_since >= 0) os << "waiting for SMs since " << s.blocked_since << " us: ";
        if (s.active && s.active->work.kind == WorkKind::kComm && !s.active->work.rendezvous->resolved())
            os << " (waiting for peers)";
        if (!s.queue.empty()) os << (s.active ? ", " : "") << s.queue.size() << " queued, next " << s.queue.front().name;
    }
    return os.str();
}

}  // namespace scmoe::emu
