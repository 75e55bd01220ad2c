// MoeLayer chunked pipeline: the exchanges and the expert FFN in pieces of consecutive local
// experts, or with one local expert in slices of its rows, so one piece's all-to-all overlaps
// another piece's expert FFN (Tutel-style).
//
// NOTES: a piece's rows are contiguous neither on the token side (rows leave in global-expert
// order, so peer p's experts [p*El + e0, p*El + e1) sit between other peers' rows) nor on the
// expert side (expert-major, but the all-to-all packs source-major). Each piece's exchange
// therefore packs its rows into a staging buffer, moves them with one all_to_all_v, and unpacks
// them to exactly the rows the unchunked exchange writes: every row lands where it would without
// chunks, so the expert GEMMs see the same operands. The run tables are built on the host from the
// counts dispatch_counts() brought back (its one host sync) and uploaded in stream order; the
// pieces' element counts are computed on the host at once, one slot per chunk count. Every piece
// stages at row 0: the exchanges run in order on one stream, so a piece's staging is consumed
// before the next piece reuses it.
#include <string>

#include "scmoe/comm/communicator.h"
#include "scmoe/kernels/error.h"
#include "scmoe/kernels/row_segments.h"
#include "scmoe/moe/detail/moe_layer_buffers.h"

namespace scmoe {

int MoeLayer::max_chunks() const {
    return ep_size_ == 1 ? 1 : max_pipeline_pieces(config_.num_experts, ep_size_);
}

std::pair<int, int> MoeLayer::chunk_experts(int chunk, int chunks) const {
    const int El = num_local_experts();
    return {chunk * El / chunks, (chunk + 1) * El / chunks};
}

void MoeLayer::check_chunk(int chunk, int chunks, const char* what) const {
    SCMOE_CHECK(chunks >= 1 && chunks <= max_chunks(),
                "MoeLayer." << what << ": chunks = " << chunks << " must be in [1, " << max_chunks() << "] ("
                            << (ep_size_ == 1   ? std::string("one rank: no exchange to pipeline")
                                : row_sliced() ? std::string("one local expert: a chunk is a slice of its rows")
                                               : "a chunk is a group of this rank's " +
                                                     std::to_string(num_local_experts()) + " local experts")
                            << ")");
    SCMOE_CHECK(chunk >= 0 && chunk < chunks, "MoeLayer." << what << ": chunk " << chunk << " of " << chunks);
}

void MoeLayer::build_chunk_tables(int chunks, Stream& stream) {
    if (row_sliced()) return build_row_slice_tables(chunks, stream);
    HostScratch& h = *host_;
    const int El = num_local_experts(), P = ep_size_;
    const std::int64_t H = config_.hidden;
    // The element counts of every piece, on the host now: the device-buffer communicators read them
    // when the exchange is issued. dispatch_counts has synchronized, so the counts it brought back
    // are here.
    if (!chunk_counts_built_[static_cast<std::size_t>(chunks)]) {
        chunk_counts_built_[static_cast<std::size_t>(chunks)] = true;
        const std::int64_t at = HostScratch::chunk_counts_at(chunks, P);
        for (int c = 0; c < chunks; ++c) {
            const int e0 = c * El / chunks, ne = (c + 1) * El / chunks - e0;
            for (int p = 0; p < P; ++p) {
                const std::int32_t rows = h.global_offsets[p * El + e0 + ne] - h.global_offsets[p * El + e0];
                std::int64_t received = 0;
                for (int j = 0; j < ne; ++j) received += h.recv_expert_counts[p * El + e0 + j];
                h.chunk_send_elements[at + c * P + p] = rows * H;
                h.chunk_recv_elements[at + c * P + p] = received * H;
            }
        }
    }
    if (table_chunks_ == chunks) return;
    table_chunks_ = chunks;
    // The pack/unpack tables, in stream order (the buffer they are uploaded from is reused).
    // A copy of the scratch's pointers: the task may run after this layer is gone (the pinned
    // memory itself outlives the stream's work, Device::deallocate_host).
    stream.host_task([h = h, El, P, chunks] {
        for (int c = 0; c < chunks; ++c) {
            const ChunkTableLayout l = chunk_table_layout(P, El, chunks, c);
            const int e0 = c * El / chunks, ne = l.experts, nx = P * ne;
            std::int32_t* tok = h.chunk_table + l.token;   // [token row | stage row | rows] per peer
            std::int32_t* exp = h.chunk_table + l.expert;  // [expert row | exchange row | rows] per (source, expert)
            std::int32_t stage_row = 0, exchange_row = 0;
            for (int p = 0; p < P; ++p) {
                const std::int32_t first = h.global_offsets[p * El + e0];
                const std::int32_t rows = h.global_offsets[p * El + e0 + ne] - first;
                tok[p] = first;
                tok[P + p] = stage_row;
                tok[2 * P + p] = rows;
                stage_row += rows;
                for (int j = 0; j < ne; ++j) {
                    const int e = e0 + j, s = p * ne + j;
                    // Expert-major: expert e's rows start at local_offsets[e], source p's after sources < p.
                    std::int32_t row = h.local_offsets[e];
                    for (int q = 0; q < p; ++q) row += h.recv_expert_counts[q * El + e];
                    const std::int32_t n = h.recv_expert_counts[p * El + e];
                    exp[s] = row;
                    exp[nx + s] = exchange_row;
                    exp[2 * nx + s] = n;
                    exchange_row += n;
                }
            }
        }
    });
    const std::size_t entries = 3 * static_cast<std::size_t>(P) * static_cast<std::size_t>(chunks + El);
    stream.copy(buf_->chunk_table, h.chunk_table, entries * sizeof(std::int32_t));
}

// One local expert: piece c sends rows [r*c/n, r*(c+1)/n) of each peer's segment, and on the expert
// side lands them slice by slice where the fixed slice layout puts them (moe_layer_buffers.h): the
// rows of piece c's slices [c*S/n, (c+1)*S/n) of each source.
void MoeLayer::build_row_slice_tables(int chunks, Stream& stream) {
    HostScratch& h = *host_;
    const int P = ep_size_, S = kRowSlices, per = S / chunks;
    const std::int64_t H = config_.hidden;
    if (!chunk_counts_built_[static_cast<std::size_t>(chunks)]) {
        chunk_counts_built_[static_cast<std::size_t>(chunks)] = true;
        const std::int64_t at = HostScratch::chunk_counts_at(chunks, P);
        for (int c = 0; c < chunks; ++c)
            for (int p = 0; p < P; ++p) {
                const std::int64_t sent = h.global_offsets[p + 1] - h.global_offsets[p], got = h.recv_expert_counts[p];
                h.chunk_send_elements[at + c * P + p] =
                    (row_slice_begin(sent, c + 1, chunks) - row_slice_begin(sent, c, chunks)) * H;
                h.chunk_recv_elements[at + c * P + p] =
                    (row_slice_begin(got, c + 1, chunks) - row_slice_begin(got, c, chunks)) * H;
            }
    }
    if (table_chunks_ == chunks) return;
    table_chunks_ = chunks;
    stream.host_task([h = h, P, S, per, chunks] {
        const std::int32_t* slices = h.slice_table;  // [3][P S]: expert row, exchange row, rows per (p, s)
        for (int c = 0; c < chunks; ++c) {
            const ChunkTableLayout l = row_slice_table_layout(P, chunks, c);
            std::int32_t* tok = h.chunk_table + l.token;
            std::int32_t* exp = h.chunk_table + l.expert;
            const int nx = P * per;
            std::int32_t stage_row = 0, exchange_row = 0;
            for (int p = 0; p < P; ++p) {
                const std::int64_t sent = h.global_offsets[p + 1] - h.global_offsets[p];
                const auto lo = static_cast<std::int32_t>(row_slice_begin(sent, c, chunks));
                const auto hi = static_cast<std::int32_t>(row_slice_begin(sent, c + 1, chunks));
                tok[p] = h.global_offsets[p] + lo;
                tok[P + p] = stage_row;
                tok[2 * P + p] = hi - lo;
                stage_row += hi - lo;
                for (int j = 0; j < per; ++j) {
                    const int from = p * S + c * per + j, x = p * per + j;
                    exp[x] = slices[from];
                    exp[nx + x] = exchange_row;
                    exp[2 * nx + x] = slices[2 * P * S + from];
                    exchange_row += slices[2 * P * S + from];
                }
            }
        }
    });
    const std::size_t entries = 3 * static_cast<std::size_t>(P) * static_cast<std::size_t>(chunks + S);
    stream.copy(buf_->chunk_table, h.chunk_table, entries * sizeof(std::int32_t));
}

void MoeLayer::build_slice_table(Stream& stream) {
    HostScratch& h = *host_;
    const int P = ep_size_, S = kRowSlices;
    std::int32_t* expert_row = h.slice_table;
    std::int32_t* exchange_row = h.slice_table + P * S;
    std::int32_t* rows = h.slice_table + 2 * P * S;
    // Slice s's rows start after every source's slices < s; within slice s, source p's after
    // sources < p. The exchange delivers source p's rows in order after sources < p.
    std::int32_t slice_start = 0;
    for (int s = 0; s < S; ++s) {
        std::int32_t at = slice_start;
        for (int p = 0; p < P; ++p) {
            const std::int64_t r = h.recv_expert_counts[p];
            const auto n = static_cast<std::int32_t>(row_slice_begin(r, s + 1, S) - row_slice_begin(r, s, S));
            expert_row[p * S + s] = at;
            rows[p * S + s] = n;
            at += n;
        }
        slice_start = at;
    }
    std::int32_t source_start = 0;
    for (int p = 0; p < P; ++p) {
        for (int s = 0; s < S; ++s)
            exchange_row[p * S + s] = source_start + static_cast<std::int32_t>(row_slice_begin(h.recv_expert_counts[p], s, S));
        source_start += h.recv_expert_counts[p];
    }
    for (int n = 1; n <= kMaxRowPieces; ++n) {
        std::int32_t* bounds = h.slice_table + slice_bounds_at(P, n);
        for (int c = 0; c <= n; ++c) {
            const int s = c * S / n;
            bounds[c] = s == S ? slice_start : expert_row[s];  // slice s's first row is source 0's
        }
    }
    stream.copy(buf_->slice_table, h.slice_table, static_cast<std::size_t>(slice_table_entries(P)) * sizeof(std::int32_t));
}

void MoeLayer::exchange_chunk(const void* from, void* to, bool to_experts, int chunk, int chunks, Stream& stream) {
    build_chunk_tables(chunks, stream);
    Buffers& b = *buf_;
    HostScratch& h = *host_;
    const int P = ep_size_;
    const ChunkTableLayout l = row_sliced() ? row_slice_table_layout(P, chunks, chunk)
                                            : chunk_table_layout(P, num_local_experts(), chunks, chunk);
    const std::int32_t* tok = b.chunk_table + l.token;
    const std::int32_t* exp = b.chunk_table + l.expert;
    const int nt = P, nx = P * l.experts;
    const std::int64_t H = config_.hidden;
    const DType dt = config_.dtype;
    const std::int64_t at = HostScratch::chunk_counts_at(chunks, P) + static_cast<std::int64_t>(chunk) * P;
    const std::int64_t* send_elements = h.chunk_send_elements + at;  // token side -> expert side
    const std::int64_t* recv_elements = h.chunk_recv_elements + at;
    if (to_experts) {
        copy_row_segments({nt, tok, tok + nt, tok + 2 * nt, H, dt, from, b.stage}, stream);
        ep_->all_to_all_v_known(b.stage, send_elements, b.exchange, recv_elements, dt, stream);
        copy_row_segments({nx, exp + nx, exp, exp + 2 * nx, H, dt, b.exchange, to}, stream);
    } else {
        copy_row_segments({nx, exp, exp + nx, exp + 2 * nx, H, dt, from, b.exchange}, stream);
        ep_->all_to_all_v_known(b.exchange, recv_elements, b.stage, send_elements, dt, stream);
        copy_row_segments({nt, tok + nt, tok, tok + 2 * nt, H, dt, b.stage, to}, stream);
    }
}

void MoeLayer::dispatch_chunk(int chunk, int chunks, Stream& stream) {
    check_chunk(chunk, chunks, "dispatch_chunk");
    if (ep_size_ == 1) return;
    if (chunks == 1)
        to_experts(buf_->xp, buf_->xe, stream);
    else
        exchange_chunk(buf_->xp, buf_->xe, true, chunk, chunks, stream);
}

void MoeLayer::experts_chunk(const MoeParams& params, int chunk, int chunks, Stream& stream) {
    check_chunk(chunk, chunks, "experts_chunk");
    if (row_sliced() && chunks > 1)
        return experts_range_at(params.expert_w1.data, params.expert_w2.data, row_slice_rows(chunk, chunks), stream);
    const auto [first, end] = chunk_experts(chunk, chunks);
    experts_range(params, first, end, stream);
}

void MoeLayer::collect_chunk(int chunk, int chunks, Stream& stream) {
    check_chunk(chunk, chunks, "collect_chunk");
    if (ep_size_ == 1) return;
    if (chunks == 1)
        to_sources(buf_->ye, buf_->yp, stream);
    else
        exchange_chunk(buf_->ye, buf_->yp, false, chunk, chunks, stream);
}

void MoeLayer::collect_backward_chunk(int chunk, int chunks, Stream& stream) {
    check_chunk(chunk, chunks, "collect_backward_chunk");
    if (ep_size_ == 1) return;
    if (chunks == 1)
        to_experts(buf_->grad_yp, buf_->grad_ye, stream);
    else
        exchange_chunk(buf_->grad_yp, buf_->grad_ye, true, chunk, chunks, stream);
}

void MoeLayer::experts_backward_chunk(const MoeParams& params, const MoeGrads& grads, int chunk, int chunks,
                                      Stream& stream) {
    check_chunk(chunk, chunks, "experts_backward_chunk");
    if (row_sliced() && chunks > 1) {
        // Each slice adds its weight gradient to the earlier ones': the first overwrites, so the
        // pieces must come in order (a piece out of order would drop or double a slice's share).
        SCMOE_CHECK(chunk == 0 || chunk == next_slice_backward_,
                    "MoeLayer.experts_backward_chunk: row slice " << chunk << " of " << chunks << " out of order (slice "
                                                                  << next_slice_backward_
                                                                  << " is due): the slices' weight gradients add up, "
                                                                     "so they run in order from slice 0");
        next_slice_backward_ = chunk + 1;
        return experts_backward_rows(params, grads, row_slice_rows(chunk, chunks), chunk > 0, stream);
    }
    const auto [first, end] = chunk_experts(chunk, chunks);
    experts_backward_rows(params, grads, expert_range_rows(first, end), false, stream);
}

void MoeLayer::dispatch_backward_chunk(int chunk, int chunks, Stream& stream) {
    check_chunk(chunk, chunks, "dispatch_backward_chunk");
    if (ep_size_ == 1) return;
    if (chunks == 1)
        to_sources(buf_->grad_xe, buf_->grad_xp, stream);
    else
        exchange_chunk(buf_->grad_xe, buf_->grad_xp, false, chunk, chunks, stream);
}

}  // namespace scmoe
