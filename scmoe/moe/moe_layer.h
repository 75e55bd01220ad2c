// MoeLayer: one mixture-of-experts layer, forward and backward, split into the stages the layer
// scheduler interleaves with backbone compute. Single-rank, or expert-parallel over an `ep`
// Communicator: the E experts are split evenly over the ep ranks (rank r owns experts
// [r*E/ep, (r+1)*E/ep)), tokens travel to their experts by all-to-all and come back.
//
//   y = sum_j G(s)_j * E_j(s)                     routed experts on the shortcut s (s = x when absent)
//     + [sigmoid(w_cg . x) *] SE(x)               shared expert on x (optional, CG-1 optional)
//
// Forward stages, in order:  route(s) -> permute() -> dispatch() -> experts() -> collect()
//                            -> combine(y) ; shared_expert(x, y)
// Backward stages, in order: combine_backward(dy) -> collect_backward() -> experts_backward()
//                            -> dispatch_backward() -> permute_backward() -> route_backward() ;
//                            shared_expert_backward(dy)
// dispatch/collect (and their backward) are the all-to-all exchanges; with no ep communicator (or
// ep size 1) they do nothing. With expert parallelism, dispatch -> experts -> collect (and the
// backward's collect_backward -> experts_backward -> dispatch_backward) can also run in chunks, so
// one chunk's all-to-all overlaps another chunk's expert FFN (see "chunked pipeline" below). Routing, capacity, drops and the router losses are per rank: an
// expert-parallel layer computes exactly what the single-rank layer computes on each rank's tokens,
// with each expert's weight gradient summed over every rank's tokens.
// Every stage is stream-ordered on the stream passed last; stages of one pass may run on
// different streams if the caller orders them with events. The layer keeps the activations
// backward needs in its workspace and keeps pointers to x and s: they must stay valid and
// unchanged until backward has been enqueued. One forward/backward in flight per layer object.
//
// Memory: the workspace is sized once for max_tokens (workspace_bytes) and allocated at
// construction (or supplied by the caller); forward and backward allocate nothing.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "scmoe/kernels/device.h"
#include "scmoe/kernels/grouped_gemm.h"
#include "scmoe/kernels/tensor.h"
#include "scmoe/moe/config.h"
#include "scmoe/moe/params.h"

namespace scmoe {

struct MoeStats {
    std::int64_t tokens = 0;
    std::int64_t capacity = 0;                // rows per expert in capacity mode, 0 dropless
    std::int64_t dropped_tokens = 0;          // token-to-expert assignments dropped for capacity
    float aux_loss = 0.0f;                    // load-balancing loss (before aux_loss_coef)
    float z_loss = 0.0f;                      // router z-loss (before z_loss_coef)
    std::vector<std::int32_t> expert_counts;  // assignments routed to each expert, before capacity
};

// Where every assignment of the last forward went (host copies), for inspection and tests.
struct MoeRouting {
    std::vector<std::int32_t> expert_index;    // [tokens * top_k]
    std::vector<float> gate_weight;            // [tokens * top_k]
    std::vector<std::int32_t> slot_of_choice;  // [tokens * top_k] row in the permuted buffer, -1 dropped
    std::vector<std::int32_t> group_offsets;   // [experts + 1]
};

// The rows this rank's experts received in the last forward (host copies, f32; bf16 widened), for
// inspection and tests: rows[e] holds local expert e's rows in use, row-major [rows_e, hidden], in
// the order the grouped GEMM sees them (source rank, then that source's row order).
struct MoeExpertInputs {
    std::vector<std::vector<float>> rows;  // [num_local_experts]
};

// The most pieces the chunked pipeline cuts a single local expert's rows into (MoeLayer, "chunked
// pipeline"): Tutel's a2a_ffn_overlap_degree up to 4.
inline constexpr int kMaxRowPieces = 4;
// Whether an MoE layer of `experts` on `ep` ranks pipelines slices of its one local expert's rows
// (expert parallelism with one expert per rank) rather than groups of its local experts.
constexpr bool pipelines_row_slices(std::int64_t experts, int ep) { return ep > 1 && experts / ep == 1; }
// The most pieces such a layer's chunked pipeline can be given: kMaxRowPieces slices of the one local
// expert's rows, else its local experts (on one rank nothing is exchanged, and MoeLayer runs it whole).
constexpr int max_pipeline_pieces(std::int64_t experts, int ep) {
    return pipelines_row_slices(experts, ep) ? kMaxRowPieces : static_cast<int>(experts / ep);
}

class Communicator;
class NonfiniteChecks;

class MoeLayer {
public:
    // max_tokens: the most tokens one forward on this rank may carry.
    // ep: the expert-parallel group (nullptr = single rank); it must outlive the layer. At
    //   construction every rank of the group checks that all hold the same config (a collective:
    //   construct the layer on every rank), and num_experts % ep size == 0.
    // workspace: device memory of at least workspace_bytes(config, max_tokens, ep size, scratch !=
    //   nullptr) bytes; nullptr = allocate it once here.
    // scratch: device memory of at least scratch_bytes(config, max_tokens, ep size) bytes shared with
    //   other layers of the same config and max_tokens (nullptr = the layer's own, in its
    //   workspace). It holds what is dead between the layer's passes: the backward's gradient
    //   buffers and the exchanges' staging. Layers may share one scratch only if no two of them ever
    //   run a pass (or stages of one) concurrently on different streams; BlockStack shares it
    //   between MoE blocks whose branch windows are disjoint.
    MoeLayer(const MoeConfig& config, Device& device, std::int64_t max_tokens, Communicator* ep = nullptr,
             void* workspace = nullptr, std::size_t workspace_size = 0, void* scratch = nullptr,
             std::size_t scratch_size = 0);
    ~MoeLayer();
    MoeLayer(const MoeLayer&) = delete;
    MoeLayer& operator=(const MoeLayer&) = delete;

