// OpCost: what one op does, in FLOPs and device-memory bytes, defined once per op next to its
// declaration (`op_cost(args)` in kernels/<op>.h). Benchmarks divide these by measured time for
// TFLOP/s and GB/s; the emulated GPU (scmoe/kernels/emu/) turns them into modeled time. Counting rules:
//   flops: a multiply-add is 2; the dominant arithmetic only (softmax exponentials and the like in a
//          memory-bound op are not counted).
//   bytes: every operand read once and every result written once at its dtype (the minimum traffic
//          of a fused kernel; caches are not modeled).
//   threads: independent work items the op can spread over the GPU (GEMMs: output tiles times the
//          threads of a tile's block), for how much of the GPU it can fill alone.
#pragma once

#include <algorithm>
#include <cstdint>

#include "scmoe/kernels/dtype.h"

namespace scmoe {

enum class OpUnit {
    kTensor,  // matrix FLOPs on tensor cores (GEMMs, attention)
    kVector,  // CUDA cores: elementwise, reductions, scans
};

struct OpCost {
    double flops = 0;
    double bytes = 0;
    double threads = 0;
    OpUnit unit = OpUnit::kVector;
    // GEMM-shaped ops: the shape of one (the largest) GEMM, for the efficiency curve by shape.
    std::int64_t gemm_m = 0, gemm_n = 0, gemm_k = 0;
    std::int64_t gemm_count = 0;  // GEMMs in the op (groups of a grouped GEMM)
    // A tensor op whose kernel is known to reach another rate than the GEMM model's: a factor (> 0)
    // on it (the emulator's fused attention, GpuSpec::fused_attention). 1: the GEMM model as is.
    double efficiency = 1.0;
};

// Threads a GEMM kernel runs: one 256-thread block per 128x128 output tile (the tile of
// scmoe/kernels/cuda/grouped_gemm_kernel.cu and of cuBLAS's large bf16 kernels).
inline double gemm_threads(std::int64_t m, std::int64_t n) {
    const auto tiles = static_cast<double>((m + 127) / 128) * static_cast<double>((n + 127) / 128);
    return tiles * 256.0;
}

// An elementwise or row-wise op that reads `read` and writes `written` elements of `dtype` and does
// `flops_per_element` of arithmetic per element written (4 elements per thread).
inline OpCost elementwise_cost(std::int64_t read, std::int64_t written, DType dtype, double flops_per_element = 1.0) {
    OpCost c;
    const double size = static_cast<double>(dtype_size(dtype));
    c.bytes = size * static_cast<double>(read + written);
    c.flops = flops_per_element * static_cast<double>(written);
    c.threads = static_cast<double>(std::max(read, written)) / 4.0;
    return c;
}

// The sum of two costs run as one op (e.g. a forward and its saved statistics).
inline OpCost operator+(OpCost a, const OpCost& b) {
    a.flops += b.flops;
    a.bytes += b.bytes;
    a.threads = std::max(a.threads, b.threads);
    return a;
}

}  // namespace scmoe
