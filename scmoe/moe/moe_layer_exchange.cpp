// MoeLayer expert-parallel exchanges: dispatch (rows to the ranks owning their experts), collect
// (expert outputs back), their backward mirrors, and the config check across ranks.
//
// NOTES: rows leave a rank in global-expert order, which is already grouped by destination rank
// (rank p owns experts [p*El, (p+1)*El)). They arrive source-major ([source][local expert]) and are
// regrouped expert-major for the grouped GEMM (with one local expert: into its row slices, so the
// chunked pipeline's pieces are contiguous; moe_layer_buffers.h); collect undoes both steps. Per-expert row counts
// travel first (a small all-to-all), so dropless needs no global knowledge; the host waits for them
// once per forward (dispatch_counts), and every data exchange after that, forward and backward,
// is an all_to_all_v_known with counts the layer holds. Every position is fixed by (source, expert,
// row), so results never depend on message arrival order.
#include <algorithm>
#include <sstream>
#include <string>

#include "scmoe/comm/communicator.h"
#include "scmoe/kernels/error.h"
#include "scmoe/kernels/regroup.h"
#include "scmoe/kernels/row_segments.h"
#include "scmoe/moe/detail/moe_layer_buffers.h"

namespace scmoe {

void MoeLayer::to_experts(const void* token_side, void* expert_side, Stream& stream) {
    ep_->all_to_all_v_known(token_side, host_->send_elements, buf_->exchange, host_->recv_elements, config_.dtype,
                            stream);
    if (row_sliced()) {  // one local expert: into the slice layout (moe_layer_buffers.h)
        const int n = ep_size_ * kRowSlices;
        const std::int32_t* t = buf_->slice_table;
        copy_row_segments({n, t + n, t, t + 2 * n, config_.hidden, config_.dtype, buf_->exchange, expert_side}, stream);
        return;
    }
    regroup({ep_size_, num_local_experts(), buf_->recv_expert_counts, config_.hidden, config_.dtype, true,
             buf_->exchange, expert_side},
            stream);
}

void MoeLayer::to_sources(const void* expert_side, void* token_side, Stream& stream) {
    if (row_sliced()) {
        const int n = ep_size_ * kRowSlices;
        const std::int32_t* t = buf_->slice_table;
        copy_row_segments({n, t, t + n, t + 2 * n, config_.hidden, config_.dtype, expert_side, buf_->exchange}, stream);
    } else {
        regroup({ep_size_, num_local_experts(), buf_->recv_expert_counts, config_.hidden, config_.dtype, false,
                 expert_side, buf_->exchange},
                stream);
    }
    ep_->all_to_all_v_known(buf_->exchange, host_->recv_elements, token_side, host_->send_elements, config_.dtype,
                            stream);
}

void MoeLayer::dispatch(Stream& stream) {
    if (ep_size_ == 1) return;
    dispatch_counts(stream);
    to_experts(buf_->xp, buf_->xe, stream);
}

void MoeLayer::dispatch_counts(Stream& stream) {
    if (ep_size_ == 1) return;
    table_chunks_ = 0;  // new counts: the chunk tables are rebuilt when a piece needs them
    std::fill(chunk_counts_built_.begin(), chunk_counts_built_.end(), false);
    Buffers& b = *buf_;
    HostScratch& h = *host_;
    const int E = config_.num_experts, El = num_local_experts(), P = ep_size_;
    const std::int64_t H = config_.hidden, Re = expert_rows();
    const int rank = ep_rank_;
    // 1. Rows for each global expert, from the layout's offsets.
    stream.copy(h.global_offsets, b.group_offsets, static_cast<std::size_t>(E + 1) * sizeof(std::int32_t));
    stream.host_task([&h, E, El, P, H] {
        for (int e = 0; e < E; ++e) h.send_expert_counts[e] = h.global_offsets[e + 1] - h.global_offsets[e];
        for (int p = 0; p < P; ++p)
            h.send_elements[p] = static_cast<std::int64_t>(h.global_offsets[(p + 1) * El] - h.global_offsets[p * El]) * H;
    });
    stream.copy(b.send_expert_counts, h.send_expert_counts, static_cast<std::size_t>(E) * sizeof(std::int32_t));
    // 2. Exchange the counts: recv_expert_counts[s][e] = rows source s sends to local expert e (El
    //    from every peer, known in advance).
    ep_->all_to_all_v_known(b.send_expert_counts, h.counts_per_peer, b.recv_expert_counts, h.counts_per_peer,
                            DType::kI32, stream);
    stream.copy(h.recv_expert_counts, b.recv_expert_counts, static_cast<std::size_t>(E) * sizeof(std::int32_t));
    // 3. The layer's one host sync per forward: the host needs the counts to size the data exchanges
    //    (the device-buffer communicators post them from the host), the receive workspace's check,
    //    and the expert offsets. Every later exchange of this forward and its backward reuses them.
    stream.synchronize();
    std::int64_t total = 0;
    for (int p = 0; p < P; ++p) {
        std::int64_t rows = 0;
        for (int e = 0; e < El; ++e) rows += h.recv_expert_counts[p * El + e];
        h.recv_elements[p] = rows * H;
        total += rows;
    }
    h.local_offsets[0] = 0;
    for (int e = 0; e < El; ++e) {
        std::int64_t rows = 0;
        for (int p = 0; p < P; ++p) rows += h.recv_expert_counts[p * El + e];
        h.local_offsets[e + 1] = h.local_offsets[e] + static_cast<std::int32_t>(rows);
    }
    if (total > Re) {
        // Checked before any data exchange is posted (review R2): the receive workspace holds Re rows.
        std::ostringstream counts;
        for (int e = 0; e < El; ++e)
            counts << (e ? ", " : "") << "expert " << rank * El + e << ": " << h.local_offsets[e + 1] - h.local_offsets[e];
        SCMOE_FAIL("MoeLayer.dispatch: rank " << rank << " receives " << total << " rows for its experts ("
                                              << counts.str() << "), more than the " << Re
                                              << " its workspace holds (dropless receive limit: recv_limit_factor "
                                              << config_.recv_limit_factor << " x max_tokens " << max_tokens_
                                              << " x top_k " << config_.top_k
                                              << "; raise MoeConfig.recv_limit_factor, 0 = no limit)");
    }
    stream.copy(b.local_offsets, h.local_offsets, static_cast<std::size_t>(El + 1) * sizeof(std::int32_t));
    if (row_sliced()) build_slice_table(stream);
}

void MoeLayer::collect(Stream& stream) {
    if (ep_size_ > 1) to_sources(buf_->ye, buf_->yp, stream);
}

void MoeLayer::collect_backward(Stream& stream) {
    if (ep_size_ > 1) to_experts(buf_->grad_yp, buf_->grad_ye, stream);
}

void MoeLayer::dispatch_backward(Stream& stream) {
    if (ep_size_ > 1) to_sources(buf_->grad_xe, buf_->grad_xp, stream);
}

void MoeLayer::check_config_across_ranks() {
    auto stream = device_.create_stream();
    const std::uint64_t mine = config_.hash();
    const int P = ep_size_;
    // The hash travels as two i32 words per rank; the gather lands in the token-side buffer, which
    // is free at construction.
    auto* words = static_cast<std::int32_t*>(buf_->xp);
    std::int32_t* host_words = host_->config_hashes;
    const std::int32_t hash_words[2] = {static_cast<std::int32_t>(mine & 0xffffffffu),
                                        static_cast<std::int32_t>(mine >> 32)};
    // A collective inside a constructor: a rank whose peers never construct theirs waits here. The
    // common cause is constructing several ranks' layers from one thread (the first constructor
    // waits for the second, which that thread never reaches): say so, naming the constructor.
    try {
        stream->copy(words + 2 * ep_rank_, hash_words, sizeof(hash_words));
        ep_->all_gather(words + 2 * ep_rank_, 2, words, DType::kI32, *stream);
        stream->copy(host_words, words, static_cast<std::size_t>(2 * P) * sizeof(std::int32_t));
        stream->synchronize();
    } catch (const Error& e) {
        SCMOE_FAIL("MoeLayer constructor on expert-parallel rank "
                   << ep_rank_ << " of " << P << " (" << ep_->name()
                   << "): its config check, a collective over the expert-parallel group, failed. Every rank "
                      "constructs its layer, each from its own thread (or process): constructing several ranks' "
                      "layers from one thread waits in the first constructor for the others until the "
                      "communicator's timeout. The communicator said: "
                   << e.what());
    }
    std::string table;
    bool same = true;
    for (int p = 0; p < P; ++p) {
        const std::uint64_t theirs = static_cast<std::uint32_t>(host_words[2 * p]) |
                                     (static_cast<std::uint64_t>(static_cast<std::uint32_t>(host_words[2 * p + 1])) << 32);
        same = same && theirs == mine;
        table += " rank " + std::to_string(p) + ": " + std::to_string(theirs) + ";";
    }
    // Every rank sees the same table, so every rank raises the same error.
    SCMOE_CHECK(same, "MoeConfig differs across the " << P << " expert-parallel ranks (config hashes:" << table
                                                      << " this is rank " << ep_rank_ << " with "
                                                      << config_.to_string() << ")");
}

}  // namespace scmoe
