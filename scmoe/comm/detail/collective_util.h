// Pieces the host-buffer communicators share: operation names, the rank-order sum, the timeout
// and its error message. Private to comm/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "scmoe/kernels/dtype.h"

namespace scmoe::comm_detail {

enum class CommOp : std::uint8_t { kAllToAllV, kAllReduceSum, kAllGather, kBroadcast, kBarrier, kAllToAllVKnown };

const char* comm_op_name(CommOp op);
// Throws naming the first peer p whose received[p] differs from expected[p] (all_to_all_v_known).
void check_known_counts(int rank, int size, const std::int64_t* expected, const std::int64_t* received);

// out[i] = inputs[0][i] + inputs[1][i] + ... added left to right (rank order), for f32 (fp32
// adds), bf16 (fp32 accumulation, rounded once) and i32 (wrapping). `out` may alias no input.
void sum_in_rank_order(const void* const* inputs, int num_inputs, void* out, std::int64_t count, DType dtype);

// count * dtype_size(dtype) after checking count >= 0; `what` names the argument in the error.
std::size_t checked_bytes(std::int64_t count, DType dtype, const char* what);

// "5", "0.5": seconds as people write them.
std::string format_seconds(double seconds);

// "rank <rank>: <op> timed out after <t> s waiting for rank <peer> (SCMOE_COMM_TIMEOUT_S)";
// with several peers (ascending, distinct) "... waiting for ranks <p>, <q> ...".
std::string timeout_message(int rank, CommOp op, double timeout_s, const std::vector<int>& peers);

}  // namespace scmoe::comm_detail
