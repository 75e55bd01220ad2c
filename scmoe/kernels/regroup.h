// Regroup: reorders the rows of an expert-parallel exchange between source-major and
// expert-major order.
//
// After the dispatch all-to-all a rank holds, for each source rank s and each of its local experts
// e, counts[s * num_local_experts + e] rows, packed source-major:
//     [s0: e0 rows | e1 rows | ...][s1: e0 rows | e1 rows | ...] ...
// The grouped expert GEMM wants them expert-major:
//     [e0: s0 rows | s1 rows | ...][e1: s0 rows | s1 rows | ...] ...
// to_expert_major = true converts the first into the second; false converts back. Row order
// inside a chunk is kept, so the exchange is a pure permutation (bitwise).
#pragma once

#include <cstdint>

#include "scmoe/kernels/device.h"
#include "scmoe/kernels/dtype.h"
#include "scmoe/kernels/op_cost.h"

namespace scmoe {

struct RegroupArgs {
    int num_sources = 1;
    int num_local_experts = 1;
    const std::int32_t* counts = nullptr;  // [num_sources * num_local_experts], stream memory
    std::int64_t hidden = 0;               // elements per row
    DType dtype = DType::kF32;
    bool to_expert_major = true;
    const void* in = nullptr;   // [sum(counts), hidden]
    void* out = nullptr;        // [sum(counts), hidden]
};

void regroup(const RegroupArgs& args, Stream& stream);

// For `rows` = sum(counts) rows (the counts live in stream memory; the caller reads them).
inline OpCost op_cost(const RegroupArgs& a, std::int64_t rows) {
    return elementwise_cost(rows * a.hidden, rows * a.hidden, a.dtype, 0.0);
}

}  // namespace scmoe
