#include "moe/trace.h"

#include <cstdio>
#include <fstream>
#include <map>

#include "kernels/error.h"

namespace scmoe {

Tracer::Tracer(Device& device, int rank) : device_(device), rank_(rank), base_(device.create_event()) {}

Tracer::~Tracer() = default;

Event& Tracer::next_event() {
    if (pool_used_ == pool_.size()) pool_.push_back(device_.create_event());
    return *pool_[pool_used_++];
}

void Tracer::op(const std::string& name, const std::string& lane, Stream& stream,
                const std::function<void(Stream&)>& fn) {
    if (!base_recorded_) {
        base_->record(stream);
        base_recorded_ = true;
    }
    const std::size_t start = pool_used_;
    next_event().record(stream);
    fn(stream);
    const std::size_t end = pool_used_;
    next_event().record(stream);
    pending_.push_back({name, lane, pass_, start, end});
}

void Tracer::collect() {
    for (const Pending& p : pending_) {
        TraceEntry e;
        e.name = p.name;
        e.lane = p.lane;
        e.pass = p.pass;
        e.start_us = 1000.0 * pool_[p.start_event]->elapsed_ms_since(*base_);
        e.duration_us = 1000.0 * pool_[p.end_event]->elapsed_ms_since(*pool_[p.start_event]);
        entries_.push_back(std::move(e));
    }
    pending_.clear();
    pool_used_ = 0;
}

namespace {

std::string quoted(const std::string& s) {
    std::string out = "\"";
    for (char c : s) {
        if (c == '"' || c == '\\') out += '\\';
        if (static_cast<unsigned char>(c) >= 0x20) out += c;
    }
    return out + "\"";
}

}  // namespace

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
            << ", \"tid\": " << lane_ids.at(e.lane) << ", " << buf << "}";
    }
    out << "\n]}\n";
    SCMOE_CHECK(out.good(), "Tracer: writing " << path << " failed");
}

}  // namespace scmoe
