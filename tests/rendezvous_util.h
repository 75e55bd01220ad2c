// Proving that two pieces of stream work run at the same time, without timing anything.
//
// A Rendezvous joins two ops: each one, when it starts, marks itself arrived and blocks until the
// other has arrived too. Where the schedule lets both run at once, both arrive and go on, on any
// machine and under any load. Where it orders one after the other (the same stream, an event
// between them), the first one waits for an op that cannot start before it ends: after the timeout
// it throws "A waited 1 s for B to start: the schedule serialized them", again whatever the speed.
// So a test asserts "completes" or "fails with that error", never a duration; the timeout only
// bounds how long a serialized schedule takes to be reported (long where the test expects the
// rendezvous to succeed, short where it expects the failure).
//
// The hooks that put a Rendezvous into code the test does not own:
//   RendezvousCommunicator  a Communicator decorator: a chosen all_to_all_v or all_reduce_sum
//                           meets the rendezvous on its stream before the collective.
//   TraceProbe              a Device to build a Tracer on: the next op (or the n-th) that Tracer
//                           records on a chosen stream meets the rendezvous as it starts.
// Both take a Rendezvous by reference: it must outlive the streams' work (synchronize them first).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <utility>

#include "scmoe/comm/communicator.h"
#include "scmoe/kernels/device.h"
#include "scmoe/kernels/error.h"

namespace scmoe::testing {

class Rendezvous {
  public:
    enum Side { kFirst = 0, kSecond = 1 };

    // first, second: the ops' names, for the error. timeout_s: how long either side waits.
    Rendezvous(std::string first, std::string second, double timeout_s)
        : names_{std::move(first), std::move(second)}, timeout_s_(timeout_s) {}

    // Marks `side` arrived and waits for the other side; throws Error after the timeout.
    void arrive(Side side) {
        const int me = side, other = 1 - side;
        std::unique_lock lock(mu_);
        arrived_[me] = true;
        cv_.notify_all();
        const auto timeout = std::chrono::duration<double>(timeout_s_);
        if (!cv_.wait_for(lock, timeout, [&] { return arrived_[other]; })) {
            std::ostringstream os;
            os << names_[me] << " waited " << timeout_s_ << " s for " << names_[other]
               << " to start: the schedule serialized them";
            SCMOE_FAIL(os.str());
        }
    }
    // Enqueues arrive(side) on `stream`: it runs where the stream's earlier work has finished.
    void arrive_on(Stream& stream, Side side) {
        stream.host_task([this, side] { arrive(side); });
    }
    // Both sides arrived: the two ops ran at the same time.
    bool met() const {
        std::scoped_lock lock(mu_);
        return arrived_[0] && arrived_[1];
    }

  private:
    std::string names_[2];
    double timeout_s_;
    mutable std::mutex mu_;
    std::condition_variable cv_;
    bool arrived_[2] = {false, false};
};

// Forwards every call to `inner`. After meet_at(n, ...), the n-th all_to_all_v from then on (0 =
// the next) first enqueues the rendezvous's arrival of `side` on its stream, then calls
// `enqueued` (on the calling thread, e.g. to arm a TraceProbe for the other side). After
// meet_at_all_reduce(which, ...), the same for the first all_reduce_sum from then on for which
// which(buf, count) holds (buf: the call's buffer, count: its elements). Arm from the thread that
// issues the collectives (the calls are not synchronized).
class RendezvousCommunicator final : public Communicator {
  public:
    using AllReduceMatch = std::function<bool(const void* buf, std::int64_t count)>;

    explicit RendezvousCommunicator(Communicator& inner) : inner_(inner) {}

    void meet_at(int nth_all_to_all, Rendezvous& rendezvous, Rendezvous::Side side,
                 std::function<void()> enqueued = {}) {
        countdown_ = nth_all_to_all;
        all_to_all_ = {&rendezvous, side, std::move(enqueued)};
    }
    void meet_at_all_reduce(AllReduceMatch which, Rendezvous& rendezvous, Rendezvous::Side side,
                            std::function<void()> enqueued = {}) {
        all_reduce_match_ = std::move(which);
        all_reduce_ = {&rendezvous, side, std::move(enqueued)};
    }

    int rank() const override { return inner_.rank(); }
    int size() const override { return inner_.size(); }
    std::string name() const override { return "rendezvous(" + inner_.name() + ")"; }

    void all_to_all_v(const void* send, const std::int64_t* send_counts, void* recv, std::int64_t* recv_counts,
                      DType dtype, Stream& stream) override {
        if (all_to_all_.rendezvous && countdown_-- == 0) all_to_all_.arrive_on(stream);
        inner_.all_to_all_v(send, send_counts, recv, recv_counts, dtype, stream);
    }
    // Counted with all_to_all_v: the n-th exchange, whichever variant it uses.
    void all_to_all_v_known(const void* send, const std::int64_t* send_counts, void* recv,
                            const std::int64_t* recv_counts, DType dtype, Stream& stream) override {
        if (all_to_all_.rendezvous && countdown_-- == 0) all_to_all_.arrive_on(stream);
        inner_.all_to_all_v_known(send, send_counts, recv, recv_counts, dtype, stream);
    }
    void all_reduce_sum(void* buf, std::int64_t count, DType dtype, Stream& stream) override {
        if (all_reduce_.rendezvous && all_reduce_match_(buf, count)) all_reduce_.arrive_on(stream);
        inner_.all_reduce_sum(buf, count, dtype, stream);
    }
    void all_gather(const void* send, std::int64_t count_per_rank, void* recv, DType dtype, Stream& stream) override {
        inner_.all_gather(send, count_per_rank, recv, dtype, stream);
    }
    void broadcast(void* buf, std::int64_t count, DType dtype, int root, Stream& stream) override {
        inner_.broadcast(buf, count, dtype, root, stream);
    }
    void barrier(Stream& stream) override { inner_.barrier(stream); }

