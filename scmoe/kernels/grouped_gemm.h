// Grouped GEMM: one GEMM per expert over the expert's rows of a permuted buffer.
//
// Rows of group g are [group_offsets[g], group_offsets[g + 1]) of the row dimension; the offsets
// live in stream memory (device memory on CUDA), so providers that read them on the device need no
// host sync. Empty groups and heavily skewed loads are normal inputs. All matrices row-major.
//
//   kForward:    C[rows_g, n] = A[rows_g, k] * B[g][k, n]         B: [groups, k, n]
//   kGradInput:  C[rows_g, k] = A[rows_g, n] * B[g][k, n]^T       (A = dOut, B = forward weights)
//   kGradWeight: C[g][k, n]   = A[rows_g, k]^T * B[rows_g, n]      C: [groups, k, n]; empty group -> 0
//                (accumulate: C[g] += A^T * B, an empty group's C[g] unchanged)
//
// Rows outside every group (capacity padding past total_rows) are not written by kForward and
// kGradInput.
#pragma once

#include <cstdint>
#include <string>

#include "scmoe/kernels/device.h"
#include "scmoe/kernels/dtype.h"
#include "scmoe/kernels/op_cost.h"

namespace scmoe {

enum class GroupedGemmKind { kForward, kGradInput, kGradWeight };

// Where each provider stands (CUDA): cutlass-grouped is meant to be the fast path wherever it is
// built and supported (CUTLASS's tuned kernels; not yet benchmarked here against device-grouped);
// device-grouped stays as the fallback for shapes CUTLASS refuses and as a second reference; loop is
// the reference every other provider is tested against.
enum class GroupedGemmProvider {
    kAuto,              // CPU: kLoop. CUDA: kCutlassGrouped when built and supported (see
                        // resolve_grouped_gemm_provider); else kCublasStridedBatched when
                        // rows_per_group > 0, else kDeviceGrouped for bf16, else kLoop.
    kLoop,              // Reference: one GEMM per group. On CUDA it copies the offsets to the host
                        // (a stream sync per call), hence the name "cublas-loop-hostsync".
    kCublasStridedBatched,  // CUDA, capacity mode only (rows_per_group > 0): one strided batched GEMM.
    kDeviceGrouped,     // CUDA: scmoe's own bf16 WMMA kernel (sm_80+, about 25-40 % of H100 peak);
                        // reads the offsets on the device. Takes any k, n; kept as the fallback.
    kCutlassGrouped,    // CUDA, built when CMake finds CUTLASS: CUTLASS grouped GEMM, offsets read on
                        // the device (no host sync). sm_90: TMA + WGMMA persistent kernel (sm_90a);
                        // sm_80..sm_89 (and other devices, explicitly requested): CUTLASS 2.x
                        // GemmGrouped. bf16 inputs; bf16 output for kForward/kGradInput, f32 for
                        // kGradWeight; k and n multiples of 8 (see cutlass_grouped_gemm_unsupported).
};

const char* grouped_gemm_provider_name(GroupedGemmProvider p, Backend backend);
// Parses "auto", "loop", "cublas-batched", "device-grouped", "cutlass-grouped"; throws on anything else.
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
    // kGradWeight only: add into C instead of overwriting it (gradient accumulation over
    // micro-batches). Every provider but cutlass-grouped takes it; auto then picks another.
    bool accumulate = false;
    // cutlass-grouped: the most SMs its persistent grid takes (0: every SM). A persistent kernel holds
    // its SMs for its whole run, so a kernel meant to run beside it (an exchange's NCCL kernels) can
    // only start on SMs it leaves free. The other providers ignore it (cublas-loop and cublas-batched
    // follow the stream's SM budget through cuBLAS). grouped_gemm() lowers it to the stream's SM
    // budget (grouped_gemm_sm_limit), so callers normally leave it 0 and set the budget instead.
    int sm_limit = 0;
};

// Enqueues the grouped GEMM on `stream` with sm_limit = grouped_gemm_sm_limit(args, stream).
void grouped_gemm(const GroupedGemmArgs& args, Stream& stream,
                  GroupedGemmProvider provider = GroupedGemmProvider::kAuto);

// The sm_limit a grouped GEMM enqueued on `stream` now runs with: the smaller of args.sm_limit and
// the stream's SM budget (Stream::set_sm_budget), ignoring whichever is 0; 0 when neither limits it.
int grouped_gemm_sm_limit(const GroupedGemmArgs& args, const Stream& stream);

// ---- Provider choice (host-only logic; public so tests and benchmarks can see what auto picks) ----

// Whether this build of scmoe has provider `p` (kCutlassGrouped: CUTLASS was found at configure time).
bool grouped_gemm_provider_built(GroupedGemmProvider p);

// What the choice depends on besides the arguments: the stream's backend and, on CUDA, its device.
struct GroupedGemmTarget {
    Backend backend = Backend::kCpu;
    int cc_major = 0;            // CUDA compute capability of the stream's device (0 on other backends)
    int cc_minor = 0;
    bool cutlass_built = false;  // grouped_gemm_provider_built(kCutlassGrouped) for this library
};

// The target of `stream`: its backend and, on CUDA, its device's compute capability.
GroupedGemmTarget grouped_gemm_target(Stream& stream);

// Most groups cutlass-grouped takes: its per-group arrays live in the stream's 1 MiB device scratch.
constexpr int kCutlassGroupedMaxGroups = 4096;

// "" when cutlass-grouped can run `args` on `target`; otherwise why not, ending with what to use
// instead. Needs: CUDA backend, built, compute capability 8.0 or newer, ab_dtype bf16, c_dtype bf16
// (kForward, kGradInput) or f32 (kGradWeight), k and n positive multiples of 8 (16-byte rows for TMA
// and 128-bit loads), a, b and c 16-byte aligned, k, n and max_rows below 2^31, and
// num_groups <= kCutlassGroupedMaxGroups.
std::string cutlass_grouped_gemm_unsupported(const GroupedGemmArgs& args, const GroupedGemmTarget& target);

// What cutlass-grouped did in this process (all devices and streams), for tests and diagnostics.
// SCMOE_CUTLASS_ARCH=sm80 runs the CUTLASS 2.x path on sm_90 too (the A100 kernel on a Hopper GPU);
// SCMOE_CUTLASS_TRACE=1 prints every call (path, kind, groups, grid, whether it was initialized) to stderr.
struct CutlassGroupedStats {
    long long sm90_calls = 0;       // GEMMs run by the Hopper path (TMA + WGMMA)
    long long sm80_calls = 0;       // GEMMs run by the CUTLASS 2.x path
    long long initializations = 0;  // GEMMs initialized: once per (stream, path, kind, groups, grid)
    int last_grid = 0;              // the persistent grid of the last call, in blocks (sm90: one per SM)
    int device_sms = 0;             // the SMs of the last call's device
};
CutlassGroupedStats cutlass_grouped_stats();

// The provider that runs `args` when `requested` is asked for on `target`: kAuto resolved (CUDA:
// cutlass-grouped when supported and the device is sm_80..sm_90, where its kernels are native;
// otherwise the choice described at kAuto); any other request is returned unchanged.
GroupedGemmProvider resolve_grouped_gemm_provider(const GroupedGemmArgs& args, GroupedGemmProvider requested,
                                                  const GroupedGemmTarget& target);

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
            // Written once; read once more when accumulating.
            c.bytes = ab * (r * k + r * n) + (a.accumulate ? 2.0 : 1.0) * cs * static_cast<double>(a.num_groups) * k * n;
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
