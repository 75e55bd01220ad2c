// The emulated GPU's timeline, one semantic rule per test, on hand-checkable numbers (round_spec:
// launch 2 us, kernel gap 1 us, host task 10 us, sync 3 us).
#include <gtest/gtest.h>

#include <memory>
#include <thread>

#include "emu/emu_test_util.h"
#include "scmoe/kernels/emu/gpu_spec.h"
#include "scmoe/kernels/emu/residency.h"
#include "scmoe/kernels/emu/timeline.h"

namespace scmoe {
namespace {

using emu::Work;
using emu::WorkKind;

Work kernel(double us, double demand = 1.0) {
    Work w;
    w.kind = WorkKind::kKernel;
    w.name = "kernel";
    w.fixed_us = 1;  // the kernel gap
    w.work_us = us;
    w.demand = demand;
    return w;
}

Work host_task(double us, std::function<void()> fn = {}) {
    Work w;
    w.kind = WorkKind::kHostTask;
    w.name = "host_task";
    w.work_us = us;
    w.effect = std::move(fn);
    return w;
}

Work record(const std::shared_ptr<emu::EventState>& e) {
    Work w;
    w.kind = WorkKind::kRecord;
    w.event = e;
    w.generation = ++e->recorded;
    return w;
}

Work wait(const std::shared_ptr<emu::EventState>& e) {
    Work w;
    w.kind = WorkKind::kWait;
    w.event = e;
    w.generation = e->recorded;
    return w;
}

// Enqueue returns at once: the host pays only the launch. Synchronize blocks it until the kernel
// is done: gap 1 + 100 after the launch at 2, then the sync's 3 us.
TEST(EmuTimeline, EnqueueReturnsAtOnceAndSynchronizeBlocksTheHost) {
    emu::Timeline t(test::round_spec());
    const int s = t.add_stream(0);
    t.enqueue(s, kernel(100), 2);
    EXPECT_DOUBLE_EQ(t.host_time_us(), 2);
    t.enqueue(s, kernel(50), 2);
    EXPECT_DOUBLE_EQ(t.host_time_us(), 4);
    t.synchronize(s);
    // Kernel 1: [2, 103); kernel 2 ready at 103 (enqueued at 4): [103, 154); host 154 + 3.
    EXPECT_DOUBLE_EQ(t.host_time_us(), 157);
    // The host's own time between calls (its CPU work) moves its clock, not the GPU's.
    t.advance_host(100);
    t.enqueue(s, kernel(10), 2);
    t.synchronize(s);
    EXPECT_DOUBLE_EQ(t.host_time_us(), 257 + 2 + 11 + 3);
}

// A stream's next kernel cannot start before the host has enqueued it: a late launch leaves the GPU
// idle (the drain the review's L1 describes).
TEST(EmuTimeline, AKernelStartsNoEarlierThanItsLaunch) {
    emu::Timeline t(test::round_spec());
    const int s = t.add_stream(0);
    auto e = std::make_shared<emu::EventState>();
    t.enqueue(s, kernel(10), 2);   // [2, 13)
    t.advance_host(500);           // the host is busy elsewhere
    t.enqueue(s, record(e), 0);
    t.enqueue(s, kernel(10), 2);   // launched at 504: [504, 515)
    t.enqueue(s, record(e), 0);
    t.synchronize(s);
    EXPECT_DOUBLE_EQ(t.event_time_us(*e, 1), 502);  // the record waits for its own launch
    EXPECT_DOUBLE_EQ(t.event_time_us(*e, 2), 515);
}

// Host tasks of different streams share one callback lane: the second waits for the first.
TEST(EmuTimeline, HostTasksOfAllStreamsSerializeOnOneCallbackLane) {
    emu::Timeline t(test::round_spec());
    const int a = t.add_stream(0), b = t.add_stream(0);
    std::vector<int> order;
    t.enqueue(a, host_task(10, [&] { order.push_back(1); }), 2);  // ready 2: [2, 12)
    t.enqueue(b, host_task(10, [&] { order.push_back(2); }), 2);  // ready 4, lane busy: [12, 22)
    auto e = std::make_shared<emu::EventState>();
    t.enqueue(b, record(e), 0);
    t.synchronize_all();
    EXPECT_DOUBLE_EQ(t.event_time_us(*e, 1), 22);
    EXPECT_EQ(order, (std::vector<int>{1, 2}));
}

// Two kernels that each fill the GPU run at half speed together; two that fill 40% each do not
// slow each other down.
TEST(EmuTimeline, ConcurrentKernelsShareTheSms) {
    {
        emu::Timeline t(test::round_spec());
        const int a = t.add_stream(0), b = t.add_stream(0);
        auto ea = std::make_shared<emu::EventState>(), eb = std::make_shared<emu::EventState>();
        t.enqueue(a, kernel(100), 0);  // gap [0, 1), then work from 1
        t.enqueue(b, kernel(100), 0);
        t.enqueue(a, record(ea), 0);
        t.enqueue(b, record(eb), 0);
        t.synchronize_all();
        EXPECT_NEAR(t.event_time_us(*ea, 1), 201, 1e-6);
        EXPECT_NEAR(t.event_time_us(*eb, 1), 201, 1e-6);
    }
    {
        emu::Timeline t(test::round_spec());
        const int a = t.add_stream(0), b = t.add_stream(0);
        auto ea = std::make_shared<emu::EventState>(), eb = std::make_shared<emu::EventState>();
        t.enqueue(a, kernel(100, 0.4), 0);
        t.enqueue(b, kernel(100, 0.4), 0);
        t.enqueue(a, record(ea), 0);
        t.enqueue(b, record(eb), 0);
        t.synchronize_all();
        EXPECT_NEAR(t.event_time_us(*ea, 1), 101, 1e-6);
        EXPECT_NEAR(t.event_time_us(*eb, 1), 101, 1e-6);
    }
    {
        // A full kernel and a 40% one: the small one gets its 40% (max-min fair), the big one 60%
        // until the small one ends at 101; by then the big one has done 60 of its 100.
        emu::Timeline t(test::round_spec());
        const int a = t.add_stream(0), b = t.add_stream(0);
        auto ea = std::make_shared<emu::EventState>();
        t.enqueue(a, kernel(100, 1.0), 0);
        t.enqueue(b, kernel(100, 0.4), 0);
        t.enqueue(a, record(ea), 0);
        t.synchronize_all();
        EXPECT_NEAR(t.event_time_us(*ea, 1), 141, 1e-6);
    }
}

// A communication kernel holds its SM share while active: a full compute kernel next to a comm
// kernel holding 25% runs at 75% speed.
TEST(EmuTimeline, CommunicationTakesItsShareOfTheSms) {
    emu::Timeline t(test::round_spec());
    const int a = t.add_stream(0), c = t.add_stream(0);
    auto done = std::make_shared<emu::EventState>();
    Work comm;
    comm.kind = WorkKind::kComm;
    comm.name = "all_to_all";
    comm.demand = 0.25;
    comm.rendezvous = std::make_shared<emu::Rendezvous>(std::vector<double>{400});  // one member: alone
    t.enqueue(c, std::move(comm), 0);  // [0, 400)
    t.enqueue(a, kernel(75), 0);       // gap [0, 1), 75 us of work at 0.75: [1, 101)
    t.enqueue(a, record(done), 0);
    t.synchronize_all();
    EXPECT_NEAR(t.event_time_us(*done, 1), 101, 1e-6);
}

// High-priority kernels take the SMs first; the normal one waits for what is left.
TEST(EmuTimeline, HighPriorityStreamsGetTheSmsFirst) {
    emu::Timeline t(test::round_spec());
    const int low = t.add_stream(0), high = t.add_stream(1);
    auto el = std::make_shared<emu::EventState>(), eh = std::make_shared<emu::EventState>();
    t.enqueue(low, kernel(100), 0);
    t.enqueue(high, kernel(50), 0);
    t.enqueue(low, record(el), 0);
    t.enqueue(high, record(eh), 0);
    t.synchronize_all();
    EXPECT_NEAR(t.event_time_us(*eh, 1), 51, 1e-6);   // alone on the SMs
    EXPECT_NEAR(t.event_time_us(*el, 1), 151, 1e-6);  // starved during [1, 51)
}

// A wait on an event orders two streams: b's kernel starts when a's recorded point completes.
TEST(EmuTimeline, AnEventWaitOrdersStreams) {
    emu::Timeline t(test::round_spec());
    const int a = t.add_stream(0), b = t.add_stream(0);
    auto e = std::make_shared<emu::EventState>(), eb = std::make_shared<emu::EventState>();
    t.enqueue(a, kernel(100), 0);  // [0, 101)
    t.enqueue(a, record(e), 0);
    t.enqueue(b, wait(e), 0);
    t.enqueue(b, kernel(10), 0);   // [101, 112)
    t.enqueue(b, record(eb), 0);
    t.synchronize(e, 1);
    EXPECT_DOUBLE_EQ(t.host_time_us(), 101 + 3);  // the event sync returns at its completion
    t.synchronize(b);
    EXPECT_NEAR(t.event_time_us(*eb, 1), 112, 1e-6);
}

// An error thrown by an effect fails its stream: synchronize rethrows it once, later effects of
// that stream are skipped.
TEST(EmuTimeline, AFailingEffectFailsItsStream) {
    emu::Timeline t(test::round_spec());
    const int s = t.add_stream(0);
    bool later_ran = false;
    t.enqueue(s, host_task(1, [] { throw std::runtime_error("bad counts"); }), 0);
    t.enqueue(s, host_task(1, [&] { later_ran = true; }), 0);
    EXPECT_THROW(t.synchronize(s), std::runtime_error);
    EXPECT_FALSE(later_ran);
    EXPECT_NO_THROW(t.synchronize(s));
}

// A collective completes its duration after the last member arrives, on every member; each
// member's host blocks only in its own synchronize.
TEST(EmuTimeline, ACollectiveCompletesAfterItsLastMemberArrives) {
    auto meet = std::make_shared<emu::Rendezvous>(std::vector<double>{50, 70});
    double end[2] = {0, 0};
    auto rank = [&](int r, double compute_us) {
        emu::Timeline t(test::round_spec());
        const int s = t.add_stream(0);
        auto e = std::make_shared<emu::EventState>();
        t.enqueue(s, kernel(compute_us), 0);  // rank 0 arrives at 11, rank 1 at 301
        Work comm;
        comm.kind = WorkKind::kComm;
        comm.demand = 0.1;
        comm.rendezvous = meet;
        comm.member = r;
        t.enqueue(s, std::move(comm), 0);
        t.enqueue(s, record(e), 0);
        t.synchronize(s);
        end[r] = t.event_time_us(*e, 1);
    };
    std::thread r0(rank, 0, 10.0), r1(rank, 1, 300.0);
    r0.join();
    r1.join();
    EXPECT_NEAR(end[0], 301 + 50, 1e-6);
    EXPECT_NEAR(end[1], 301 + 70, 1e-6);
}

// ---- Residency (scmoe/kernels/emu/residency.h): Work that holds SMs becomes resident only where its
// blocks fit. round_spec with the per-SM limits of compute capability 9.0 (65,536 registers, 228 KB
// of shared memory, 1 KB reserved per block, 32 blocks, 2048 threads) on its 100 SMs.

emu::GpuSpec sm90_round_spec() {
    emu::GpuSpec s = test::round_spec();
    s.compute_capability = 90;
    s.registers_per_sm = 65536;
    s.shared_bytes_per_sm = 228 * 1024;
    s.shared_bytes_reserved_per_block = 1024;
    s.blocks_per_sm = 32;
    s.threads_per_sm = 2048;
    return s;
}

// CUTLASS's sm_90 grouped GEMM block (review 2: 384 threads x 168 registers, 215,040 B forward,
// 232,448 B weight gradient) and the emulated NCCL channel block (scmoe/comm/emu_communicator.cpp).
const emu::BlockResources kGemmForwardBlock{384, 168, 215040}, kGemmWgradBlock{384, 168, 232448};
const emu::BlockResources kNcclBlock{512, 32, 0};

// A persistent kernel on `sms` SMs (of 100) taking `us` alone on them, after its 1 us gap.
Work persistent(double us, int sms, emu::BlockResources block = kGemmForwardBlock) {
    Work w = kernel(us, sms / 100.0);
    w.name = "persistent";
    w.resident_sms = sms;
    w.block = block;
    return w;
}

// A collective alone in its rendezvous, holding `sms` SMs for `us`.
Work channels(double us, int sms) {
    Work w;
    w.kind = WorkKind::kComm;
    w.name = "all_to_all";
    w.demand = sms / 100.0;
    w.resident_sms = sms;
    w.block = kNcclBlock;
    w.rendezvous = std::make_shared<emu::Rendezvous>(std::vector<double>{us});
    return w;
}

// Review 2 #6's arithmetic: beside the forward/dgrad block (64,512 registers, 216,064 B with the
// reservation) one warp of 32 registers per thread still fits and an NCCL block does not; beside the
// weight-gradient block (233,472 B: all 228 KB) not even a one-thread block without shared memory.
TEST(EmuResidency, ABlockFitsBesideAnotherOnlyWhereTheSmsResourcesLast) {
    const emu::GpuSpec h100 = emu::builtin_gpu_spec("h100");
    EXPECT_EQ(h100.registers_per_sm, 65536);
    EXPECT_EQ(h100.shared_bytes_per_sm, 228 * 1024);
    EXPECT_TRUE(emu::fits_beside(h100, kGemmForwardBlock, {32, 32, 0}));
    EXPECT_FALSE(emu::fits_beside(h100, kGemmForwardBlock, {64, 32, 0})) << "2,048 registers: more than are left";
    EXPECT_FALSE(emu::fits_beside(h100, kGemmForwardBlock, kNcclBlock));
    EXPECT_FALSE(emu::fits_beside(h100, kGemmWgradBlock, {1, 1, 0})) << "the 1 KB reservation does not fit";
    EXPECT_FALSE(emu::fits_beside(h100, kGemmForwardBlock, kGemmForwardBlock));
    EXPECT_TRUE(emu::fits_beside(h100, kNcclBlock, kNcclBlock));
    EXPECT_TRUE(emu::fits_beside(h100, kGemmForwardBlock, {})) << "a block of unknown size limits nothing";
    EXPECT_TRUE(emu::fits_beside(test::round_spec(), kGemmForwardBlock, kNcclBlock))
        << "a spec without per-SM limits (a CPU profile) limits nothing";
    // A800's 164 KB: the same forward block leaves 1 KB of shared memory besides its own reservation.
    const emu::GpuSpec a800 = emu::builtin_gpu_spec("a800");
    EXPECT_EQ(a800.shared_bytes_per_sm, 164 * 1024);
    EXPECT_FALSE(emu::fits_beside(a800, kGemmForwardBlock, kGemmForwardBlock));
}

// The review's finding, modeled: a comm kernel that arrives while a persistent kernel holds every SM
// gets none until that kernel ends; limited to SMs - R, the kernel leaves it R SMs at once.
TEST(EmuResidency, ACommKernelWaitsForAPersistentKernelOnEverySmButNotForOneOnSmsMinusR) {
    for (const int grid : {100, 80}) {
        emu::Timeline t(sm90_round_spec());
        const int compute = t.add_stream(0), comm = t.add_stream(1);
        auto k = std::make_shared<emu::EventState>(), c = std::make_shared<emu::EventState>();
        t.enqueue(compute, persistent(100, grid), 0);  // gap [0, 1), resident [1, 101)
        t.enqueue(compute, record(k), 0);
        t.advance_host(10);
        t.enqueue(comm, channels(50, 20), 0);  // arrives at 10
        t.enqueue(comm, record(c), 0);
        t.synchronize_all();
        EXPECT_NEAR(t.event_time_us(*k, 1), 101, 1e-6) << "grid " << grid;
        const emu::TimelineStats st = t.stats();
        EXPECT_EQ(st.late_starts, 0u);
        if (grid == 100) {
            EXPECT_NEAR(t.event_time_us(*c, 1), 101 + 50, 1e-6) << "the comm kernel became resident before the end";
            EXPECT_EQ(st.residency_waits, 1u);
            EXPECT_NEAR(st.residency_wait_us, 91, 1e-6);
        } else {
            EXPECT_NEAR(t.event_time_us(*c, 1), 10 + 50, 1e-6) << "80 + 20 SMs fit: it runs beside the kernel";
            EXPECT_EQ(st.residency_waits, 0u);
        }
    }
}

// The converse: a persistent kernel whose grid does not fit beside a resident comm kernel waits for
// it (all of its blocks resident or none: with a static tile schedule its late blocks would end
// that much later anyway); limited to the SMs left, it runs at once. Ordinary kernels are not held
// back by comm kernels (their blocks retire as they finish: processor sharing).
TEST(EmuResidency, APersistentKernelWaitsForTheSmsACommKernelHolds) {
    for (const int grid : {100, 80}) {
        emu::Timeline t(sm90_round_spec());
        const int compute = t.add_stream(0), comm = t.add_stream(1);
        auto k = std::make_shared<emu::EventState>();
        t.enqueue(comm, channels(50, 20), 0);           // resident [0, 50)
        t.enqueue(compute, persistent(100, grid), 0);   // gap [0, 1)
        t.enqueue(compute, record(k), 0);
        t.synchronize_all();
        EXPECT_NEAR(t.event_time_us(*k, 1), grid == 100 ? 50 + 100 : 1 + 100, 1e-6) << "grid " << grid;
    }
}

// Ordinary kernels share what the holders leave: beside a persistent kernel on 80 SMs a full one
// runs at 20%; beside one on every SM it runs only after it.
TEST(EmuResidency, OrdinaryKernelsShareTheSmsThatHoldersLeave) {
    for (const int grid : {80, 100}) {
        emu::Timeline t(sm90_round_spec());
        const int a = t.add_stream(0), b = t.add_stream(1);
        auto e = std::make_shared<emu::EventState>();
        t.enqueue(a, persistent(100, grid), 0);  // resident [1, 101)
        t.enqueue(b, kernel(20), 0);             // gap [0, 1), high priority: no help against held SMs
        t.enqueue(b, record(e), 0);
        t.synchronize_all();
        EXPECT_NEAR(t.event_time_us(*e, 1), grid == 80 ? 1 + 20 / 0.2 : 101 + 20, 1e-6) << "grid " << grid;
    }
}

// Where a comm kernel and a persistent kernel wait for the same SMs, the higher-priority stream's
// is served first when they free (cudaStreamCreateWithPriority).
TEST(EmuResidency, TheHigherPriorityStreamGetsFreedSmsFirst) {
    emu::Timeline t(sm90_round_spec());
    const int first = t.add_stream(0), second = t.add_stream(0), comm = t.add_stream(1);
    auto k2 = std::make_shared<emu::EventState>(), c = std::make_shared<emu::EventState>();
    t.enqueue(first, persistent(100, 100), 0);   // resident [1, 101)
    t.enqueue(second, persistent(100, 100), 0);  // waits from 1
    t.enqueue(second, record(k2), 0);
    t.advance_host(10);
    t.enqueue(comm, channels(50, 20), 0);  // waits from 10
    t.enqueue(comm, record(c), 0);
    t.synchronize_all();
    EXPECT_NEAR(t.event_time_us(*c, 1), 101 + 50, 1e-6);
    EXPECT_NEAR(t.event_time_us(*k2, 1), 151 + 100, 1e-6);
    EXPECT_EQ(t.stats().residency_waits, 2u);
}

// Hosts that meet (a blocking count exchange) leave at the last arrival plus the latency.
TEST(EmuTimeline, HostsLeaveAMeetingAfterTheLastArrives) {
    emu::HostMeeting meeting(2, 5);
    double after[2] = {0, 0};
    auto rank = [&](int r, double busy) {
        emu::Timeline t(test::round_spec());
        t.advance_host(busy);
        t.meet(meeting);
        after[r] = t.host_time_us();
    };
    std::thread r0(rank, 0, 10.0), r1(rank, 1, 200.0);
    r0.join();
    r1.join();
    EXPECT_DOUBLE_EQ(after[0], 205);
    EXPECT_DOUBLE_EQ(after[1], 205);
}

}  // namespace
}  // namespace scmoe
