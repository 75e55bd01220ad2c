#include "scmoe/comm/emulated_link.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <deque>
#include <sstream>
#include <thread>

#include "scmoe/kernels/error.h"
#if SCMOE_WITH_CUDA
#include "scmoe/comm/detail/link_timer_cuda.h"
#endif

namespace scmoe {
namespace {

using Clock = std::chrono::steady_clock;

double us_since(Clock::time_point start) {
    return std::chrono::duration<double, std::micro>(Clock::now() - start).count();
}

// A strict positive/non-negative number parser: the whole text, finite.
bool parse_number(std::string_view text, double& value) {
    const std::string s(text);
    if (s.empty()) return false;
    char* end = nullptr;
    value = std::strtod(s.c_str(), &end);
    return end == s.c_str() + s.size() && std::isfinite(value);
}

LinkModel checked(LinkModel m) {
    SCMOE_CHECK(m.gbps > 0.0, "link '" << m.name << "': bandwidth " << m.gbps << " GB/s must be positive");
    SCMOE_CHECK(m.latency_us >= 0.0, "link '" << m.name << "': latency " << m.latency_us << " us must be >= 0");
    return m;
}

}  // namespace

std::vector<LinkModel> link_presets() {
    return {
        {"pcie4", 25.0, 10.0},
        {"nvlink4", 450.0, 3.0},
        {"ib-ndr", 50.0, 5.0},
        {"100gbe", 12.5, 15.0},
    };
}

LinkModel parse_link_model(std::string_view text) {
    for (const LinkModel& m : link_presets())
        if (text == m.name) return m;
    if (text.find('=') == std::string_view::npos) {
        std::string names;
        for (const LinkModel& m : link_presets()) names += (names.empty() ? "" : ", ") + m.name;
        SCMOE_FAIL("unknown link '" << text << "': expected one of " << names << ", or gbps=X,latency_us=Y");
    }
    LinkModel m{"custom", 0.0, 0.0};
    bool have_gbps = false;
    std::size_t pos = 0;
    while (pos <= text.size()) {
        std::size_t end = text.find(',', pos);
        if (end == std::string_view::npos) end = text.size();
        const std::string_view item = text.substr(pos, end - pos);
        pos = end + 1;
        if (item.empty()) continue;
        const std::size_t eq = item.find('=');
        const std::string_view key = item.substr(0, eq);
        double value = 0.0;
        SCMOE_CHECK(eq != std::string_view::npos && parse_number(item.substr(eq + 1), value),
                    "link '" << text << "': '" << item << "' is not key=number");
        if (key == "gbps") {
            m.gbps = value;
            have_gbps = true;
        } else if (key == "latency_us") {
            m.latency_us = value;
        } else {
            SCMOE_FAIL("link '" << text << "': unknown key '" << key << "' (expected gbps, latency_us)");
        }
    }
    SCMOE_CHECK(have_gbps, "link '" << text << "': gbps=X is required");
    return checked(m);
}

std::string describe_link_model(const LinkModel& model) {
    std::ostringstream os;
    os << model.name << " (" << model.gbps << " GB/s, " << model.latency_us << " us)";
    return os.str();
}

const char* link_op_name(LinkOp op) {
    switch (op) {
        case LinkOp::kAllToAllV:
            return "all_to_all_v";
        case LinkOp::kAllReduceSum:
            return "all_reduce_sum";
        case LinkOp::kAllGather:
            return "all_gather";
        case LinkOp::kBroadcast:
            return "broadcast";
        case LinkOp::kBarrier:
            return "barrier";
    }
    return "?";
}

double modelled_link_us(const LinkModel& model, LinkOp op, double bytes, int num_ranks) {
    if (num_ranks <= 1) return 0.0;
    const double n = num_ranks;
    double link_bytes = 0.0;
    switch (op) {
        case LinkOp::kAllToAllV:
        case LinkOp::kBroadcast:
            link_bytes = bytes;
            break;
        case LinkOp::kAllReduceSum:
            link_bytes = 2.0 * (n - 1.0) / n * bytes;
            break;
        case LinkOp::kAllGather:
            link_bytes = (n - 1.0) / n * bytes;
            break;
        case LinkOp::kBarrier:
            link_bytes = 0.0;
            break;
    }
    return model.latency_us + link_bytes / (model.gbps * 1e3);
}

// NOTES: the start task writes `start` and `sent_bytes`; the end task, later on the same stream,
// reads them. Stream order makes that a happens-before, so no lock.
struct EmulatedLink::Pending {
    Clock::time_point start{};
    double sent_bytes = 0.0;
};

// NOTES: stamps come in pinned chunks; an op takes one when enqueued and gives it back once
// collect_device_holds has seen its hold finish. Guarded by EmulatedLink::mu_.
struct EmulatedLink::DeviceHolds {
#if SCMOE_WITH_CUDA
    struct Op {
        comm_detail::LinkStamps* stamps;
        LinkOp op;
        double bytes, model_us;
    };
    static constexpr int kStampsPerChunk = 64;
    std::vector<comm_detail::LinkStamps*> chunks, free;
    std::deque<Op> in_flight;

