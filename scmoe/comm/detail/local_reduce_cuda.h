// The rank-order sum of LocalCommunicator's CUDA path: one kernel over every rank's buffer, so a
// device all_reduce_sum is bit-identical to the host one (comm_detail::sum_in_rank_order). Private
// to comm/; built only with CUDA.
#pragma once

#include <cstdint>

#include "scmoe/kernels/dtype.h"

namespace scmoe::comm_detail {

// Inputs travel in the kernel's parameters: at most this many ranks per sum.
inline constexpr int kMaxDeviceSumInputs = 128;

// Enqueues on `stream` (a cudaStream_t) out[i] = inputs[0][i] + inputs[1][i] + ... added left to
// right (rank order): f32 in fp32; bf16 in fp32 from 0.0f, rounded once to nearest even; i32 as
// wrapping 32-bit adds. inputs [num_inputs] and out [count] are memory the stream's device can
// address; out may alias no input. num_inputs in [1, kMaxDeviceSumInputs]; count >= 0. The
// current device must be the stream's.
void sum_in_rank_order_cuda(const void* const* inputs, int num_inputs, void* out, std::int64_t count, DType dtype,
                            void* stream);

}  // namespace scmoe::comm_detail
