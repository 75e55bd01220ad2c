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
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernels/device.h"

namespace scmoe {

struct TraceEntry {
    std::string name;  // op name, e.g. "dispatch[moe1]"
    std::string lane;  // stream role, e.g. "backbone", "moe"
    std::string pass;  // "forward", "backward", "calibrate", ...
    double start_us = 0, duration_us = 0;  // from the tracer's first recorded op
};

class Tracer {
public:
    // rank: the trace's process id (one timeline per rank; merge the files to see all ranks).
    Tracer(Device& device, int rank);
    ~Tracer();
    Tracer(const Tracer&) = delete;
    Tracer& operator=(const Tracer&) = delete;

    // Enqueues fn(stream) between two events recorded on `stream`.
    void op(const std::string& name, const std::string& lane, Stream& stream,
            const std::function<void(Stream&)>& fn);
    // Labels the ops recorded from now on (default "run").
    void set_pass(std::string pass) { pass_ = std::move(pass); }
    // After all traced work has completed: converts the recorded events into entries.
    void collect();
    const std::vector<TraceEntry>& entries() const { return entries_; }
    // Chrome trace JSON: one "X" event per entry, pid = rank, one thread row per lane.
    void write(const std::string& path) const;

private:
    struct Pending {
        std::string name, lane, pass;
        std::size_t start_event, end_event;
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
