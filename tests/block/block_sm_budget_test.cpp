// SMs for the exchange (LayerScheduler, review 2 #6): while an exchange may run beside the backbone,
// the backbone's ops are issued with the stream's SM budget at SMs - R, so a persistent kernel among
// them (the grouped GEMM: GroupedGemmArgs::sm_limit) leaves the exchange R SMs; every other op, and
// the stream after the pass, gets every SM. The ops here enqueue nothing: each records, when it is
// issued, the budget of its stream and the sm_limit a grouped GEMM enqueued there would get.
#include <gtest/gtest.h>

#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "scmoe/comm/comm_sms.h"
#include "scmoe/kernels/device.h"
#include "scmoe/kernels/error.h"
#include "scmoe/kernels/grouped_gemm.h"
#include "scmoe/moe/layer_scheduler.h"

namespace scmoe {
namespace {

struct Issued {
    int budget = -1;    // Stream::sm_budget() when the op was issued
    int gemm_limit = -1;  // grouped_gemm_sm_limit of a grouped GEMM enqueued there then
    bool on_backbone = false;
};

struct Probe {
    Stream* backbone = nullptr;
    std::map<std::string, Issued> issued;
    ScheduleOp op(const std::string& name, bool comm = false) {
        return {name, [this, name](Stream& s) { note(name, s); }, comm};
    }
    ChunkedOp chunked(const std::string& name, bool comm = false) {
        return {name,
                [this, name](int c, int, Stream& s) {
                    std::ostringstream piece;
                    piece << name << '#' << c;
                    note(piece.str(), s);
                },
                comm};
    }
    void note(const std::string& name, Stream& s) {
        issued[name] = {s.sm_budget(), grouped_gemm_sm_limit(GroupedGemmArgs{}, s), &s == backbone};
    }
};

// Segments s0..s5; a branch "moe" ready at 1 and joined at 5, whose send and receive are all-to-alls
// (`exchanges`), chunkable in `chunks` pieces (its slot is the Schedule's).
SchedulePlan plan_of(Probe& p, int chunks, bool exchanges = true) {
    SchedulePlan plan;
    plan.name = "forward";
    for (const char* name : {"s0", "s1", "s2", "s3", "s4", "s5"}) plan.segments.push_back(p.op(name));
    BranchPlan b;
    b.name = "moe";
    b.ready = 1;
    b.join = 5;
    b.pre = p.op("pre");
    b.send = p.op("send", exchanges);
    b.expert = p.op("expert");
    b.receive = p.op("receive", exchanges);
    b.post = p.op("post");
    b.consume = p.op("consume");
    if (chunks > 1) {
        b.max_chunks = chunks;
        b.send_chunks = p.chunked("send", exchanges);
        b.expert_chunks = p.chunked("expert");
        b.receive_chunks = p.chunked("receive", exchanges);
    }
    plan.branches.push_back(b);
    return plan;
}

Schedule schedule_of(const SchedulePlan& plan, std::vector<int> slots, std::vector<int> chunks) {
    Schedule s;
    s.segment_ms.assign(plan.segments.size(), 1.0);
    for (std::size_t b = 0; b < plan.branches.size(); ++b) {
        Schedule::Branch br;
        br.slot = slots[b];
        br.chunks = chunks[b];
        br.max_chunks = plan.branches[b].max_chunks;
        s.branches.push_back(br);
    }
    return s;
}

struct Fixture {
    std::unique_ptr<Device> device;
    std::unique_ptr<Stream> backbone, moe;
    std::unique_ptr<LayerScheduler> scheduler;
    Probe probe;
    explicit Fixture(const std::string& backend = "emu") {
        device = backend == "emu" ? make_device("emu", 0, "h100") : make_device(backend);
        backbone = device->create_stream();
        moe = device->create_stream(StreamPriority::kHigh);
        scheduler = std::make_unique<LayerScheduler>(*device, *backbone, *moe);
        scheduler->set_comm_sms(32);
        probe.backbone = backbone.get();
    }
    void run(const SchedulePlan& plan, const Schedule& s, bool overlap = true) {
        scheduler->run(plan, s, overlap);
        backbone->synchronize();
        moe->synchronize();
    }
    // The budget each op was issued with, "-" where it ran on the MoE stream.
    std::string budgets(const std::vector<std::string>& names) {
        std::ostringstream out;
        for (const std::string& n : names) {
            out << n << '=';
            auto it = probe.issued.find(n);
            if (it == probe.issued.end())
                out << '?';
            else if (it->second.on_backbone)
                out << it->second.budget;
            else
                out << '-';
            out << ' ';
        }
        return out.str();
    }
};

const std::vector<std::string> kWhole = {"s0", "s1", "s2", "expert", "s3", "s4", "consume", "s5"};

// On an emulated H100 (132 SMs) with R = 32: the window's segments get 100 SMs, and so does a grouped
// GEMM enqueued there; the unchunked expert FFN (its exchanges only precede or follow it), the
// consume and everything outside the window every SM; so does the stream after the pass. Both host
// issue orders set the same budgets (the budget is set per op as it is issued).
TEST(LayerSchedulerSmBudget, TheWindowRunsOnSmsMinusRAndTheRestOnEverySm) {
    for (IssueOrder order : {IssueOrder::kBackboneAhead, IssueOrder::kProgram}) {
        Fixture f;
        EXPECT_EQ(f.scheduler->overlapped_sm_budget(), 100);
        f.scheduler->set_issue_order(order);
        const SchedulePlan plan = plan_of(f.probe, 1);
        f.run(plan, schedule_of(plan, {3}, {1}));
        EXPECT_EQ(f.budgets(kWhole), "s0=0 s1=100 s2=100 expert=0 s3=100 s4=100 consume=0 s5=0 ")
            << issue_order_name(order);
        EXPECT_EQ(f.budgets({"pre", "send", "receive", "post"}), "pre=- send=- receive=- post=- ");
        EXPECT_EQ(f.probe.issued["s1"].gemm_limit, 100) << "a grouped GEMM in the window gets sm_limit = SMs - R";
        EXPECT_EQ(f.probe.issued["s4"].gemm_limit, 100);
        EXPECT_EQ(f.probe.issued["expert"].gemm_limit, 0);
        EXPECT_EQ(f.probe.issued["s0"].gemm_limit, 0);
        EXPECT_EQ(f.probe.issued["s5"].gemm_limit, 0);
        EXPECT_EQ(f.backbone->sm_budget(), 0) << "the budget is cleared after the pass";
        EXPECT_EQ(f.moe->sm_budget(), 0) << "the exchanges' stream is never limited";
    }
}

// Chunked: every expert piece runs beside another piece's send or receive, so each gets SMs - R.
TEST(LayerSchedulerSmBudget, ChunkedExpertPiecesRunOnSmsMinusR) {
    Fixture f;
    const SchedulePlan plan = plan_of(f.probe, 2);
    f.run(plan, schedule_of(plan, {3}, {2}));
    EXPECT_EQ(f.budgets({"s0", "s1", "s2", "expert#0", "expert#1", "s3", "s4", "consume", "s5"}),
              "s0=0 s1=100 s2=100 expert#0=100 expert#1=100 s3=100 s4=100 consume=0 s5=0 ");
    EXPECT_EQ(f.probe.issued["expert#0"].gemm_limit, 100);
    EXPECT_EQ(f.backbone->sm_budget(), 0);
}

// Nothing to leave room for: overlap off (one stream), a branch without an all-to-all (one rank),
// R = 0 (SCMOE_COMM_SMS=0), or the CPU backend (no SMs): every op gets every SM.
TEST(LayerSchedulerSmBudget, EverySmWhereNoExchangeRunsBesideTheBackbone) {
    const std::string all_zero = "s0=0 s1=0 s2=0 expert=0 s3=0 s4=0 consume=0 s5=0 ";
    {
        Fixture f;
        const SchedulePlan plan = plan_of(f.probe, 1);
        f.run(plan, schedule_of(plan, {3}, {1}), /*overlap=*/false);
        EXPECT_EQ(f.budgets(kWhole), all_zero) << "overlap off";
    }
    {
        Fixture f;
        const SchedulePlan plan = plan_of(f.probe, 1, /*exchanges=*/false);
        f.run(plan, schedule_of(plan, {3}, {1}));
        EXPECT_EQ(f.budgets(kWhole), all_zero) << "no all-to-all";
    }
    {
        Fixture f;
        f.scheduler->set_comm_sms(0);
        EXPECT_EQ(f.scheduler->overlapped_sm_budget(), 0);
        const SchedulePlan plan = plan_of(f.probe, 1);
        f.run(plan, schedule_of(plan, {3}, {1}));
        EXPECT_EQ(f.budgets(kWhole), all_zero) << "R = 0";
    }
    {
        Fixture f("cpu");
        EXPECT_EQ(f.scheduler->overlapped_sm_budget(), 0);
        const SchedulePlan plan = plan_of(f.probe, 1);
        f.run(plan, schedule_of(plan, {3}, {1}));
        EXPECT_EQ(f.budgets(kWhole), all_zero) << "CPU";
    }
    Fixture f;
    EXPECT_THROW(f.scheduler->set_comm_sms(-1), Error);
}

// A branch's unchunked expert FFN inside another branch's window runs beside that branch's
// exchange: it gets SMs - R.
TEST(LayerSchedulerSmBudget, AnExpertInsideAnotherBranchsWindowRunsOnSmsMinusR) {
    Fixture f;
    SchedulePlan plan = plan_of(f.probe, 1);
    BranchPlan second;
    second.name = "moe2";
    second.ready = second.join = 4;  // no window of its own
    second.send = f.probe.op("send2", true);
    second.expert = f.probe.op("expert2");
    second.receive = f.probe.op("receive2", true);
    plan.branches.push_back(second);
    f.run(plan, schedule_of(plan, {3, 4}, {1, 1}));
    EXPECT_EQ(f.budgets({"expert", "expert2", "s5"}), "expert=0 expert2=100 s5=0 ");
}

// The stream gets every SM back also when an op of the pass throws.
TEST(LayerSchedulerSmBudget, TheBudgetIsClearedWhenAnOpThrows) {
    Fixture f;
    SchedulePlan plan = plan_of(f.probe, 1);
    plan.segments[2].run = [](Stream&) { throw std::runtime_error("segment 2 failed"); };
    EXPECT_THROW(f.scheduler->run(plan, schedule_of(plan, {3}, {1}), true), std::runtime_error);
    EXPECT_EQ(f.backbone->sm_budget(), 0);
    f.backbone->synchronize();
    f.moe->synchronize();
}

// R's default: scmoe/comm/comm_sms.h's, from the scheduler's communicator (none here).
TEST(LayerSchedulerSmBudget, RDefaultsToDefaultCommSms) {
    auto device = make_device("emu", 0, "h100");
    auto a = device->create_stream(), b = device->create_stream();
    LayerScheduler s(*device, *a, *b);
    EXPECT_EQ(s.comm_sms(), default_comm_sms(nullptr).sms);
}

}  // namespace
}  // namespace scmoe