  private:
    // One armed meeting: fires once.
    struct Meeting {
        Rendezvous* rendezvous = nullptr;
        Rendezvous::Side side = Rendezvous::kFirst;
        std::function<void()> enqueued;
        void arrive_on(Stream& stream) {
            rendezvous->arrive_on(stream, side);
            rendezvous = nullptr;
            if (enqueued) enqueued();
        }
    };

    Communicator& inner_;
    int countdown_ = -1;
    Meeting all_to_all_, all_reduce_;
    AllReduceMatch all_reduce_match_;
};

// A Device for a Tracer (only its events are used; everything else is the wrapped device's). A
// Tracer brackets each op with two events recorded on the op's stream, the first right before it
// enqueues the op; the probe's events hook into those records. The probe's events stand in for the
// wrapped device's in a Tracer only (streams cannot wait on them).
class TraceProbe final : public Device {
  public:
    explicit TraceProbe(Device& inner) : inner_(inner) {}

    // Call while the Tracer enqueues an op (from inside it, e.g. from a RendezvousCommunicator's
    // `enqueued`): the next op after that one which the Tracer records on `stream` meets the
    // rendezvous as it starts, once everything `stream` ran before it has finished.
    void meet_at_next_op(Stream& stream, Rendezvous& rendezvous, Rendezvous::Side side) {
        std::scoped_lock lock(mu_);
        stream_ = &stream;
        rendezvous_ = &rendezvous;
        side_ = side;
        skip_current_end_ = true;
        records_to_skip_ = 0;
    }
    // Call between the Tracer's ops (none of them being enqueued), once the Tracer has recorded an
    // op since it was built or cleared (its first op also records its time base): the op the
    // Tracer starts on `stream` after nth_op others (0 = the next) meets the rendezvous as it
    // starts. Counts two records per op, so the Tracer's ops on `stream` must not nest (no op
    // enqueued on `stream` from inside another's enqueue on `stream`).
    void meet_at_op(Stream& stream, int nth_op, Rendezvous& rendezvous, Rendezvous::Side side) {
        std::scoped_lock lock(mu_);
        stream_ = &stream;
        rendezvous_ = &rendezvous;
        side_ = side;
        skip_current_end_ = false;
        records_to_skip_ = 2 * nth_op;
    }

    Backend backend() const override { return inner_.backend(); }
    std::string description() const override { return "probe(" + inner_.description() + ")"; }
    DType compute_dtype() const override { return inner_.compute_dtype(); }
    void* allocate(std::size_t bytes) override { return inner_.allocate(bytes); }
    void deallocate(void* ptr) override { inner_.deallocate(ptr); }
    void* allocate_host(std::size_t bytes) override { return inner_.allocate_host(bytes); }
    void deallocate_host(void* ptr) override { inner_.deallocate_host(ptr); }
    std::unique_ptr<Event> create_event() override {
        return std::make_unique<ProbeEvent>(*this, inner_.create_event());
    }
    double host_time_us() const override { return inner_.host_time_us(); }

  protected:
    std::unique_ptr<Stream> make_stream(StreamPriority priority) override { return inner_.create_stream(priority); }

  private:
    class ProbeEvent final : public Event {
      public:
        ProbeEvent(TraceProbe& probe, std::unique_ptr<Event> inner) : probe_(probe), inner_(std::move(inner)) {}
        void record(Stream& stream) override {
            inner_->record(stream);
            probe_.recorded_on(stream);
        }
        void synchronize() const override { inner_->synchronize(); }
        float elapsed_ms_since(const Event& start) const override {
            return inner_->elapsed_ms_since(*dynamic_cast<const ProbeEvent&>(start).inner_);
        }

      private:
        TraceProbe& probe_;
        std::unique_ptr<Event> inner_;
    };

    void recorded_on(Stream& stream) {
        Rendezvous* rendezvous = nullptr;
        Rendezvous::Side side = Rendezvous::kFirst;
        {
            std::scoped_lock lock(mu_);
            if (!rendezvous_) return;
            if (skip_current_end_) {  // the end of the op that armed the probe, on any stream
                skip_current_end_ = false;
                return;
            }
            if (&stream != stream_) return;
            if (records_to_skip_ > 0) {  // the start and the end of an op before the chosen one
                --records_to_skip_;
                return;
            }
            std::swap(rendezvous, rendezvous_);
            side = side_;
        }
        rendezvous->arrive_on(stream, side);
    }

    Device& inner_;
    std::mutex mu_;
    Stream* stream_ = nullptr;
    Rendezvous* rendezvous_ = nullptr;
    Rendezvous::Side side_ = Rendezvous::kFirst;
    bool skip_current_end_ = false;
    int records_to_skip_ = 0;
};

}  // namespace scmoe::testing
