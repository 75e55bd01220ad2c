// Private: the buffers an MoeLayer carves out of its workspace and its pinned host scratch. One
// function lays each out for both the sizing pass and the real pass, so the two cannot disagree.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "scmoe/kernels/layout.h"
#include "scmoe/kernels/workspace.h"
#include "scmoe/moe/moe_layer.h"

namespace scmoe {

// One local expert per rank (expert parallelism): the chunked pipeline's pieces are slices of its
// rows, as Tutel's a2a_ffn_overlap_degree splits capacity. The expert side keeps its rows on a fixed
// grid of kRowSlices slices: slice s of a source's r rows is [r*s/S, r*(s+1)/S) (row_slice_begin),
// and the rows are ordered (slice, source, row), so the rows of slices [s0, s1) are contiguous for
// every piece count that divides S: 1..kMaxRowPieces pieces. The token side is unchanged (a piece
// sends rows [r*c/n, r*(c+1)/n) of each peer's segment). The layout does not depend on the piece
// count, so a forward and its backward may run in different numbers of pieces.
inline constexpr int kRowSlices = 12;  // every piece count 1..kMaxRowPieces (moe_layer.h) divides it
static_assert(kRowSlices % 2 == 0 && kRowSlices % 3 == 0 && kRowSlices % kMaxRowPieces == 0);
inline std::int64_t row_slice_begin(std::int64_t rows, std::int64_t slice, std::int64_t slices) {
    return rows * slice / slices;
}
// The row-slice table (Buffers/HostScratch::slice_table), for P sources:
//   [3][P S] at 0: expert row, exchange row, rows per (source p, slice s), p-major: the regroup of
//                  the unchunked exchange (the all-to-all delivers each source's rows in order)
//   [n + 1]  at slice_bounds_at(P, n): the first expert row of each of n pieces, then the total
inline std::int64_t slice_bounds_at(int P, int n) {
    return 3LL * P * kRowSlices + static_cast<std::int64_t>(n - 1) * (n + 2) / 2;
}
inline std::int64_t slice_table_entries(int P) { return slice_bounds_at(P, kMaxRowPieces + 1); }
// Entries of the chunk table: 3 P chunks + 3 P El for expert groups (<= 6 E); with row slices
// 3 P n + 3 P S for n pieces.
inline std::int64_t chunk_table_entries(std::int64_t E, int ep) {
    return E / ep == 1 ? 3LL * ep * (kMaxRowPieces + kRowSlices) : 6 * E;
}

struct MoeLayer::Buffers {
    // Router and layout (token side).
    float* logits = nullptr;                 // [T, E] f32
    float* probs = nullptr;                  // [T, E] f32
    float* logsumexp = nullptr;              // [T]
    std::int32_t* expert_index = nullptr;    // [T, k]
    float* gate_weight = nullptr;            // [T, k]
    float* expert_fraction = nullptr;        // [E]
    float* losses = nullptr;                 // [2]
    std::int32_t* expert_counts = nullptr;   // [E]
    std::int32_t* group_offsets = nullptr;   // [E + 1] rows of each (global) expert in xp
    std::int32_t* slot_of_choice = nullptr;  // [T, k]
    std::int32_t* choice_of_row = nullptr;   // [R]
    std::int32_t* dropped = nullptr;         // [1]
    std::int64_t* nonfinite = nullptr;       // [3 checks x {count, first index}]
    // Token side, dtype: rows in global-expert order, R = max_rows.
    void* xp = nullptr;       // [R, H]
    void* yp = nullptr;       // [R, H]
    void* grad_yp = nullptr;  // [R, H]
    void* grad_xp = nullptr;  // [R, H]
    // Expert side, dtype: this rank's experts' rows, Re = max_expert_rows. Single rank: the same
    // memory as the token side.
    void* xe = nullptr;       // [Re, H]
    void* h = nullptr;        // [Re, I]
    void* act = nullptr;      // [Re, F]
    void* ye = nullptr;       // [Re, H]
    void* grad_ye = nullptr;  // [Re, H]
    void* grad_act = nullptr; // [Re, F]
    void* grad_h = nullptr;   // [Re, I]
    void* grad_xe = nullptr;  // [Re, H]
    // Expert parallelism only.
    void* exchange = nullptr;                     // [Re, H] source-major rows as the all-to-all moves them
    std::int32_t* send_expert_counts = nullptr;   // [E] rows this rank sends to each global expert
    std::int32_t* recv_expert_counts = nullptr;   // [ep, El] rows each source sends to each local expert
    std::int32_t* local_offsets = nullptr;        // [El + 1] expert-major offsets of the local experts
    // Chunked pipeline: a piece's token-side rows packed by peer for its all-to-all, and the
    // pieces' pack/unpack tables (layout in chunk_table_layout below).
    void* stage = nullptr;                        // [R, H]
    std::int32_t* chunk_table = nullptr;          // [chunk_table_entries]
    std::int32_t* slice_table = nullptr;          // one local expert: [slice_table_entries], else none
    // Router backward.
    float* grad_gate_weight = nullptr;  // [T, k]
    void* grad_logits = nullptr;        // [T, E] dtype
    // Shared expert and CG-1, dtype.
    void* shared_h = nullptr;         // [T, Is]
    void* shared_act = nullptr;       // [T, Fs]
    void* shared_out = nullptr;       // [T, H]
    float* cg_logit = nullptr;        // [T] f32
    void* grad_shared_out = nullptr;  // [T, H]
    void* grad_shared_act = nullptr;  // [T, Fs]
    void* grad_shared_h = nullptr;    // [T, Is]
    void* grad_cg_logit = nullptr;    // [T] dtype

