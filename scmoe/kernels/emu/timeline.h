// Timeline: the clock of one emulated GPU and of the host thread that drives it.
//
// A discrete-event model of CUDA's execution (after GPEmu, VLDB 2025, which replays op times instead
// of computing; here the times are virtual, so runs are deterministic and need no GPU):
//  - Streams are in-order queues of Work. A Work starts once the stream's previous Work has finished,
//    the host has enqueued it, and (for a wait) the awaited event has completed.
//  - Kernels share the SMs by processor sharing: comm kernels hold their SM share while active;
//    the rest goes to compute kernels, higher stream priority first, max-min fair within a priority,
//    each capped by the share it can fill alone (its demand). A kernel progresses at
//    (share it gets / its demand) of its speed alone. Copies use copy engines, not SMs.
//  - Residency (residency.h, after the CUDA C++ Programming Guide's "Hardware Multithreading"): Work
//    that holds SMs (resident_sms > 0: a comm kernel's channel blocks; a persistent kernel, whose one
//    block per SM of its grid loops until the work is done) becomes resident only where its blocks
//    fit beside those of the holders already resident: a comm kernel starts, and a persistent kernel
//    leaves its launch gap, only once its SMs plus those of every holder whose block leaves no room
//    for its own fit the GPU (or no such holder is resident). Until then it waits, its stream
//    blocked, and holds nothing; once resident it keeps its SMs to its end (a persistent kernel at
//    its full speed: its SMs are its own). Where several wait at one instant, higher stream priority
//    is served first ("work in a higher priority stream may preempt work already executing in a low
//    priority stream", cudaStreamCreateWithPriority). Ordinary kernels share what the holders leave.
//    So a comm kernel that arrives while a persistent kernel holds every SM (CUTLASS's grouped GEMM:
//    64,512 of 65,536 registers per SM, review 2 #6) runs only once that kernel ends, unless the
//    kernel's grid was limited to SMs - R (Stream::set_sm_budget), leaving it R SMs.
//  - Copies over the host link (PCIe) run on copy engines, beside kernels; the copies of one
//    direction in flight share that direction's bandwidth equally (each at 1/n of its speed alone),
//    host-to-device and device-to-host independently (PCIe is full duplex).
//  - Host tasks of all streams run on one callback lane per GPU, one at a time.
//  - Comm Work meets the same Work on its peers' GPUs (a Rendezvous, rendezvous.h): it holds its SM
//    share from its own arrival and completes its duration after the last member arrives.
//  - The host thread has its own clock: each enqueue costs it the launch time; a synchronize sets it
//    to the awaited completion (plus the sync latency). The GPU side never runs ahead of the host
//    clock while the host is running, so Work enqueued later can never start in the model's past.
//
// Effects (the real side effects of a Work: routing metadata, host tasks) run when the Work
// completes, in completion order, under the world lock, on whichever thread advances the model.
// All emulated GPUs of a process share one World (one lock, detail/world.h), since collectives tie
// their clocks.
#pragma once

#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "scmoe/kernels/emu/gpu_spec.h"
#include "scmoe/kernels/emu/rendezvous.h"
#include "scmoe/kernels/emu/residency.h"

namespace scmoe::emu {

class Timeline;

// An event's generations (as CpuEvent): record() bumps `recorded` on the host; the record Work
// completes generation g at a model time kept in `times`.
struct EventState {
    std::uint64_t recorded = 0;
    std::uint64_t completed = 0;
    std::map<std::uint64_t, double> times;  // the most recent generations' completion times (us)
};

enum class WorkKind { kKernel, kComm, kCopy, kHostTask, kRecord, kWait };

struct Work {
    WorkKind kind = WorkKind::kKernel;
    std::string name;         // for diagnostics
    double fixed_us = 0;      // holds the stream first and uses no SMs (kernel gap, copy setup)
    double work_us = 0;       // kernel: time alone on the GPU; copy, host task: duration
    double demand = 1;        // kernel: SM share it fills alone, (0, 1]; comm: SM share it holds
    int link = 0;             // copy: 0 none (device-local), 1 host-to-device, 2 device-to-host (shared)
    // Residency (see the header): the SMs the Work holds while resident, 0 for an ordinary kernel
    // (processor sharing only); a comm Work's channels, a persistent kernel's grid (demand is then
    // resident_sms / SMs). `block`: what one of its blocks holds on its SM.
    int resident_sms = 0;
    BlockResources block;
    // Optional: sets work_us and demand when the Work starts (a kernel whose size is routing
    // metadata that earlier Work's effects wrote, read only then, as the GPU reads it).
    std::function<void(Work&)> at_start;
    // Optional: runs when the Work completes (an exception fails the stream).
    std::function<void()> effect;
    std::shared_ptr<EventState> event;  // kRecord, kWait
    std::uint64_t generation = 0;
    std::shared_ptr<Rendezvous> rendezvous;  // kComm
    int member = 0;
    double enqueued_at = 0;  // set by Timeline::enqueue: the host clock after the launch
};

// Counters of one timeline (model time in us).
struct TimelineStats {
    std::uint64_t works = 0;       // Work completed
    std::uint64_t host_tasks = 0;  // of which host tasks (driver callbacks on CUDA)
    std::uint64_t late_starts = 0; // Work that became ready in the model's past (see horizon); 0 in
    double late_us = 0;            // a faithful run: their total delay
    std::uint64_t residency_waits = 0;  // Work that was ready but had to wait for SMs its blocks fit
    double residency_wait_us = 0;       // (see the header): how long, in all
};

class Timeline {
public:
    explicit Timeline(GpuSpec spec);
    ~Timeline();
    Timeline(const Timeline&) = delete;
    Timeline& operator=(const Timeline&) = delete;

