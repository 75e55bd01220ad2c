#include "moe/layer_scheduler.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>

#include "comm/communicator.h"
#include "kernels/error.h"
#include "moe/trace.h"

namespace scmoe {

void SchedulePlan::validate() const {
    const int n = static_cast<int>(segments.size());
    for (const BranchPlan& b : branches) {
        SCMOE_CHECK(0 <= b.ready && b.ready <= b.join && b.join <= n,
                    name << " plan: branch " << b.name << " has ready " << b.ready << ", join " << b.join << " for "
                         << n << " segments (need 0 <= ready <= join <= segments)");
    }
}

double Schedule::serial_ms() const {
    double t = 0;
    for (double s : segment_ms) t += s;
    for (const Branch& b : branches) t += b.pre_ms + b.send_ms + b.expert_ms + b.receive_ms + b.post_ms + b.consume_ms;
    return t;
}

double Schedule::comm_ms() const {
    double t = 0;
    for (const Branch& b : branches) t += b.send_ms + b.receive_ms;
    return t;
}

std::string Schedule::describe(const SchedulePlan& plan) const {
    std::string out;
    char line[320];
    for (std::size_t i = 0; i < branches.size() && i < plan.branches.size(); ++i) {
        const Branch& b = branches[i];
        const BranchPlan& p = plan.branches[i];
        std::snprintf(line, sizeof line,
                      "%s %s: ready %d join %d slot K=%d (backbone %.3f ms before vs pre+send %.3f ms; %.3f ms after "
                      "vs receive+post %.3f ms; expert %.3f ms)\n",
                      plan.name.c_str(), p.name.c_str(), p.ready, p.join, b.slot, b.before_ms,
                      b.pre_ms + b.send_ms, b.after_ms, b.receive_ms + b.post_ms, b.expert_ms);
        out += line;
    }
    return out;
}

void choose_slots(const SchedulePlan& plan, Schedule& s) {
    plan.validate();
    SCMOE_CHECK(s.branches.size() == plan.branches.size() && s.segment_ms.size() == plan.segments.size(),
                "choose_slots: the schedule does not match the " << plan.name << " plan");
    for (std::size_t i = 0; i < plan.branches.size(); ++i) {
        const BranchPlan& p = plan.branches[i];
        Schedule::Branch& b = s.branches[i];
        const double need_before = b.pre_ms + b.send_ms, need_after = b.receive_ms + b.post_ms;
        double best = std::numeric_limits<double>::infinity();
        for (int k = p.ready; k <= p.join; ++k) {
            double before = 0, after = 0;
            for (int j = p.ready; j < k; ++j) before += s.segment_ms[static_cast<std::size_t>(j)];
            for (int j = k; j < p.join; ++j) after += s.segment_ms[static_cast<std::size_t>(j)];
            const double cost = std::abs(before - need_before) + std::abs(after - need_after);
            if (cost < best) {
                best = cost;
                b.slot = k;
                b.before_ms = before;
                b.after_ms = after;
            }
        }
    }
}

LayerScheduler::LayerScheduler(Device& device, Stream& backbone, Stream& moe, Communicator* agree)
    : device_(device), backbone_(backbone), moe_(moe), agree_(agree) {
    SCMOE_CHECK(&backbone != &moe, "LayerScheduler: the backbone and MoE streams must be distinct");
}

LayerScheduler::~LayerScheduler() {
    if (agree_buffer_) device_.deallocate(agree_buffer_);
}

Event& LayerScheduler::event(std::size_t i) {
    while (events_.size() <= i) events_.push_back(device_.create_event());
    return *events_[i];
}

Schedule LayerScheduler::calibrate(const SchedulePlan& plan, int repeats) {
    plan.validate();
    SCMOE_CHECK(repeats >= 1, "LayerScheduler.calibrate: repeats = " << repeats);
    using Clock = std::chrono::steady_clock;
    auto timed = [&](const ScheduleOp& op) {
        if (!op.run) return 0.0;
        const auto t0 = Clock::now();
        op.run(backbone_);
        backbone_.synchronize();
        return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    };
    const std::size_t nb = plan.branches.size(), ns = plan.segments.size();
    std::vector<double> times(ns + 6 * nb, std::numeric_limits<double>::infinity());
    auto keep = [&](std::size_t slot, double ms) { times[slot] = std::min(times[slot], ms); };
    for (int r = 0; r < repeats; ++r) {
        // The serial order of run(overlap = false) with the ready branch at its first possible slot.
        for (std::size_t i = 0; i <= ns; ++i) {
            for (std::size_t b = 0; b < nb; ++b) {
                const BranchPlan& p = plan.branches[b];
                const std::size_t base = ns + 6 * b;
                if (static_cast<std::size_t>(p.ready) == i) {
                    keep(base + 0, timed(p.pre));
                    keep(base + 1, timed(p.send));
                    keep(base + 2, timed(p.expert));
                    keep(base + 3, timed(p.receive));
                    keep(base + 4, timed(p.post));
                }
                if (static_cast<std::size_t>(p.join) == i) keep(base + 5, timed(p.consume));
            }
            if (i < ns) keep(i, timed(plan.segments[i]));
        }
    }
    if (agree_ && agree_->size() > 1) {
        const std::size_t bytes = times.size() * sizeof(float);
        if (agree_capacity_ < bytes) {
            if (agree_buffer_) device_.deallocate(agree_buffer_);
            agree_buffer_ = device_.allocate(bytes);
            agree_capacity_ = bytes;
        }
        std::vector<float> f(times.begin(), times.end());
        backbone_.copy(agree_buffer_, f.data(), bytes);
        agree_->all_reduce_sum(agree_buffer_, static_cast<std::int64_t>(f.size()), DType::kF32, backbone_);
        backbone_.copy(f.data(), agree_buffer_, bytes);
        backbone_.synchronize();
        for (std::size_t i = 0; i < times.size(); ++i) times[i] = f[i] / static_cast<float>(agree_->size());
    }
    Schedule s;
    s.segment_ms.assign(times.begin(), times.begin() + static_cast<std::ptrdiff_t>(ns));
    for (std::size_t b = 0; b < nb; ++b) {
        const double* t = times.data() + ns + 6 * b;
        Schedule::Branch br;
        br.pre_ms = t[0];
        br.send_ms = t[1];
        br.expert_ms = t[2];
        br.receive_ms = t[3];
        br.post_ms = t[4];
        br.consume_ms = t[5];
        s.branches.push_back(br);
    }
    choose_slots(plan, s);
    return s;
}

void LayerScheduler::run(const SchedulePlan& plan, const Schedule& schedule, bool overlap, Tracer* trace) {
    SCMOE_CHECK(schedule.branches.size() == plan.branches.size(),
                "LayerScheduler.run: the schedule has " << schedule.branches.size() << " branches, the " << plan.name
                                                        << " plan " << plan.branches.size());
    const std::size_t ns = plan.segments.size(), nb = plan.branches.size();
    Stream& side = overlap ? moe_ : backbone_;
    auto issue = [&](const ScheduleOp& op, const std::string& owner, Stream& stream, const char* lane) {
        if (!op.run) return;
        if (trace)
            trace->op(owner.empty() ? op.name : op.name + "[" + owner + "]", lane, stream, op.run);
        else
            op.run(stream);
    };
    // Events per branch: 0 input ready (backbone), 1 sent (MoE), 2 expert done (backbone), 3 done (MoE).
    auto ev = [&](std::size_t b, std::size_t k) -> Event& { return event(4 * b + k); };
    const char* side_lane = overlap ? "moe" : "backbone";
    for (std::size_t i = 0; i <= ns; ++i) {
        for (std::size_t b = 0; b < nb; ++b) {
            const BranchPlan& p = plan.branches[b];
            if (static_cast<std::size_t>(p.ready) == i) {
                if (overlap) {
                    ev(b, 0).record(backbone_);
                    moe_.wait(ev(b, 0));
                }
                issue(p.pre, p.name, side, side_lane);
                issue(p.send, p.name, side, side_lane);
                if (overlap) ev(b, 1).record(moe_);
            }
            if (static_cast<std::size_t>(schedule.branches[b].slot) == i) {
                if (overlap) backbone_.wait(ev(b, 1));
                issue(p.expert, p.name, backbone_, "backbone");
                if (overlap) {
                    ev(b, 2).record(backbone_);
                    moe_.wait(ev(b, 2));
                }
                issue(p.receive, p.name, side, side_lane);
                issue(p.post, p.name, side, side_lane);
                if (overlap) ev(b, 3).record(moe_);
            }
            if (static_cast<std::size_t>(p.join) == i) {
                if (overlap) backbone_.wait(ev(b, 3));
                issue(p.consume, p.name, backbone_, "backbone");
            }
        }
        if (i < ns) issue(plan.segments[i], "", backbone_, "backbone");
    }
}

}  // namespace scmoe