    // Dropless expert parallelism sizes the expert-side buffers for the worst case (every rank
    // sends all its tokens to this rank's experts): ep_size * max_tokens * top_k rows, bounded by
    // the receive limit (MoeConfig.recv_limit_factor). shared_scratch: without the scratch part.
    static std::size_t workspace_bytes(const MoeConfig& config, std::int64_t max_tokens, int ep_size = 1,
                                       bool shared_scratch = false);
    // The part of the workspace that layers may share (see the constructor's `scratch`).
    static std::size_t scratch_bytes(const MoeConfig& config, std::int64_t max_tokens, int ep_size = 1);

    const MoeConfig& config() const { return config_; }
    std::int64_t max_tokens() const { return max_tokens_; }
    int ep_size() const { return ep_size_; }
    int ep_rank() const { return ep_rank_; }
    int num_local_experts() const { return config_.num_experts / ep_size_; }
    // Default: kAuto, or the provider named by the environment variable SCMOE_GROUPED_GEMM_PROVIDER.
    void set_grouped_gemm_provider(GroupedGemmProvider p) { provider_ = p; }
    GroupedGemmProvider grouped_gemm_provider() const { return provider_; }
    // Training mode adds gate noise (noise_std > 0); eval mode does not. Default: training.
    void set_training(bool training) { training_ = training; }
    // Gradient accumulation over micro-batches. Off (default): backward writes the parameter
    // gradients (MoeGrads). On: it adds into them, every stage that produces one (the experts',
    // gate's, shared expert's and CG-1 gate's), so a trainer zeroes the gradients once, runs
    // forward + backward per micro-batch, then steps. Input gradients (grad_x, grad_shortcut) are
    // per pass and always written. In dropless mode (and without the router losses, whose terms
    // are per batch) two accumulated micro-batches give the gradients of one batch holding both.
    void set_grad_accumulation(bool accumulate) { accumulate_grads_ = accumulate; }
    bool grad_accumulation() const { return accumulate_grads_; }
    // The key of the gate noise: a training forward adds noise_std * N(0, 1) drawn from
    // (config.noise_seed, stream, step, token, expert) (scmoe/kernels/router.h), reproducible bit for bit
    // from those five on every backend. This call sets the step of the next training forward and the
    // stream of every later one. The step advances by one after each training forward's route, so
    // successive forwards draw fresh noise even if this is never called; eval forwards draw none and
    // leave it. Defaults: step 0, stream = ep_rank() (ranks draw different noise). A trainer sets it
    // each step, e.g. (step, rank): fresh noise per step and per data-parallel replica, and a resumed
    // run draws exactly the noise of an uninterrupted one.
    void set_noise_key(std::uint64_t step, std::uint64_t stream) {
        noise_step_ = step;
        noise_stream_ = stream;
    }
    std::uint64_t noise_step() const { return noise_step_; }  // the step the next training forward uses
    std::uint64_t noise_stream() const { return noise_stream_; }

