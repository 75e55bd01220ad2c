// Grouped GEMM: one GEMM per expert over the expert's rows of a permuted buffer.
//
// Rows of group g are [group_offsets[g], group_offsets[g + 1]) of the row dimension; the offsets
// live in stream memory (device memory on CUDA), so providers that read them on the device need no
// host sync. Empty groups and heavily skewed loads are normal inputs. All matrices row-major.
//
//   kForward:    C[rows_g, n] = A[rows_g, k] * B[g][k, n]         B: [groups, k, n]
//   kGradInput:  C[rows_g, k] = A[rows_g, n] * B[g][k, n]^T       (A = dOut, B = forward weights)
//   kGradWeight: C[g][k, n]   = A[rows_g, k]^T * B[rows_g, n]      C: [groups, k, n]; empty group -> 0
//
// Rows outside every group (capacity padding past total_rows) are not written by kForward and
// kGradInput.
#pragma once

#include <cstdint>

#include "kernels/device.h"
#include "kernels/dtype.h"
#include "kernels/op_cost.h"

namespace scmoe {

enum class GroupedGemmKind { kForward, kGradInput, kGradWeight };

enum class GroupedGemmProvider {
    kAuto,              // CPU: kLoop. CUDA: kCublasStridedBatched when rows_per_group > 0, else kDeviceGrouped.
    kLoop,              // Reference: one GEMM per group. On CUDA it copies the offsets to the host
                        // (a stream sync per call), hence the name "cublas-loop-hostsync".
    kCublasStridedBatched,  // CUDA, capacity mode only (rows_per_group > 0): one strided batched GEMM.
    kDeviceGrouped,     // CUDA: scmoe's own bf16 tensor-core kernel; reads the offsets on the device.
};

const char* grouped_gemm_provider_name(GroupedGemmProvider p, Backend backend);
// Parses "auto", "loop", "cublas-batched", "device-grouped"; throws on anything else.
GroupedGemmProvider parse_grouped_gemm_provider(const char* name);

struct GroupedGemmArgs {
    GroupedGemmKind kind = GroupedGemmKind::kForward;
    int num_groups = 0;
    std::int64_t k = 0;               // inner dim of the forward GEMM (hidden for W1)
    std::int64_t n = 0;               // output dim of the forward GEMM
    std::int64_t max_rows = 0;        // bound on group_offsets[num_groups] (size of the row buffers)
    std::int64_t rows_per_group = 0;  // capacity mode: every group has exactly this many rows
                                      // (group_offsets[g] == g * rows_per_group); 0 = ragged
    const std::int32_t* group_offsets = nullptr;  // [num_groups + 1], stream memory
    const void* a = nullptr;
    const void* b = nullptr;
    void* c = nullptr;
    DType ab_dtype = DType::kF32;
    DType c_dtype = DType::kF32;
};

void grouped_gemm(const GroupedGemmArgs& args, Stream& stream,
                  GroupedGemmProvider provider = GroupedGemmProvider::kAuto);

// The cost when `rows` rows (group_offsets[num_groups]) fall into `nonempty_groups` groups: 2*rows*k*n
// FLOPs; the row operands read or written once, and one [k, n] weight per non-empty group. The rows
// live in device memory, so the caller reads them (a benchmark knows them; the emulator reads the
// offsets when the op runs).
inline OpCost op_cost(const GroupedGemmArgs& a, std::int64_t rows, int nonempty_groups) {
    OpCost c;
    const double r = static_cast<double>(rows), k = static_cast<double>(a.k), n = static_cast<double>(a.n);
    const double ab = static_cast<double>(dtype_size(a.ab_dtype)), cs = static_cast<double>(dtype_size(a.c_dtype));
    const double weights = static_cast<double>(nonempty_groups) * k * n;
    c.unit = OpUnit::kTensor;
    c.flops = 2.0 * r * k * n;
    switch (a.kind) {
        case GroupedGemmKind::kForward: c.bytes = ab * (r * k + weights) + cs * r * n; break;
        case GroupedGemmKind::kGradInput: c.bytes = ab * (r * n + weights) + cs * r * k; break;
        case GroupedGemmKind::kGradWeight:
            c.bytes = ab * (r * k + r * n) + cs * static_cast<double>(a.num_groups) * k * n;
            break;
    }
    const std::int64_t per_group = nonempty_groups > 0 ? (rows + nonempty_groups - 1) / nonempty_groups : 0;
    c.gemm_count = nonempty_groups;
    if (a.kind == GroupedGemmKind::kGradWeight) {
        c.gemm_m = a.k, c.gemm_n = a.n, c.gemm_k = per_group;
    } else {
        c.gemm_m = per_group, c.gemm_n = a.kind == GroupedGemmKind::kForward ? a.n : a.k;
        c.gemm_k = a.kind == GroupedGemmKind::kForward ? a.k : a.n;
    }
    c.threads = static_cast<double>(nonempty_groups) * gemm_threads(c.gemm_m, c.gemm_n);
    return c;
}

}  // namespace scmoe