    // The largest token-side row count any token count up to max_tokens can need.
    static std::int64_t max_rows(const MoeConfig& c, std::int64_t max_tokens) {
        const std::int64_t cap = c.dispatch == DispatchMode::kCapacity
                                     ? expert_capacity(max_tokens, c.num_experts, c.top_k, c.capacity_factor)
                                     : 0;
        return std::max<std::int64_t>(permuted_rows(max_tokens, c.num_experts, c.top_k, cap), 1);
    }
    // Expert-side rows: capacity mode receives exactly E*C rows (the same as it sends); dropless
    // can receive every rank's every assignment, ep * max_tokens * top_k rows, bounded by the
    // receive limit ceil(recv_limit_factor * max_tokens * top_k) (MoeConfig).
    static std::int64_t max_expert_rows(const MoeConfig& c, std::int64_t max_tokens, int ep) {
        if (ep == 1 || c.dispatch == DispatchMode::kCapacity) return max_rows(c, max_tokens);
        const std::int64_t all = ep * max_tokens * c.top_k;
        if (c.recv_limit_factor <= 0.0f) return std::max<std::int64_t>(all, 1);
        const auto limit = static_cast<std::int64_t>(
            std::ceil(static_cast<double>(c.recv_limit_factor) * static_cast<double>(max_tokens * c.top_k)));
        return std::max<std::int64_t>(std::min(all, limit), 1);
    }

