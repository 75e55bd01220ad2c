// Tracer: a per-rank timeline of stream work, written as Chrome/Perfetto trace JSON (open it in
// ui.perfetto.dev or chrome://tracing). Each op is bracketed by two events recorded on the stream
// it runs on, so the times are those of the stream (device time on CUDA, worker-thread time on
// CPU), not of the host thread that enqueued it.
//
//   Tracer trace(device, rank);
//   trace.op("attn0", "backbone", stream, [&](Stream& s) { ... enqueue ... });
//   ... synchronize the streams ...
//   trace.collect();            // turns the recorded events into entries; reuses the events
//   trace.write("trace.rank0.json");
//   OverlapSummary o = summarize_overlap(trace.entries());   // exposed communication
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "scmoe/kernels/device.h"

namespace scmoe {

struct TraceEntry {
    std::string name;  // op name, e.g. "dispatch[moe1]"
    std::string lane;  // stream role, e.g. "backbone", "moe"
    std::string pass;  // "forward", "backward", "calibrate", ...
    double start_us = 0, duration_us = 0;  // from the tracer's first recorded op
    bool comm = false;                     // communication (an all-to-all, an all-reduce), else compute
};

// How a timeline's communication overlaps its compute (the definition of profilers such as
// Holistic Trace Analysis): exposed communication is the time during which some communication
// entry runs and no compute entry runs, on any lane. Waiting for peers inside a collective counts
// as communication; time in which nothing runs (a thread waking up) counts as neither.
struct OverlapSummary {
    double span_us = 0;     // first entry's start to last entry's end
    double comm_us = 0;     // union of the communication entries
    double exposed_us = 0;  // part of comm_us not covered by the union of the compute entries
    double exposed_pct() const { return span_us > 0 ? 100.0 * exposed_us / span_us : 0.0; }
};
OverlapSummary summarize_overlap(std::span<const TraceEntry> entries);

// The time in which `lane` runs none of its entries, between its first entry's start and its last
// entry's end: a stream left idle (waiting for another stream, or for the host).
double lane_idle_us(std::span<const TraceEntry> entries, std::string_view lane);

class Tracer;

// Enqueues fn(stream) as the op `name` of `lane`: inside an NVTX range of that name (scmoe/kernels/nvtx.h:
// Nsight Systems shows it over the op's kernels), and as an entry of `trace` when there is one. The
// one way scheduled ops, exchanges and gradient all-reduces are enqueued, so the profiler's names
// and the Perfetto trace's are the same.
void run_op(Tracer* trace, const std::string& name, const std::string& lane, Stream& stream,
            const std::function<void(Stream&)>& fn, bool comm = false);

class Tracer {
public:
    // rank: the trace's process id (one timeline per rank; merge the files to see all ranks).
    Tracer(Device& device, int rank);
    ~Tracer();
    Tracer(const Tracer&) = delete;
    Tracer& operator=(const Tracer&) = delete;

    // Enqueues fn(stream) between two events recorded on `stream`; comm marks communication.
    void op(const std::string& name, const std::string& lane, Stream& stream,
            const std::function<void(Stream&)>& fn, bool comm = false);
    // Labels the ops recorded from now on (default "run").
    void set_pass(std::string pass) { pass_ = std::move(pass); }
    // After all traced work has completed: converts the recorded events into entries.
    void collect();
    // Drops the entries and any ops not collected; the next op starts a new timeline. Reuses the
    // events (the streams must be done with them: synchronize first).
    void clear();
    const std::vector<TraceEntry>& entries() const { return entries_; }
    // Chrome trace JSON: one "X" event per entry, pid = rank, one thread row per lane;
    // communication entries carry "args": {"comm": true}.
    void write(const std::string& path) const;

private:
    struct Pending {
        std::string name, lane, pass;
        std::size_t start_event, end_event;
        bool comm;
    };
    Event& next_event();

    Device& device_;
    int rank_;
    std::string pass_ = "run";
    std::unique_ptr<Event> base_;
    bool base_recorded_ = false;
    std::vector<std::unique_ptr<Event>> pool_;
    std::size_t pool_used_ = 0;
    std::vector<Pending> pending_;
    std::vector<TraceEntry> entries_;
};

}  // namespace scmoe
