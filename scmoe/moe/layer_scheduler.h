// LayerScheduler: runs one pass (a forward or a backward) of backbone work and MoE branches so
// that each branch's all-to-all hides under backbone compute — the ScMoE overlap.
//
// A pass is a SchedulePlan: the backbone's segments in program order, and MoE branches. Each
// branch is split-phase, as in DeepEP / NCCL EP:
//   pre      compute that starts the branch (norm of the shortcut, gate, layout, permute; on the
//            backward: combine-backward)                                    -> MoE stream
//   send     the first all-to-all (dispatch; backward: collect-backward)    -> MoE stream
//   expert   the expert FFN (or its backward)                               -> backbone stream, at slot K
//   receive  the second all-to-all (collect; backward: dispatch-backward)   -> MoE stream
//   post     compute that finishes the branch (combine; backward: permute/router backward)
//                                                                           -> MoE stream
//   consume  where the backbone takes the branch's result (adds it)          -> backbone stream
// A branch's input exists before backbone segment `ready`; its result is consumed before segment
// `join` (ready <= join <= number of segments; join == size means after the last segment). The
// expert FFN runs on the backbone stream before segment K, ready <= K <= join: the slot.
//
// Slot choice (paper Eq. 11): from op times measured in calibrate(), K minimises
//   | sum of segment times in [ready, K) - (pre + send) | + | sum in [K, join) - (receive + post) |.
// With a Communicator, every rank uses the times averaged over the group, so all ranks choose the
// same slots and issue their collectives in the same order.
//
// Chunked pipeline (Tutel-style), for branches whose all-to-alls do not fit their window: send,
// expert and receive run as C pieces — every send piece on the MoE stream, expert piece c on the
// backbone stream (from the slot on) once send piece c is done, receive piece c on the MoE stream
// once expert piece c is done — so piece c's FFN hides piece c+1's send and piece c-1's receive.
// The degree C is chosen like the slot, from the calibrated times (choose_chunks): a model of the
// two streams' timeline from ready to join (pre, C sends back to back; the backbone's window
// segments and C expert pieces, each waiting for its send; C receives, each waiting for its expert
// piece; post) gives the branch's time for every (K, C); C = 1 keeps the Eq. 11 slot, and C > 1 is
// taken only when it beats C = 1 by kMinChunkGain of that time. Piece times come from calibrating
// both C = 1 and C = max_chunks (which includes the per-piece costs: latency, pack and unpack),
// interpolated linearly in between.
//
// Overlap off runs the same ops in the same order on the backbone stream alone. Every op writes
// its own buffers and every accumulation happens on the backbone stream in program order, so
// results are bitwise identical with overlap on and off.
//
// SMs for the exchange (review 2, #6): a persistent compute kernel (CUTLASS's sm_90 grouped GEMM)
// holds every SM of its grid until it ends, and no NCCL block fits beside it, so an exchange meant
// to overlap it would wait for it. While a branch's exchange may run beside the backbone (overlap
// on, a branch with an all-to-all: its backbone ops from `ready` up to its consume, except an
// unchunked branch's own expert FFN, which its exchanges only precede or follow), run() sets the
// backbone stream's SM budget (Stream::set_sm_budget) to SMs - R, R = comm_sms(); every other
// backbone op, and the stream after run(), gets 0 (every SM). Each op's budget is set as it is
// issued, whatever the host issue order. The budget changes no result, only the SMs ops may take.
// Calibration times the ops without it.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "scmoe/kernels/device.h"