    ~DeviceHolds() {
        for (comm_detail::LinkStamps* c : chunks) comm_detail::free_link_stamps(c);
    }
    comm_detail::LinkStamps* acquire() {
        if (free.empty()) {
            comm_detail::LinkStamps* chunk = comm_detail::allocate_link_stamps(kStampsPerChunk);
            chunks.push_back(chunk);
            for (int i = kStampsPerChunk - 1; i >= 0; --i) free.push_back(chunk + i);
        }
        comm_detail::LinkStamps* s = free.back();
        free.pop_back();
        *s = comm_detail::LinkStamps{};
        return s;
    }
#endif
};

EmulatedLink::EmulatedLink(Communicator& inner, LinkModel model) : inner_(&inner), model_(checked(std::move(model))) {}

EmulatedLink::EmulatedLink(std::shared_ptr<Communicator> inner, LinkModel model)
    : owned_(std::move(inner)), inner_(owned_.get()), model_(checked(std::move(model))) {
    SCMOE_CHECK(inner_ != nullptr, "EmulatedLink needs a communicator to wrap");
}

EmulatedLink::~EmulatedLink() = default;

std::string EmulatedLink::name() const { return "link(" + describe_link_model(model()) + ") over " + inner_->name(); }

LinkModel EmulatedLink::model() const {
    std::scoped_lock lock(mu_);
    return model_;
}

void EmulatedLink::set_model(LinkModel model) {
    LinkModel m = checked(std::move(model));
    std::scoped_lock lock(mu_);
    model_ = std::move(m);
}

double EmulatedLink::modelled_us(LinkOp op, double bytes) const { return modelled_link_us(model(), op, bytes, size()); }

std::shared_ptr<EmulatedLink::Pending> EmulatedLink::start(Stream& stream, std::function<double()> sent_bytes) {
    auto pending = std::make_shared<Pending>();
    stream.host_task([pending, sent_bytes = std::move(sent_bytes)] {
        pending->start = Clock::now();
        pending->sent_bytes = sent_bytes ? sent_bytes() : 0.0;
    });
    return pending;
}

void EmulatedLink::finish(Stream& stream, LinkOp op, std::shared_ptr<Pending> pending,
                          std::function<double()> received_bytes) {
    stream.host_task([this, op, pending = std::move(pending), received_bytes = std::move(received_bytes)] {
        const double wrapped_us = us_since(pending->start);
        const double bytes = std::max(pending->sent_bytes, received_bytes ? received_bytes() : 0.0);
        const double model_us = modelled_us(op, bytes);
        std::this_thread::sleep_until(pending->start + std::chrono::duration_cast<Clock::duration>(
                                                           std::chrono::duration<double, std::micro>(model_us)));
        const double measured_us = us_since(pending->start);
        std::scoped_lock lock(mu_);
        count(op, bytes, model_us, wrapped_us, measured_us);
    });
}

void EmulatedLink::count(LinkOp op, double bytes, double model_us, double wrapped_us, double measured_us) const {
    LinkCounters& c = counters_[static_cast<std::size_t>(op)];
    ++c.ops;
    c.bytes += bytes;
    c.modelled_us += model_us;
    c.wrapped_us += wrapped_us;
    c.measured_us += measured_us;
}

void EmulatedLink::hold(Stream& stream, LinkOp op, const std::function<void()>& wrapped, std::function<double()> sent,
                        std::function<double()> received) {
    if (stream.backend() == Backend::kCuda) return hold_on_device(stream, op, wrapped, sent, received);
    auto pending = start(stream, std::move(sent));
    wrapped();
    finish(stream, op, std::move(pending), std::move(received));
}

#if SCMOE_WITH_CUDA
void EmulatedLink::hold_on_device(Stream& stream, LinkOp op, const std::function<void()>& wrapped,
                                  const std::function<double()>& sent, const std::function<double()>& received) {
    comm_detail::LinkStamps* stamps = nullptr;
    {
        std::scoped_lock lock(mu_);
        if (!device_holds_) device_holds_ = std::make_unique<DeviceHolds>();
        stamps = device_holds_->acquire();
    }
    comm_detail::link_timer_start_cuda(stamps, stream.native_handle());
    wrapped();
    const double bytes = std::max(sent ? sent() : 0.0, received ? received() : 0.0);
    const double model_us = modelled_us(op, bytes);
    comm_detail::link_timer_hold_cuda(stamps, static_cast<std::uint64_t>(std::llround(model_us * 1e3)),
                                      stream.native_handle());
    std::scoped_lock lock(mu_);
    device_holds_->in_flight.push_back({stamps, op, bytes, model_us});
}

void EmulatedLink::collect_device_holds() const {
    if (!device_holds_) return;
    auto& in_flight = device_holds_->in_flight;
    for (auto it = in_flight.begin(); it != in_flight.end();) {
        const std::uint64_t end = comm_detail::link_stamps_end_ns(*it->stamps);
        if (end == 0) {
            ++it;
            continue;
        }
        const auto& st = *it->stamps;
        count(it->op, it->bytes, it->model_us, static_cast<double>(st.wrapped_end_ns - st.start_ns) * 1e-3,
              static_cast<double>(end - st.start_ns) * 1e-3);
        device_holds_->free.push_back(it->stamps);
        it = in_flight.erase(it);
    }
}
#else
void EmulatedLink::hold_on_device(Stream&, LinkOp, const std::function<void()>&, const std::function<double()>&,
                                  const std::function<double()>&) {
    SCMOE_FAIL("EmulatedLink got a CUDA stream in a build without CUDA");
}

void EmulatedLink::collect_device_holds() const {}
#endif

namespace {
// Bytes an all-to-all moves to or from the other ranks; null counts are left for the wrapped op to
// reject.
double off_rank_bytes(const std::int64_t* counts, int me, int n, DType dtype) {
    double elements = 0.0;
    if (counts != nullptr)
        for (int p = 0; p < n; ++p)
            if (p != me) elements += static_cast<double>(std::max<std::int64_t>(counts[p], 0));
    return elements * static_cast<double>(dtype_size(dtype));
}
}  // namespace

void EmulatedLink::all_to_all_v(const void* send, const std::int64_t* send_counts, void* recv,
                                std::int64_t* recv_counts, DType dtype, Stream& stream) {
    const int me = rank(), n = size();
    hold(
        stream, LinkOp::kAllToAllV,
        [&] { inner_->all_to_all_v(send, send_counts, recv, recv_counts, dtype, stream); },
        [=] { return off_rank_bytes(send_counts, me, n, dtype); },
        [=] { return off_rank_bytes(recv_counts, me, n, dtype); });
}

void EmulatedLink::all_to_all_v_known(const void* send, const std::int64_t* send_counts, void* recv,
                                      const std::int64_t* recv_counts, DType dtype, Stream& stream) {
    const int me = rank(), n = size();
    hold(
        stream, LinkOp::kAllToAllV,
        [&] { inner_->all_to_all_v_known(send, send_counts, recv, recv_counts, dtype, stream); },
        [=] { return off_rank_bytes(send_counts, me, n, dtype); },
        [=] { return off_rank_bytes(recv_counts, me, n, dtype); });
}

namespace {
double payload_bytes(std::int64_t count, DType dtype, double copies = 1.0) {
    return static_cast<double>(std::max<std::int64_t>(count, 0)) * static_cast<double>(dtype_size(dtype)) * copies;
}
}  // namespace

void EmulatedLink::all_reduce_sum(void* buf, std::int64_t count, DType dtype, Stream& stream) {
    const double bytes = payload_bytes(count, dtype);
    hold(
        stream, LinkOp::kAllReduceSum, [&] { inner_->all_reduce_sum(buf, count, dtype, stream); },
        [bytes] { return bytes; }, nullptr);
}

void EmulatedLink::all_gather(const void* send, std::int64_t count_per_rank, void* recv, DType dtype, Stream& stream) {
    const double bytes = payload_bytes(count_per_rank, dtype, static_cast<double>(size()));
    hold(
        stream, LinkOp::kAllGather, [&] { inner_->all_gather(send, count_per_rank, recv, dtype, stream); },
        [bytes] { return bytes; }, nullptr);
}

void EmulatedLink::broadcast(void* buf, std::int64_t count, DType dtype, int root, Stream& stream) {
    const double bytes = payload_bytes(count, dtype);
    hold(
        stream, LinkOp::kBroadcast, [&] { inner_->broadcast(buf, count, dtype, root, stream); },
        [bytes] { return bytes; }, nullptr);
}

void EmulatedLink::barrier(Stream& stream) {
    hold(stream, LinkOp::kBarrier, [&] { inner_->barrier(stream); }, nullptr, nullptr);
}

LinkCounters EmulatedLink::counters(LinkOp op) const {
    std::scoped_lock lock(mu_);
    collect_device_holds();
    return counters_[static_cast<std::size_t>(op)];
}

LinkCounters EmulatedLink::counters() const {
    std::scoped_lock lock(mu_);
    collect_device_holds();
    LinkCounters total;
    for (const LinkCounters& c : counters_) {
        total.ops += c.ops;
        total.bytes += c.bytes;
        total.modelled_us += c.modelled_us;
        total.wrapped_us += c.wrapped_us;
        total.measured_us += c.measured_us;
    }
    return total;
}

void EmulatedLink::reset_counters() {
    std::scoped_lock lock(mu_);
    collect_device_holds();
    counters_ = {};
}

}  // namespace scmoe
