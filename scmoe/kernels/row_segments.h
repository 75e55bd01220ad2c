// Row segments: copies runs of rows between two buffers, the runs listed in a table in stream
// memory. The chunked expert-parallel exchange packs a chunk's rows for its all-to-all and unpacks
// what arrives with it; the table is built on the host from the exchanged counts and uploaded in
// stream order, so no host sync is needed.
//
//   for s in [0, num_segments):  out[to_rows[s] + i] = in[from_rows[s] + i],  i in [0, counts[s])
//
// Segments must not overlap in `out`; the copy is a pure permutation of rows (bitwise).
#pragma once

#include <cstdint>

#include "scmoe/kernels/device.h"
#include "scmoe/kernels/dtype.h"
#include "scmoe/kernels/op_cost.h"

namespace scmoe {

struct RowSegmentsArgs {
    int num_segments = 0;
    const std::int32_t* from_rows = nullptr;  // [num_segments] first row in `in`, stream memory
    const std::int32_t* to_rows = nullptr;    // [num_segments] first row in `out`, stream memory
    const std::int32_t* counts = nullptr;     // [num_segments] rows per segment (>= 0), stream memory
    std::int64_t hidden = 0;                  // elements per row
    DType dtype = DType::kF32;
    const void* in = nullptr;
    void* out = nullptr;
};

void copy_row_segments(const RowSegmentsArgs& args, Stream& stream);

// For `rows` = sum(counts) rows copied.
inline OpCost op_cost(const RowSegmentsArgs& a, std::int64_t rows) {
    return elementwise_cost(rows * a.hidden, rows * a.hidden, a.dtype, 0.0);
}

}  // namespace scmoe
