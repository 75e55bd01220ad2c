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

}  // namespace scmoe