    // ---- forward ----
    // x, shortcut, y: [tokens, hidden] in config.dtype; shortcut may be an undefined Tensor (= x).
    void forward(const Tensor& x, const Tensor& shortcut, const MoeParams& params, Tensor y, Stream& stream);

    void route(const Tensor& shortcut, const MoeParams& params, Stream& stream);  // gate GEMM, router, layout
    void permute(Stream& stream);                                                 // gather into expert order
    void dispatch(Stream& stream);                       // all-to-all: rows to the ranks owning their experts
    void experts(const MoeParams& params, Stream& stream);                        // grouped expert FFN
    // The FFN of one local expert alone, on weights given apart from a MoeParams: w1 [H, I] and
    // w2 [F, H] in config.dtype (one expert's slice, e.g. a device copy of a host-resident expert,
    // scmoe/models/expert_cache.h). Calling it for every local expert computes what experts() does,
    // bit for bit on the CPU (the same GEMM per expert). Single rank only (no expert parallelism).
    void expert_one(int expert, const void* w1, const void* w2, Stream& stream);
    // Rows each local expert receives in the pass in flight (after route(); single rank), copied to
    // the host: the experts a residency mode must bring in. Synchronizes `stream`.
    std::vector<std::int32_t> routed_rows(Stream& stream);
    void collect(Stream& stream);                        // all-to-all: expert outputs back to their ranks
    void combine(Tensor y, Stream& stream);                                       // y = weighted sum (overwrites)
    void shared_expert(const Tensor& x, const MoeParams& params, Tensor y, Stream& stream);  // y += [c*] SE(x)
    // shared_expert in two steps, so SE(x) can be computed while the routed branch is in flight and
    // added once combine has written y: compute keeps SE(x) (and the CG-1 logit) in the workspace.
    void shared_expert_compute(const Tensor& x, const MoeParams& params, Stream& stream);
    void shared_expert_add(Tensor y, Stream& stream);  // y += [c*] SE(x) of the last compute

    // ---- chunked pipeline (expert parallelism; Tutel-style) ----
    // The exchanges and the expert FFN split into `chunks` pieces, piece c = the local experts
    // [c*El/chunks, (c+1)*El/chunks) of every rank (El = num_local_experts()). Every expert's rows stay
    // in one piece, so outputs and every gradient are bitwise those of the unchunked stages for any
    // chunk count. With one local expert (row_sliced()), piece c is instead rows [r*c/chunks,
    // r*(c+1)/chunks) of every source's r rows, as Tutel's a2a_ffn_overlap_degree slices capacity:
    // outputs and input gradients are those of the unchunked stages row for row, and the expert's
    // weight gradient is the sum of the pieces' (accumulated in piece order: fp32 rounding apart from
    // the unchunked sum). experts_backward_chunk's pieces must then run in piece order, on one
    // stream. Forward:  dispatch_counts(); then per piece dispatch_chunk -> experts_chunk ->
    // collect_chunk, e.g. all dispatch chunks, then experts chunk c on a compute stream as soon as
    // dispatch chunk c is done, and collect chunk c once experts chunk c is done. Backward likewise:
    // collect_backward_chunk -> experts_backward_chunk -> dispatch_backward_chunk. The exchanges
    // (dispatch_counts and the *_chunk exchanges) must all run on one stream, in the same order on
    // every rank (they share staging buffers and the Communicator); the experts_* pieces may run on
    // another stream ordered by events. chunks = 1 is exactly dispatch/experts/collect.
    // Bounds: 1 <= chunks <= max_chunks(), 0 <= chunk < chunks; anything else throws at once.
    int max_chunks() const;
    // One local expert with expert parallelism: the pieces are row slices (above).
    bool row_sliced() const { return pipelines_row_slices(config_.num_experts, ep_size_); }
    void dispatch_counts(Stream& stream);  // the per-expert count exchange that starts dispatch()
    void dispatch_chunk(int chunk, int chunks, Stream& stream);
    void experts_chunk(const MoeParams& params, int chunk, int chunks, Stream& stream);
    void collect_chunk(int chunk, int chunks, Stream& stream);
    void collect_backward_chunk(int chunk, int chunks, Stream& stream);
    void experts_backward_chunk(const MoeParams& params, const MoeGrads& grads, int chunk, int chunks, Stream& stream);
    void dispatch_backward_chunk(int chunk, int chunks, Stream& stream);

