#include "scmoe/moe/layer_scheduler.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <functional>
#include <limits>

#include "scmoe/comm/comm_sms.h"
#include "scmoe/comm/communicator.h"
#include "scmoe/kernels/error.h"
#include "scmoe/moe/trace.h"

namespace scmoe {

void SchedulePlan::validate() const {
    const int n = static_cast<int>(segments.size());
    for (const BranchPlan& b : branches) {
        SCMOE_CHECK(0 <= b.ready && b.ready <= b.join && b.join <= n,
                    name << " plan: branch " << b.name << " has ready " << b.ready << ", join " << b.join << " for "
                         << n << " segments (need 0 <= ready <= join <= segments)");
        SCMOE_CHECK(b.max_chunks >= 1, name << " plan: branch " << b.name << " has max_chunks " << b.max_chunks);
        SCMOE_CHECK(b.max_chunks == 1 || (b.send_chunks.run && b.expert_chunks.run && b.receive_chunks.run),
                    name << " plan: branch " << b.name << " has max_chunks " << b.max_chunks
                         << " but not all of send_chunks, expert_chunks, receive_chunks");
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
    char line[400];
    for (std::size_t i = 0; i < branches.size() && i < plan.branches.size(); ++i) {
        const Branch& b = branches[i];
        const BranchPlan& p = plan.branches[i];
        std::snprintf(line, sizeof line,
                      "%s %s: ready %d join %d slot K=%d (backbone %.3f ms before vs pre+send %.3f ms; %.3f ms after "
                      "vs receive+post %.3f ms; expert %.3f ms)",
                      plan.name.c_str(), p.name.c_str(), p.ready, p.join, b.slot, b.before_ms,
                      b.pre_ms + b.send_ms, b.after_ms, b.receive_ms + b.post_ms, b.expert_ms);
        out += line;
        if (b.max_chunks > 1 || b.chunks > 1) {
            std::snprintf(line, sizeof line,
                          "; chunks %d of max %d (%s: modelled %.3f ms vs %.3f ms unchunked; in %d pieces send %.3f, "
                          "expert %.3f, receive %.3f ms)",
                          b.chunks, b.max_chunks, b.forced_chunks ? "forced" : "auto", b.modelled_ms,
                          b.modelled_unchunked_ms, b.max_chunks, b.chunked_send_ms, b.chunked_expert_ms,
                          b.chunked_receive_ms);
            out += line;
        } else {
            out += "; chunks 1";
        }
        out += "\n";
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

double model_branch_ms(const SchedulePlan& plan, const Schedule& s, std::size_t i, int slot, int chunks) {
    const BranchPlan& p = plan.branches[i];
    const Schedule::Branch& b = s.branches[i];
    SCMOE_CHECK(p.ready <= slot && slot <= p.join && chunks >= 1 && chunks <= std::max(1, b.max_chunks),
                "model_branch_ms: slot " << slot << ", chunks " << chunks << " for branch " << p.name);
    // Whole-stage times for `chunks` pieces: measured at 1 and max_chunks, linear in between. The
    // pieces do the same work plus their own costs, so a whole stage measured slower than its
    // pieces was slowed by something else (noise only ever adds time): take the pieces' time then.
    auto total = [&](double one, double at_max) {
        if (b.max_chunks <= 1) return one;
        one = std::min(one, at_max);
        return one + (at_max - one) * (chunks - 1) / (b.max_chunks - 1);
    };
    const double send = total(b.send_ms, b.chunked_send_ms) / chunks;
    const double expert = total(b.expert_ms, b.chunked_expert_ms) / chunks;
    const double receive = total(b.receive_ms, b.chunked_receive_ms) / chunks;
    double backbone = 0;  // backbone stream, from the ready point
    for (int j = p.ready; j < slot; ++j) backbone += s.segment_ms[static_cast<std::size_t>(j)];
    std::vector<double> expert_end(static_cast<std::size_t>(chunks));
    for (int c = 0; c < chunks; ++c) {
        const double sent = b.pre_ms + (c + 1) * send;  // the sends go back to back after pre
        backbone = std::max(backbone, sent) + expert;
        expert_end[static_cast<std::size_t>(c)] = backbone;
    }
    double side = b.pre_ms + chunks * send;  // MoE stream: the receives queue behind every send
    for (int c = 0; c < chunks; ++c) side = std::max(side, expert_end[static_cast<std::size_t>(c)]) + receive;
    side += b.post_ms;
    for (int j = slot; j < p.join; ++j) backbone += s.segment_ms[static_cast<std::size_t>(j)];
    return std::max(backbone, side);
}

void choose_chunks(const SchedulePlan& plan, Schedule& s, int forced) {
    SCMOE_CHECK(forced >= 0, "chunks = " << forced << ": must be >= 1, or 0 for auto");
    SCMOE_CHECK(s.branches.size() == plan.branches.size() && s.segment_ms.size() == plan.segments.size(),
                "choose_chunks: the schedule does not match the " << plan.name << " plan");
    for (std::size_t i = 0; i < plan.branches.size(); ++i) {
        const BranchPlan& p = plan.branches[i];
        Schedule::Branch& b = s.branches[i];
        b.max_chunks = p.max_chunks;
        b.forced_chunks = forced > 0;
        const int eq11_slot = b.slot;
        b.modelled_unchunked_ms = model_branch_ms(plan, s, i, eq11_slot, 1);
        int best_chunks = 1, best_slot = eq11_slot;
        double best = b.modelled_unchunked_ms;
        const int first = forced > 0 ? std::min(forced, p.max_chunks) : 2;
        const int last = forced > 0 ? first : p.max_chunks;
        for (int c = std::max(first, 2); c <= last; ++c) {
            for (int k = p.ready; k <= p.join; ++k) {
                const double t = model_branch_ms(plan, s, i, k, c);
                // Auto: pipelining must beat unchunked by kMinChunkGain; forced: take the best slot.
                const bool better = forced > 0 ? (best_chunks == 1 || t < best)
                                               : t < best && t < (1.0 - kMinChunkGain) * b.modelled_unchunked_ms;
                if (better) {
                    best = t;
                    best_chunks = c;
                    best_slot = k;
                }
            }
        }
        b.chunks = best_chunks;
        b.modelled_ms = best;
        if (best_slot != b.slot) {
            b.slot = best_slot;
            b.before_ms = b.after_ms = 0;
            for (int j = p.ready; j < p.join; ++j)
                (j < b.slot ? b.before_ms : b.after_ms) += s.segment_ms[static_cast<std::size_t>(j)];
        }
    }
}

LayerScheduler::LayerScheduler(Device& device, Stream& backbone, Stream& moe, Communicator* agree)
    : device_(device), backbone_(backbone), moe_(moe), agree_(agree), comm_sms_(default_comm_sms(agree).sms) {
    SCMOE_CHECK(&backbone != &moe, "LayerScheduler: the backbone and MoE streams must be distinct");
}

void LayerScheduler::set_comm_sms(int sms) {
    SCMOE_CHECK(sms >= 0, "LayerScheduler.set_comm_sms(" << sms << "): SMs kept free for an exchange, or 0 for none");
    comm_sms_ = sms;
}

int LayerScheduler::overlapped_sm_budget() const {
    const int sms = device_.sm_count();
    if (comm_sms_ <= 0 || sms <= 0) return 0;
    return std::max(1, sms - comm_sms_);
}

LayerScheduler::~LayerScheduler() {
    if (agree_buffer_) device_.deallocate(agree_buffer_);
}

Event& LayerScheduler::event(std::size_t i) {
    while (events_.size() <= i) events_.push_back(device_.create_event());
    return *events_[i];
}

Schedule LayerScheduler::calibrate(const SchedulePlan& plan, int repeats, int forced_chunks) {
    plan.validate();
    SCMOE_CHECK(repeats >= 1, "LayerScheduler.calibrate: repeats = " << repeats);
    SCMOE_CHECK(forced_chunks >= 0, "LayerScheduler.calibrate: chunks = " << forced_chunks
                                                                         << ": must be >= 1, or 0 for auto");
    // On the device's host clock: wall time on CPU and CUDA, the emulated host's on emu.
    auto timed = [&](const ScheduleOp& op) {
        if (!op.run) return 0.0;
        const double t0 = device_.host_time_us();
        op.run(backbone_);
        backbone_.synchronize();
        return (device_.host_time_us() - t0) / 1000.0;
    };
    // Every piece of a chunked stage, serially; the sum of their times.
    auto timed_pieces = [&](const ChunkedOp& op, int chunks) {
        double sum = 0;
        for (int c = 0; c < chunks; ++c)
            sum += timed({op.name, [&op, c, chunks](Stream& s) { op.run(c, chunks, s); }, op.comm});
        return sum;
    };
    constexpr std::size_t kPerBranch = 9;
    const std::size_t nb = plan.branches.size(), ns = plan.segments.size();
    std::vector<double> times(ns + kPerBranch * nb, std::numeric_limits<double>::infinity());
    auto keep = [&](std::size_t slot, double ms) { times[slot] = std::min(times[slot], ms); };
    for (int r = 0; r < repeats; ++r) {
        // The serial order of run(overlap = false) with the ready branch at its first possible slot.
        for (std::size_t i = 0; i <= ns; ++i) {
            for (std::size_t b = 0; b < nb; ++b) {
                const BranchPlan& p = plan.branches[b];
                const std::size_t base = ns + kPerBranch * b;
                if (static_cast<std::size_t>(p.ready) == i) {
                    keep(base + 0, timed(p.pre));
                    keep(base + 1, timed(p.send));
                    keep(base + 2, timed(p.expert));
                    keep(base + 3, timed(p.receive));
                    // The same stages again as max_chunks pieces (they recompute the same results).
                    if (p.max_chunks > 1) {
                        keep(base + 6, timed_pieces(p.send_chunks, p.max_chunks));
                        keep(base + 7, timed_pieces(p.expert_chunks, p.max_chunks));
                        keep(base + 8, timed_pieces(p.receive_chunks, p.max_chunks));
                    } else {
                        keep(base + 6, 0.0), keep(base + 7, 0.0), keep(base + 8, 0.0);
                    }
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
        all_reduce_sum_host(*agree_, f.data(), static_cast<std::int64_t>(f.size()), agree_buffer_, backbone_);
        for (std::size_t i = 0; i < times.size(); ++i) times[i] = f[i] / static_cast<float>(agree_->size());
    }
    Schedule s;
    s.segment_ms.assign(times.begin(), times.begin() + static_cast<std::ptrdiff_t>(ns));
    for (std::size_t b = 0; b < nb; ++b) {
        const double* t = times.data() + ns + kPerBranch * b;
        Schedule::Branch br;
        br.pre_ms = t[0];
        br.send_ms = t[1];
        br.expert_ms = t[2];
        br.receive_ms = t[3];
        br.post_ms = t[4];
        br.consume_ms = t[5];
        br.chunked_send_ms = t[6];
        br.chunked_expert_ms = t[7];
        br.chunked_receive_ms = t[8];
        s.branches.push_back(br);
    }
    choose_slots(plan, s);
    choose_chunks(plan, s, forced_chunks);
    return s;
}

namespace {

// One step of a stream's program: enqueue an op, record an event or wait for one. `needs` is the
// event whose record must have been issued first (a wait on an event recorded later would not wait:
// cudaStreamWaitEvent waits for the most recent record); -1 for none.
struct Step {
    std::function<void()> issue;
    std::ptrdiff_t needs = -1, records = -1;
    std::size_t seq = 0;    // position in the plan's program order (both streams together)
    bool blocking = false;  // an exchange: may block the host until its stream has run
    // A backbone op (or index hook): issued with the backbone's SM budget set to the overlapped
    // budget when an exchange may run beside it, else to 0.
    bool backbone_op = false, overlapped = false;
};

}  // namespace

const char* issue_order_name(IssueOrder order) {
    return order == IssueOrder::kProgram ? "program" : "ahead";
}

IssueOrder parse_issue_order(const std::string& name) {
    if (name == "ahead") return IssueOrder::kBackboneAhead;
    if (name == "program") return IssueOrder::kProgram;
    SCMOE_FAIL("issue order '" << name << "': expected ahead (the backbone issued ahead of blocking exchanges) or "
                                          "program (the plan's order, which drains the backbone at each exchange)");
}

void LayerScheduler::run(const SchedulePlan& plan, const Schedule& schedule, bool overlap, Tracer* trace,
                         const IndexHook& at_index) {
    SCMOE_CHECK(schedule.branches.size() == plan.branches.size(),
                "LayerScheduler.run: the schedule has " << schedule.branches.size() << " branches, the " << plan.name
                                                        << " plan " << plan.branches.size());
    const std::size_t ns = plan.segments.size(), nb = plan.branches.size();
    // The pass as two programs in stream order: the backbone stream's and the MoE stream's (with
    // overlap off, one program on the backbone stream).
    std::vector<Step> backbone_steps, moe_steps;
    std::size_t next_seq = 0;
    auto push = [&next_seq](std::vector<Step>& steps, Step step) {
        step.seq = next_seq++;
        steps.push_back(std::move(step));
    };
    std::vector<Step>& side_steps = overlap ? moe_steps : backbone_steps;
    Stream& side = overlap ? moe_ : backbone_;
    const char* side_lane = overlap ? "moe" : "backbone";
    auto add_op = [&](std::vector<Step>& steps, ScheduleOp op, const std::string& owner, Stream& stream,
                      const char* lane) {
        if (!op.run) return;
        const bool blocking = op.comm;
        push(steps, {[op = std::move(op), owner, &stream, lane, trace] {
                         run_op(trace, owner.empty() ? op.name : op.name + "[" + owner + "]", lane, stream, op.run,
                                op.comm);
                     },
                     -1, -1, 0, blocking});
    };
    auto add_piece = [&](std::vector<Step>& steps, const ChunkedOp& op, int c, int n, const std::string& owner,
                         Stream& stream, const char* lane) {
        add_op(steps, {op.name + "#" + std::to_string(c), [&op, c, n](Stream& s) { op.run(c, n, s); }, op.comm}, owner,
               stream, lane);
    };
    auto add_record = [&](std::vector<Step>& steps, std::size_t e, Stream& stream) {
        Event& ev = event(e);
        push(steps, {[&ev, &stream] { ev.record(stream); }, -1, static_cast<std::ptrdiff_t>(e)});
    };
    auto add_wait = [&](std::vector<Step>& steps, std::size_t e, Stream& stream) {
        Event& ev = event(e);
        push(steps, {[&ev, &stream] { stream.wait(ev); }, static_cast<std::ptrdiff_t>(e), -1});
    };
    // SMs for the exchange (see the header): open[b] while branch b's exchange may run beside the
    // backbone, from its ready index to its consume.
    std::vector<char> open(nb, 0);
    constexpr std::size_t kNone = static_cast<std::size_t>(-1);
    auto window_open = [&](std::size_t except) {
        for (std::size_t x = 0; x < nb; ++x)
            if (open[x] && x != except) return true;
        return false;
    };
    // Marks the backbone steps pushed since `first` as ops issued with (overlapped) or without the budget.
    auto mark = [&](std::vector<Step>& steps, std::size_t first, bool overlapped) {
        if (&steps != &backbone_steps) return;
        for (std::size_t k = first; k < steps.size(); ++k) {
            steps[k].backbone_op = true;
            steps[k].overlapped = overlapped;
        }
    };
    auto exchanges = [](const BranchPlan& p, int pieces) {
        return pieces == 1 ? (p.send.run && p.send.comm) || (p.receive.run && p.receive.comm)
                           : p.send_chunks.comm || p.receive_chunks.comm;
    };

    // Pieces per branch (1 = the unchunked stages).
    std::vector<int> chunks(nb);
    std::vector<std::size_t> first_event(nb + 1);
    for (std::size_t b = 0; b < nb; ++b) {
        const int c = schedule.branches[b].chunks;
        SCMOE_CHECK(c >= 1 && c <= plan.branches[b].max_chunks,
                    "LayerScheduler.run: " << plan.name << " branch " << plan.branches[b].name << " scheduled in " << c
                                           << " chunks; the plan allows 1.." << plan.branches[b].max_chunks);
        chunks[b] = c;
        first_event[b + 1] = first_event[b] + 2 + 2 * static_cast<std::size_t>(c);
    }
    // Events per branch: input ready (backbone), done (MoE), then per piece sent (MoE) and expert
    // done (backbone).
    auto ready_event = [&](std::size_t b) { return first_event[b]; };
    auto done_event = [&](std::size_t b) { return first_event[b] + 1; };
    auto sent_event = [&](std::size_t b, int c) { return first_event[b] + 2 + 2 * static_cast<std::size_t>(c); };
    auto expert_event = [&](std::size_t b, int c) { return first_event[b] + 3 + 2 * static_cast<std::size_t>(c); };
    for (std::size_t i = 0; i <= ns; ++i) {
        for (std::size_t b = 0; b < nb; ++b) {
            const BranchPlan& p = plan.branches[b];
            const int n = chunks[b];
            if (static_cast<std::size_t>(p.ready) == i) {
                if (overlap) {
                    add_record(backbone_steps, ready_event(b), backbone_);
                    add_wait(moe_steps, ready_event(b), moe_);
                    open[b] = exchanges(p, n);
                }
                const std::size_t pre_first = side_steps.size();
                add_op(side_steps, p.pre, p.name, side, side_lane);
                mark(side_steps, pre_first, false);
                for (int c = 0; c < n; ++c) {
                    if (n == 1)
                        add_op(side_steps, p.send, p.name, side, side_lane);
                    else
                        add_piece(side_steps, p.send_chunks, c, n, p.name, side, side_lane);
                    if (overlap) add_record(moe_steps, sent_event(b, c), moe_);
                }
            }
            if (static_cast<std::size_t>(schedule.branches[b].slot) == i) {
                // Pieces overlap the branch's other pieces' exchanges; a whole expert FFN runs after its
                // send and before its receive, beside other branches' exchanges only.
                const bool expert_overlapped = (n > 1 && open[b]) || window_open(b);
                for (int c = 0; c < n; ++c) {
                    if (overlap) add_wait(backbone_steps, sent_event(b, c), backbone_);
                    const std::size_t first = backbone_steps.size();
                    if (n == 1)
                        add_op(backbone_steps, p.expert, p.name, backbone_, "backbone");
                    else
                        add_piece(backbone_steps, p.expert_chunks, c, n, p.name, backbone_, "backbone");
                    mark(backbone_steps, first, expert_overlapped);
                    if (overlap) add_record(backbone_steps, expert_event(b, c), backbone_);
                }
                const std::size_t receive_first = side_steps.size();
                for (int c = 0; c < n; ++c) {
                    if (overlap) add_wait(moe_steps, expert_event(b, c), moe_);
                    if (n == 1)
                        add_op(side_steps, p.receive, p.name, side, side_lane);
                    else
                        add_piece(side_steps, p.receive_chunks, c, n, p.name, side, side_lane);
                }
                add_op(side_steps, p.post, p.name, side, side_lane);
                mark(side_steps, receive_first, false);
                if (overlap) add_record(moe_steps, done_event(b), moe_);
            }
            if (static_cast<std::size_t>(p.join) == i) {
                if (overlap) add_wait(backbone_steps, done_event(b), backbone_);
                open[b] = 0;  // the consume waits for the branch's end
                const std::size_t first = backbone_steps.size();
                add_op(backbone_steps, p.consume, p.name, backbone_, "backbone");
                mark(backbone_steps, first, window_open(kNone));
            }
        }
        if (at_index) {
            const std::size_t first = backbone_steps.size();
            push(backbone_steps, {[&at_index, i, this] { at_index(static_cast<int>(i), backbone_); }});
            mark(backbone_steps, first, window_open(kNone));
        }
        if (i < ns) {
            const std::size_t first = backbone_steps.size();
            add_op(backbone_steps, plan.segments[i], "", backbone_, "backbone");
            mark(backbone_steps, first, window_open(kNone));
        }
    }

    // Host issue order (review L1). An exchange may block the host until its stream has run
    // (NcclCommunicator reads the exchanged counts; the emulated GPU does the same). In
    // kBackboneAhead order every op goes out in program order, except that before each exchange
    // the backbone's program is issued as far ahead as its event waits allow, so the backbone has
    // its segments queued while the host waits. The other MoE-stream ops keep their program order
    // relative to the backbone's (a branch's route is issued before the shared expert that follows
    // it in the program: the layer's stage methods record their inputs when issued). The streams'
    // order and their event dependencies are the programs' whatever the host order, so results do
    // not change.
    std::vector<bool> recorded(events_.size(), false);
    auto issuable = [&](const Step& s) { return s.needs < 0 || recorded[static_cast<std::size_t>(s.needs)]; };
    const int budget = overlap ? overlapped_sm_budget() : 0;
    struct ResetBudget {  // every SM again after the pass, also when an op throws
        Stream& stream;
        ~ResetBudget() { stream.set_sm_budget(0); }
    } reset_budget{backbone_};
    auto issue = [&](const Step& s) {
        SCMOE_CHECK(issuable(s), "LayerScheduler.run: " << plan.name
                                                        << " plan: a stream waits for an event recorded later");
        if (s.backbone_op) backbone_.set_sm_budget(s.overlapped ? budget : 0);
        s.issue();
        if (s.records >= 0) recorded[static_cast<std::size_t>(s.records)] = true;
    };
    std::size_t bi = 0, mi = 0;
    while (bi < backbone_steps.size() || mi < moe_steps.size()) {
        const bool backbone_next =
            mi == moe_steps.size() || (bi < backbone_steps.size() && backbone_steps[bi].seq < moe_steps[mi].seq);
        if (backbone_next) {
            issue(backbone_steps[bi++]);
            continue;
        }
        if (issue_order_ == IssueOrder::kBackboneAhead && moe_steps[mi].blocking)
            while (bi < backbone_steps.size() && issuable(backbone_steps[bi])) issue(backbone_steps[bi++]);
        issue(moe_steps[mi++]);
    }
}

}  // namespace scmoe
