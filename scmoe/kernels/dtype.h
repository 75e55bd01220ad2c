// Element types of tensors. CPU computes in fp32; CUDA stores bf16 and accumulates in fp32.
#pragma once

#include <cstddef>
#include <cstdint>

namespace scmoe {

enum class DType : std::uint8_t { kF32, kBF16, kI32 };

constexpr std::size_t dtype_size(DType t) { return t == DType::kBF16 ? 2 : 4; }

constexpr const char* dtype_name(DType t) {
    switch (t) {
        case DType::kF32: return "f32";
        case DType::kBF16: return "bf16";
        case DType::kI32: return "i32";
    }
    return "?";
}

}  // namespace scmoe
