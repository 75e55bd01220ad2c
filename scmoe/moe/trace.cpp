#include "scmoe/moe/trace.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <utility>

#include "scmoe/kernels/error.h"
#include "scmoe/kernels/nvtx.h"

namespace scmoe {

Tracer::Tracer(Device& device, int rank) : device_(device), rank_(rank), base_(device.create_event()) {}

Tracer::~Tracer() = default;

Event& Tracer::next_event() {
    if (pool_used_ == pool_.size()) pool_.push_back(device_.create_event());
    return *pool_[pool_used_++];
}

void run_op(Tracer* trace, const std::string& name, const std::string& lane, Stream& stream,
            const std::function<void(Stream&)>& fn, bool comm) {
    NvtxRange range(name, comm);
    if (trace)
        trace->op(name, lane, stream, fn, comm);
    else
        fn(stream);
}

void Tracer::op(const std::string& name, const std::string& lane, Stream& stream,
                const std::function<void(Stream&)>& fn, bool comm) {
    if (!base_recorded_) {
        base_->record(stream);
        base_recorded_ = true;
    }
    const std::size_t start = pool_used_;
    next_event().record(stream);
    fn(stream);
    const std::size_t end = pool_used_;
    next_event().record(stream);
    pending_.push_back({name, lane, pass_, start, end, comm});
}

void Tracer::collect() {
    for (const Pending& p : pending_) {
        TraceEntry e;
        e.name = p.name;
        e.lane = p.lane;
        e.pass = p.pass;
        e.comm = p.comm;
        e.start_us = 1000.0 * pool_[p.start_event]->elapsed_ms_since(*base_);
        e.duration_us = 1000.0 * pool_[p.end_event]->elapsed_ms_since(*pool_[p.start_event]);
        entries_.push_back(std::move(e));
    }
    pending_.clear();
    pool_used_ = 0;
}

void Tracer::clear() {
    pending_.clear();  // ops of a step that failed half way are dropped with the rest
    pool_used_ = 0;
    entries_.clear();
    base_recorded_ = false;
}

namespace {

using Intervals = std::vector<std::pair<double, double>>;

// Sorted, disjoint union of [start, end) intervals.
Intervals merged(Intervals v) {
    std::sort(v.begin(), v.end());
    Intervals out;
    for (const auto& [a, b] : v) {
        if (!out.empty() && a <= out.back().second)
            out.back().second = std::max(out.back().second, b);
        else
            out.emplace_back(a, b);
    }
    return out;
}

double total(const Intervals& v) {
    double t = 0;
    for (const auto& [a, b] : v) t += b - a;
    return t;
}

// Length of the intersection of two sorted, disjoint unions.
double overlap(const Intervals& x, const Intervals& y) {
    double t = 0;
    for (std::size_t i = 0, j = 0; i < x.size() && j < y.size();) {
        t += std::max(0.0, std::min(x[i].second, y[j].second) - std::max(x[i].first, y[j].first));
        if (x[i].second < y[j].second)
            ++i;
        else
            ++j;
    }
    return t;
}

std::string quoted(const std::string& s) {
    std::string out = "\"";
    for (char c : s) {
        if (c == '"' || c == '\\') out += '\\';
        if (static_cast<unsigned char>(c) >= 0x20) out += c;
    }
    return out + "\"";
}

}  // namespace

OverlapSummary summarize_overlap(std::span<const TraceEntry> entries) {
    OverlapSummary o;
    if (entries.empty()) return o;
    Intervals comm, compute;
    double first = entries.front().start_us, last = first;
    for (const TraceEntry& e : entries) {
        (e.comm ? comm : compute).emplace_back(e.start_us, e.start_us + e.duration_us);
        first = std::min(first, e.start_us);
        last = std::max(last, e.start_us + e.duration_us);
    }
    comm = merged(std::move(comm));
    compute = merged(std::move(compute));
    o.span_us = last - first;
    o.comm_us = total(comm);
    o.exposed_us = o.comm_us - overlap(comm, compute);
    return o;
}

double lane_idle_us(std::span<const TraceEntry> entries, std::string_view lane) {
    Intervals busy;
    for (const TraceEntry& e : entries)
        if (e.lane == lane) busy.emplace_back(e.start_us, e.start_us + e.duration_us);
    if (busy.empty()) return 0;
    busy = merged(std::move(busy));
    return busy.back().second - busy.front().first - total(busy);
}

void Tracer::write(const std::string& path) const {
    std::map<std::string, int> lane_ids;
    for (const TraceEntry& e : entries_) lane_ids.emplace(e.lane, static_cast<int>(lane_ids.size()));
    std::ofstream out(path);
    SCMOE_CHECK(out, "Tracer: cannot open " << path << " for writing");
    const std::string pid = std::to_string(rank_);
    out << "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
    out << "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": " << pid << ", \"args\": {\"name\": \"rank " << pid
        << "\"}}";
    for (const auto& [lane, id] : lane_ids)
        out << ",\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": " << pid << ", \"tid\": " << id
            << ", \"args\": {\"name\": " << quoted(lane) << "}}";
    char buf[96];
    for (const TraceEntry& e : entries_) {
        std::snprintf(buf, sizeof buf, "\"ts\": %.3f, \"dur\": %.3f", e.start_us, e.duration_us);
        out << ",\n{\"name\": " << quoted(e.name) << ", \"cat\": " << quoted(e.pass) << ", \"ph\": \"X\", \"pid\": " << pid
            << ", \"tid\": " << lane_ids.at(e.lane) << ", " << buf << (e.comm ? ", \"args\": {\"comm\": true}}" : "}");
    }
    out << "\n]}\n";
    SCMOE_CHECK(out.good(), "Tracer: writing " << path << " failed");
}

}  // namespace scmoe