    const GpuSpec& spec() const { return spec_; }

    // Streams: ids from 0; priority 1 = high, 0 = normal.
    int add_stream(int priority);
    // Waits for the stream's Work (errors dropped) and forgets it.
    void remove_stream(int stream);

    // Host side, called by the GPU's host thread. enqueue() costs the host `host_cost_us` first
    // and stamps the Work with the new host time.
    void enqueue(int stream, Work work, double host_cost_us);
    // Blocks until all Work enqueued on `stream` so far has completed; rethrows its first error.
    void synchronize(int stream);
    // Blocks until generation `generation` of the event has completed (no-op for 0).
    void synchronize(const std::shared_ptr<EventState>& event, std::uint64_t generation);
    // Blocks until every stream is idle (errors dropped).
    void synchronize_all();
    // Blocks until all members have met; the host clock becomes the meeting's end.
    void meet(HostMeeting& meeting);
    double host_time_us() const;
    void advance_host(double us);
    // The model's completion time of an event generation; it must have completed.
    double event_time_us(const EventState& event, std::uint64_t generation) const;
    TimelineStats stats() const;

private:
    struct Active {
        Work work;
        double start = 0;
        double fixed_left = 0;
        double work_left = 0;
        double rate = 0;  // kernels in their work phase: current speed relative to alone
        int priority = 0;
        bool holding = false;        // a persistent kernel resident on its SMs
        double waiting_since = -1;   // a persistent kernel past its gap, waiting for its SMs (model time)
    };
    struct StreamState {
        int priority = 0;
        bool live = true;
        std::deque<Work> queue;  // not started
        std::optional<Active> active;
        double free_at = 0;  // completion time of the last completed Work
        std::uint64_t enqueued = 0, finished = 0;
        std::exception_ptr error;
        double blocked_since = -1;  // the queue's front, a comm Work, is ready but its blocks do not fit
    };
    enum class HostState { kRunning, kWaitingGpu, kWaitingPeers };

    friend class World;
    // Under the world lock: advances as far as the horizon allows; true when something changed.
    bool advance();
    double ready_time(const StreamState& s) const;
    // Residency (see the header): whether `w`'s blocks can become resident now; admits the front
    // comm Work or the waiting persistent kernel of `s` when they can (true when one was).
    bool fits_now(const Work& w) const;
    bool admit(StreamState& s);
    void start_ready();
    void start(StreamState& s, double at);
    void complete(StreamState& s);
    bool finished(const Active& a) const;
    double next_event(bool& blocked) const;
    void set_rates();
    void progress_to(double t);
    double horizon() const;
    void wait_until(std::unique_lock<std::mutex>& lock, const std::function<bool()>& done, const char* what);
    std::string describe_state() const;

    GpuSpec spec_;
    std::vector<StreamState> streams_;
    double now_ = 0;         // the GPU side's model time
    double lane_free_ = 0;   // the callback lane's next free time
    double host_ = 0;        // the host thread's clock
    HostState host_state_ = HostState::kRunning;
    bool relaxed_ = false;   // the host waits for peers and the world found no other way forward
    std::optional<double> waited_done_at_;  // kWaitingGpu: when the awaited Work completed
    std::function<bool()> waited_;          // kWaitingGpu: the condition
    TimelineStats stats_;
};

}  // namespace scmoe::emu