    // w: what the layer keeps between its stages and passes (activations, routing). sc: scratch,
    // dead between a layer's passes (the gradients inside a backward, the exchange's staging), which
    // layers whose passes never run concurrently may share (MoeLayer's constructor, BlockStack). The
    // same carver for both gives one workspace of workspace_bytes(config, T, ep).
    void carve(WorkspaceCarver& w, WorkspaceCarver& sc, const MoeConfig& c, std::int64_t T, int ep) {
        const std::int64_t E = c.num_experts, K = c.top_k, H = c.hidden, F = c.ffn, I = c.expert_inner_width();
        const std::int64_t R = max_rows(c, T), Re = max_expert_rows(c, T, ep);
        const std::size_t ds = dtype_size(c.dtype);
        auto take = [&](std::int64_t n) { return w.take_bytes(static_cast<std::size_t>(n) * ds); };
        auto scratch = [&](std::int64_t n) { return sc.take_bytes(static_cast<std::size_t>(n) * ds); };
        logits = w.take<float>(T * E);
        probs = w.take<float>(T * E);
        logsumexp = w.take<float>(T);
        expert_index = w.take<std::int32_t>(T * K);
        gate_weight = w.take<float>(T * K);
        expert_fraction = w.take<float>(E);
        losses = w.take<float>(2);
        expert_counts = w.take<std::int32_t>(E);
        group_offsets = w.take<std::int32_t>(E + 1);
        slot_of_choice = w.take<std::int32_t>(T * K);
        choice_of_row = w.take<std::int32_t>(R);
        dropped = w.take<std::int32_t>(1);
        nonfinite = w.take<std::int64_t>(6);
        xp = take(R * H);
        yp = take(R * H);
        grad_yp = scratch(R * H);
        grad_xp = scratch(R * H);
        if (ep == 1) {
            xe = xp;
            ye = yp;
            grad_ye = grad_yp;
            grad_xe = grad_xp;
        } else {
            xe = take(Re * H);
            ye = take(Re * H);
            grad_ye = scratch(Re * H);
            grad_xe = scratch(Re * H);
            exchange = scratch(Re * H);
            send_expert_counts = w.take<std::int32_t>(E);
            recv_expert_counts = w.take<std::int32_t>(E);
            local_offsets = w.take<std::int32_t>(E / ep + 1);
            stage = scratch(R * H);
            chunk_table = w.take<std::int32_t>(chunk_table_entries(E, ep));
            if (E / ep == 1) slice_table = w.take<std::int32_t>(slice_table_entries(ep));
        }
        h = take(Re * I);
        act = take(Re * F);
        grad_act = scratch(Re * F);
        grad_h = scratch(Re * I);
        grad_gate_weight = sc.take<float>(T * K);
        grad_logits = scratch(T * E);
        if (c.shared_expert) {
            const std::int64_t Fs = c.shared_ffn_width(), Is = activation_input_width(c.activation, Fs);
            shared_h = take(T * Is);
            shared_act = take(T * Fs);
            shared_out = take(T * H);
            grad_shared_out = scratch(T * H);
            grad_shared_act = scratch(T * Fs);
            grad_shared_h = scratch(T * Is);
            if (c.coefficient_gate) {
                cg_logit = w.take<float>(T);
                grad_cg_logit = scratch(T);
            }
        }
    }
};

// Pinned host memory: results copied back for the host (statistics) and the
// counts the all-to-all exchanges read on the host.
struct MoeLayer::HostScratch {
    std::int32_t* dropped = nullptr;         // [1]
    float* losses = nullptr;                 // [2]
    std::int32_t* expert_counts = nullptr;   // [E]
    std::int32_t* global_offsets = nullptr;  // [E + 1]
    std::int32_t* send_expert_counts = nullptr;  // [E]
    std::int32_t* recv_expert_counts = nullptr;  // [E] = [ep, El]
    std::int32_t* local_offsets = nullptr;   // [El + 1]
    std::int64_t* counts_per_peer = nullptr; // [ep] El everywhere (set at construction): the count
                                             // exchange's element counts, both ways
    std::int64_t* send_elements = nullptr;   // [ep] dispatch: elements to each peer
    std::int64_t* recv_elements = nullptr;   // [ep] dispatch: elements from each peer
    std::int32_t* config_hashes = nullptr;   // [ep, 2] every rank's config hash (construction check)
    std::int32_t* chunk_table = nullptr;     // [chunk_table_entries] chunked pipeline: built here, uploaded
    std::int32_t* slice_table = nullptr;     // one local expert: [slice_table_entries], built by dispatch_counts
    // Chunked pipeline element counts, one slot per chunk count n = 1..max (at chunk_counts_at(n, ep)),
    // each [n, ep]: so the counts of a forward's pieces stay valid while a backward in another number
    // of pieces computes its own (host-task communicators read them when their work runs).
    std::int64_t* chunk_send_elements = nullptr;  // token side -> expert side, per piece and peer
    std::int64_t* chunk_recv_elements = nullptr;  // expert side -> token side, per piece and peer