    // ---- backward ----
    // grad_y: [tokens, hidden]. Gradients are written into grads (f32; added to them with
    // set_grad_accumulation(true)) and grad_x.
    // With a separate shortcut, its gradient goes to grad_shortcut (defined) and grad_x gets only
    // the shared-expert part (zeros without one; grad_x may then be undefined); with no shortcut,
    // grad_shortcut must be undefined and grad_x gets the whole input gradient. Anything else throws
    // scmoe::Error before anything is enqueued: grad_shortcut given after a forward without a
    // shortcut, grad_shortcut undefined after one with a shortcut, or no forward yet. (A forward has
    // a shortcut when forward() was given a defined one, or, for the staged forward, when
    // shared_expert's x is not route's input.) The backward stages also throw with no forward yet.
    // The gradients are those of  <y, grad_y> + aux_loss_coef * aux + z_loss_coef * z  (MoeStats):
    // the router losses' terms are already in, scaled by their coefficients, in grads.gate_w and in
    // the routed input's gradient (grad_shortcut, or grad_x without a shortcut), the only tensors
    // they depend on (through the gate logits; route_backward adds them).
    void backward(const Tensor& grad_y, const MoeParams& params, const MoeGrads& grads, Tensor grad_x,
                  Tensor grad_shortcut, Stream& stream);

    void combine_backward(const Tensor& grad_y, Stream& stream);
    void collect_backward(Stream& stream);   // all-to-all: output gradients to the experts' ranks
    void experts_backward(const MoeParams& params, const MoeGrads& grads, Stream& stream);
    void dispatch_backward(Stream& stream);  // all-to-all: input gradients back to the tokens' ranks
    // grad_s (+)= routed-path gradient (accumulate = add into existing contents).
    void permute_backward(Tensor grad_s, bool accumulate, Stream& stream);
    // grad_s += router-path gradient; grads.gate_w written.
    void route_backward(const MoeParams& params, const MoeGrads& grads, Tensor grad_s, Stream& stream);
    // grad_x (+)= shared-expert-path gradient; shared and CG-1 weight grads written.
    void shared_expert_backward(const Tensor& grad_y, const MoeParams& params, const MoeGrads& grads, Tensor grad_x,
                                bool accumulate, Stream& stream);

    // Copies routing statistics of the last forward to the host; synchronizes `stream`.
    MoeStats stats(Stream& stream);
    // Copies the routing of the last forward to the host; synchronizes `stream`.
    MoeRouting routing(Stream& stream);
    // Copies the rows the local experts received in the last forward; synchronizes `stream`.
    MoeExpertInputs expert_inputs(Stream& stream);