namespace scmoe {

class Communicator;
class Tracer;

// Stream-ordered work: enqueues on the stream it is given and returns.
struct ScheduleOp {
    std::string name;
    std::function<void(Stream&)> run;  // empty = nothing to do
    bool comm = false;                 // an all-to-all (for timing summaries)
};

// A stage that runs in pieces: run(chunk, chunks, stream) enqueues piece `chunk` of `chunks`.
struct ChunkedOp {
    std::string name;
    std::function<void(int chunk, int chunks, Stream&)> run;
    bool comm = false;
};

struct BranchPlan {
    std::string name;
    int ready = 0, join = 0;
    ScheduleOp pre, send, expert, receive, post, consume;
    // The chunked pipeline: with max_chunks > 1, the schedule may run send_chunks, expert_chunks
    // and receive_chunks in 2..max_chunks pieces instead of send, expert and receive (which a
    // 1-piece run equals). max_chunks must be the same on every rank.
    int max_chunks = 1;
    ChunkedOp send_chunks, expert_chunks, receive_chunks;
};

struct SchedulePlan {
    std::string name;  // "forward", "backward"
    std::vector<ScheduleOp> segments;
    std::vector<BranchPlan> branches;  // in program order; at equal indices earlier branches go first
    // Throws naming the branch when an index is out of range.
    void validate() const;
};

// Measured times (ms) of one plan's ops and the slots chosen from them.
struct Schedule {
    std::vector<double> segment_ms;
    struct Branch {
        double pre_ms = 0, send_ms = 0, expert_ms = 0, receive_ms = 0, post_ms = 0, consume_ms = 0;
        int slot = 0;
        double before_ms = 0, after_ms = 0;  // backbone time between ready and the slot, slot and join
        // Chunked pipeline: the pieces run (1 = off), the plan's bound, the sums over max_chunks
        // pieces as calibrated, and the modelled branch time (ready to join) at the chosen slot and
        // chunks and unchunked at the Eq. 11 slot (0 until choose_chunks).
        int chunks = 1, max_chunks = 1;
        bool forced_chunks = false;
        double chunked_send_ms = 0, chunked_expert_ms = 0, chunked_receive_ms = 0;
        double modelled_ms = 0, modelled_unchunked_ms = 0;
    };
    std::vector<Branch> branches;
    // Serial time of the pass: every op one after the other.
    double serial_ms() const;
    // All-to-all time of the pass (send + receive of every branch).
    double comm_ms() const;
    // "forward moe1: ready 1 join 4 slot K=3 (backbone 1.20 ms before vs pre+send 1.10 ms; ...);
    //  chunks 1 of 2 (auto: modelled ...)", one line per branch.
    std::string describe(const SchedulePlan& plan) const;
};

// Chooses each branch's slot from the times in `schedule` (Eq. 11); ties go to the earlier slot.
void choose_slots(const SchedulePlan& plan, Schedule& schedule);

// The smallest relative gain of the modelled branch time for which choose_chunks pipelines.
inline constexpr double kMinChunkGain = 0.10;

// The modelled time (ms) from a branch's ready point to its join with the expert FFN at `slot` in
// `chunks` pieces (see the chunked pipeline above); piece times from `branch`'s calibrated times.
double model_branch_ms(const SchedulePlan& plan, const Schedule& schedule, std::size_t branch, int slot, int chunks);

// Chooses each branch's chunks (and, when > 1, its slot) after choose_slots. forced_chunks: 0 =
// auto; N >= 1 = N pieces, capped at the branch's max_chunks (a branch that cannot be chunked runs
// whole). Throws for a negative count.
void choose_chunks(const SchedulePlan& plan, Schedule& schedule, int forced_chunks = 0);

// The order in which LayerScheduler::run issues a pass's ops from the host. An all-to-all that
// blocks the host until its stream has run (NcclCommunicator, the emulated GPU) leaves the backbone
// stream idle if the backbone's next segments are not enqueued yet (review L1).
enum class IssueOrder {
    kBackboneAhead,  // default: program order, except that before each exchange the backbone's ops
                     // are issued as far ahead as their event waits allow
    kProgram,        // the plan's program order, one op after the other (before the L1 fix; kept to
                     // measure the drain it causes: scmoe-bench block --issue-order program)
};
const char* issue_order_name(IssueOrder order);  // "ahead", "program"
IssueOrder parse_issue_order(const std::string& name);  // throws naming the choices

class LayerScheduler {
public:
    // backbone, moe: the two streams (distinct). agree: when set, calibrate() averages the measured
    // times over its group (a collective: call calibrate on every rank of it).
    LayerScheduler(Device& device, Stream& backbone, Stream& moe, Communicator* agree = nullptr);
    ~LayerScheduler();

    Stream& backbone() { return backbone_; }
    Stream& moe() { return moe_; }
    void set_issue_order(IssueOrder order) { issue_order_ = order; }
    IssueOrder issue_order() const { return issue_order_; }
    // R: the SMs the backbone's ops leave free while an exchange overlaps them (see above); 0 = none.
    // Default: default_comm_sms(agree) (scmoe/comm/comm_sms.h: SCMOE_COMM_SMS, the communicator's own count,
    // NCCL's channel settings, else NCCL's default 32). Throws for a negative count.
    void set_comm_sms(int sms);
    int comm_sms() const { return comm_sms_; }
    // The backbone's SM budget while an exchange overlaps it: device SMs - comm_sms() (at least 1);
    // 0 (every SM) when comm_sms() is 0 or the device has no SMs (CPU).
    int overlapped_sm_budget() const;

    // Runs the plan `repeats` times serially with a synchronize after every op (chunkable branches
    // also as max_chunks pieces), keeps each op's fastest time, averages over `agree`, and chooses
    // the slots and chunks (forced_chunks as in choose_chunks). Synchronizes both streams.
    Schedule calibrate(const SchedulePlan& plan, int repeats = 2, int forced_chunks = 0);

    // Called while run() enqueues a pass, once per index i = 0..segments in order, after the
    // branches' consumes and expert slots at i and before segment i: work the hook enqueues on
    // `backbone` there sees every op the plan orders before index i (on either stream), overlap
    // on or off. (The gradient all-reduce of a block starts from here once its gradients are final.)
    using IndexHook = std::function<void(int index, Stream& backbone)>;

    // Enqueues one pass. overlap: branches on the MoE stream with events (true) or everything on
    // the backbone stream in the same order (false). trace: optional timeline of every op.
    // Returns after enqueueing; the backbone stream's later work sees every result.
    void run(const SchedulePlan& plan, const Schedule& schedule, bool overlap, Tracer* trace = nullptr,
             const IndexHook& at_index = {});

private:
    Event& event(std::size_t i);

    Device& device_;
    Stream& backbone_;
    Stream& moe_;
    Communicator* agree_;
    std::vector<std::unique_ptr<Event>> events_;
    void* agree_buffer_ = nullptr;  // device memory for averaging the times
    std::size_t agree_capacity_ = 0;
    IssueOrder issue_order_ = IssueOrder::kBackboneAhead;
    int comm_sms_ = 0;
};

}  // namespace scmoe