    void carve(WorkspaceCarver& w, const MoeConfig& c, int ep) {
        const std::int64_t E = c.num_experts;
        dropped = w.take<std::int32_t>(1);
        losses = w.take<float>(2);
        expert_counts = w.take<std::int32_t>(E);
        global_offsets = w.take<std::int32_t>(E + 1);
        send_expert_counts = w.take<std::int32_t>(E);
        recv_expert_counts = w.take<std::int32_t>(E);
        local_offsets = w.take<std::int32_t>(E / ep + 1);
        counts_per_peer = w.take<std::int64_t>(ep);
        send_elements = w.take<std::int64_t>(ep);
        recv_elements = w.take<std::int64_t>(ep);
        config_hashes = w.take<std::int32_t>(2 * ep);
        chunk_table = w.take<std::int32_t>(chunk_table_entries(E, ep));
        if (E / ep == 1 && ep > 1) slice_table = w.take<std::int32_t>(slice_table_entries(ep));
        const std::int64_t pieces = E / ep == 1 ? kMaxRowPieces : E / ep;
        chunk_send_elements = w.take<std::int64_t>(chunk_counts_at(pieces + 1, ep));
        chunk_recv_elements = w.take<std::int64_t>(chunk_counts_at(pieces + 1, ep));
    }
    // Where the [n, ep] per-piece counts of an n-piece pipeline start: after the slots of 1..n-1.
    static std::int64_t chunk_counts_at(std::int64_t n, int ep) { return n * (n - 1) / 2 * ep; }
};

// Local expert `first`'s slice of an [El, ...] expert tensor (weights or their gradients).
inline void* expert_slice(const Tensor& t, int first, int num_local) {
    return static_cast<char*>(t.data) + static_cast<std::size_t>(t.numel() / num_local * first) * dtype_size(t.dtype);
}

// Where piece c's tables sit in the chunk table, for `chunks` pieces of El local experts over P
// ranks (piece c = local experts [e0, e1)):
//   token side   [3][P] at 3 P c:            token row (in xp/yp/grad_*p), stage row, rows   per peer
//   expert side  [3][P (e1-e0)] at 3 P chunks + 3 P e0:  expert row (xe/ye/...), exchange row, rows
//                per (source p, local expert e) in source-major order, as the all-to-all packs them
// Sizes: 3 P chunks + 3 P El <= 6 E.
struct ChunkTableLayout {
    int peers = 1, experts = 0;  // P, and the piece's expert count e1 - e0
    std::int64_t token = 0, expert = 0;  // offsets of the two tables
    std::int64_t token_segments() const { return peers; }
    std::int64_t expert_segments() const { return static_cast<std::int64_t>(peers) * experts; }
};
// With row slices (one local expert): piece c's token side [3][P] at 3 P c (one segment per peer,
// as for expert groups) and its expert side [3][P S/n] at 3 P n + 3 P (S/n) c: per (source p, slice s
// of the piece's S/n), p-major; `experts` then counts the piece's slices per source.
inline ChunkTableLayout row_slice_table_layout(int P, int chunks, int chunk) {
    ChunkTableLayout l;
    l.peers = P;
    l.experts = kRowSlices / chunks;
    l.token = 3LL * P * chunk;
    l.expert = 3LL * P * chunks + 3LL * P * l.experts * chunk;
    return l;
}
inline ChunkTableLayout chunk_table_layout(int P, int El, int chunks, int chunk) {
    const int e0 = chunk * El / chunks, e1 = (chunk + 1) * El / chunks;
    ChunkTableLayout l;
    l.peers = P;
    l.experts = e1 - e0;
    l.token = 3LL * P * chunk;
    l.expert = 3LL * P * chunks + 3LL * P * e0;
    return l;
}

}  // namespace scmoe