    // For tests and benchmarks with a known routing: the following forwards send token t's j-th
    // choice to expert_index[t * top_k + j] with weight gate_weight[t * top_k + j] instead of the
    // router's choice (the gate GEMM and the router losses still run; capacity still applies).
    // Both have tokens * top_k entries for the token count of the next forward; the choices of a
    // token must be distinct experts. Empty vectors switch it off. Call it between passes, not while
    // a forward is in flight. The router has no gradient for a forced choice: backward refuses to
    // run route_backward while forced routing is on.
    void force_routing(std::vector<std::int32_t> expert_index, std::vector<float> gate_weight);

private:
    struct Buffers;
    struct HostScratch;
    // Bytes of the layer's own workspace (kept between passes) and of its shareable scratch.
    static std::pair<std::size_t, std::size_t> workspace_parts(const MoeConfig& config, std::int64_t max_tokens,
                                                               int ep_size);
    void check_finite(const Tensor& t, int slot, const char* what, Stream& stream);
    void require_forward(const char* what) const;  // throws unless a forward has run
    void check_config_across_ranks();
    std::int64_t rows() const;           // token-side permuted rows of the pass in flight
    std::int64_t expert_rows() const;    // bound on the expert-side rows of the pass in flight
    GroupedGemmArgs expert_gemm_args(const Buffers& b) const;
    const std::int32_t* expert_rows_in_use(const Buffers& b) const;
    // The all-to-all with its regroup: token side (rows in global-expert order) to expert side
    // (local experts' rows, expert-major), and back. Counts come from the last dispatch.
    void to_experts(const void* token_side, void* expert_side, Stream& stream);
    void to_sources(const void* expert_side, void* token_side, Stream& stream);
    // Chunked pipeline: the local experts of piece `chunk`, argument checks, the pieces' pack/unpack
    // tables (built on the host from the last dispatch's counts, uploaded in stream order), one
    // piece's exchange in either direction, and the expert FFN over a range of local experts.
    std::pair<int, int> chunk_experts(int chunk, int chunks) const;
    void check_chunk(int chunk, int chunks, const char* what) const;
    void build_chunk_tables(int chunks, Stream& stream);
    void build_row_slice_tables(int chunks, Stream& stream);
    void exchange_chunk(const void* from, void* to, bool to_experts, int chunk, int chunks, Stream& stream);
    // The expert FFN over rows given as groups: `groups` local experts from `first_expert`, expert
    // g's rows [offsets[g], offsets[g + 1]) (stream memory); `whole`: every local expert's rows.
    struct ExpertRows {
        int first_expert = 0, groups = 0;
        const std::int32_t* offsets = nullptr;
        bool whole = false;
        // A row slice's rows [host_begin, host_end) of the one local expert, known on the host (the
        // slice table dispatch_counts built); -1: not known (the offsets live on the device only).
        std::int64_t host_begin = -1, host_end = -1;
    };
    ExpertRows expert_range_rows(int first_expert, int end_expert) const;
    ExpertRows row_slice_rows(int chunk, int chunks) const;  // row_sliced(): piece `chunk`'s rows
    void experts_range(const MoeParams& params, int first_expert, int end_expert, Stream& stream);
    void experts_range_at(const void* w1, const void* w2, const ExpertRows& rows, Stream& stream);
    // accumulate_weights: add the weight gradients into grads (a later row slice) as well as when
    // gradient accumulation is on.
    void experts_backward_rows(const MoeParams& params, const MoeGrads& grads, const ExpertRows& rows,
                               bool accumulate_weights, Stream& stream);
    // row_sliced(): the host's slice layout from the counts dispatch_counts brought back, uploaded.
    void build_slice_table(Stream& stream);

    MoeConfig config_;
    Device& device_;
    std::int64_t max_tokens_;
    Communicator* ep_;
    int ep_size_ = 1, ep_rank_ = 0;
    std::unique_ptr<Buffers> buf_;
    std::unique_ptr<HostScratch> host_;
    DeviceBuffer owned_workspace_;
    void* host_scratch_ = nullptr;  // pinned: stats, exchange counts
    std::unique_ptr<NonfiniteChecks> nonfinite_;  // check_finite's reads at the next sync
    GroupedGemmProvider provider_ = GroupedGemmProvider::kAuto;
    bool training_ = true;
    bool accumulate_grads_ = false;  // set_grad_accumulation
    std::uint64_t noise_step_ = 0, noise_stream_ = 0;  // noise_stream_ = ep_rank_ at construction
    std::vector<std::int32_t> forced_index_;
    std::vector<float> forced_weight_;

    // State of the pass in flight.
    std::int64_t tokens_ = 0;
    std::int64_t capacity_ = 0;
    Tensor x_, shortcut_;
    bool forward_started_ = false;  // a route() has run: backward has activations to differentiate
    bool separate_shortcut_ = false;  // the forward routed on a shortcut other than x (backward's rule)
    int table_chunks_ = 0;  // chunk count the uploaded pack/unpack tables were built for (0 = none)
    int next_slice_backward_ = 0;  // row slices: the backward piece due next (their weight gradients add up)
    std::vector<bool> chunk_counts_built_;  // [max_chunks + 1]: chunk counts whose element counts this forward's
                                            // dispatch has computed (HostScratch::chunk_send_elements)
};

}  // namespace scmoe
