// Expert activations. SwiGLU takes h = [gate | up] of width 2*ffn and gives silu(gate) * up;
// GELU (tanh approximation) maps width ffn to ffn.
#pragma once

#include <cstdint>

#include "scmoe/kernels/device.h"
#include "scmoe/kernels/dtype.h"
#include "scmoe/kernels/op_cost.h"

namespace scmoe {

enum class Activation { kSwiGLU, kGeLU };

const char* activation_name(Activation a);
// Width of the first expert GEMM's output: 2*ffn for SwiGLU, ffn for GELU.
constexpr std::int64_t activation_input_width(Activation a, std::int64_t ffn) {
    return a == Activation::kSwiGLU ? 2 * ffn : ffn;
}

struct ActivationArgs {
    Activation activation = Activation::kSwiGLU;
    std::int64_t rows = 0, ffn = 0;
    DType dtype = DType::kF32;
    const void* h = nullptr;  // [rows, activation_input_width]
    void* out = nullptr;      // [rows, ffn]
    // Optional, stream memory: the rows actually in use (<= rows), read when the op runs, so a
    // row count known only on the device (expert-parallel dropless) needs no host sync.
    const std::int32_t* num_rows = nullptr;
    // Optional, stream memory: rows before *first_row are left alone (a chunk of the experts'
    // rows [*first_row, *num_rows) whose bounds are known only on the device).
    const std::int32_t* first_row = nullptr;
    // The routed experts' activation (not a dense FFN's or the shared expert's). The kernels ignore
    // it; the emulator's stacks may cost the two apart (scmoe/kernels/emu/stack.h, expert_activation).
    bool routed_expert = false;
};
void activation_forward(const ActivationArgs& args, Stream& stream);

// For `rows` rows in use (the device-side row count, when given, is read by the caller).
inline OpCost op_cost(const ActivationArgs& a, std::int64_t rows) {
    return elementwise_cost(rows * activation_input_width(a.activation, a.ffn), rows * a.ffn, a.dtype, 8.0);
}

struct ActivationBackwardArgs {
    Activation activation = Activation::kSwiGLU;
    std::int64_t rows = 0, ffn = 0;
    DType dtype = DType::kF32;
    const void* h = nullptr;         // [rows, activation_input_width] (forward input)
    const void* grad_out = nullptr;  // [rows, ffn]
    void* grad_h = nullptr;          // [rows, activation_input_width] out
    const std::int32_t* num_rows = nullptr;   // optional, as in ActivationArgs
    const std::int32_t* first_row = nullptr;  // optional, as in ActivationArgs
    bool routed_expert = false;               // as in ActivationArgs
};
void activation_backward(const ActivationBackwardArgs& args, Stream& stream);

inline OpCost op_cost(const ActivationBackwardArgs& a, std::int64_t rows) {
    const std::int64_t width = activation_input_width(a.activation, a.ffn);
    return elementwise_cost(rows * (width + a.ffn), rows * width, a.dtype, 12.0);
}

}  // namespace scmoe
