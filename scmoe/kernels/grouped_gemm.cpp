#include "scmoe/kernels/grouped_gemm.h"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <sstream>
#include <string_view>

#include "scmoe/kernels/error.h"
#if SCMOE_WITH_CUDA
#include "scmoe/kernels/cuda/cuda_ops.h"
#endif

#ifndef SCMOE_WITH_CUTLASS
#define SCMOE_WITH_CUTLASS 0
#endif

namespace scmoe {

const char* grouped_gemm_provider_name(GroupedGemmProvider p, Backend backend) {
    switch (p) {
        case GroupedGemmProvider::kAuto: return "auto";
        case GroupedGemmProvider::kLoop: return backend == Backend::kCpu ? "blas-loop" : "cublas-loop-hostsync";
        case GroupedGemmProvider::kCublasStridedBatched: return "cublas-batched";
        case GroupedGemmProvider::kDeviceGrouped: return "device-grouped";
        case GroupedGemmProvider::kCutlassGrouped: return "cutlass-grouped";
    }
    return "?";
}

GroupedGemmProvider parse_grouped_gemm_provider(const char* name) {
    std::string_view n = name;
    if (n == "auto") return GroupedGemmProvider::kAuto;
    if (n == "loop" || n == "blas-loop" || n == "cublas-loop-hostsync") return GroupedGemmProvider::kLoop;
    if (n == "cublas-batched") return GroupedGemmProvider::kCublasStridedBatched;
    if (n == "device-grouped") return GroupedGemmProvider::kDeviceGrouped;
    if (n == "cutlass-grouped") return GroupedGemmProvider::kCutlassGrouped;
    SCMOE_FAIL("unknown grouped GEMM provider '"
               << n << "': expected auto, loop, cublas-batched, device-grouped or cutlass-grouped");
}

bool grouped_gemm_provider_built(GroupedGemmProvider p) {
    switch (p) {
        case GroupedGemmProvider::kAuto:
        case GroupedGemmProvider::kLoop:
            return true;
        case GroupedGemmProvider::kCublasStridedBatched:
        case GroupedGemmProvider::kDeviceGrouped:
            return SCMOE_WITH_CUDA != 0;
        case GroupedGemmProvider::kCutlassGrouped:
            return SCMOE_WITH_CUDA != 0 && SCMOE_WITH_CUTLASS != 0;
    }
    return false;
}

int grouped_gemm_sm_limit(const GroupedGemmArgs& args, const Stream& stream) {
    const int budget = stream.sm_budget();
    if (budget <= 0 || args.sm_limit < 0) return args.sm_limit;  // a negative limit is refused by the provider
    return args.sm_limit == 0 ? budget : std::min(args.sm_limit, budget);
}

GroupedGemmTarget grouped_gemm_target(Stream& stream) {
#if SCMOE_WITH_CUDA
    if (stream.backend() == Backend::kCuda) return cuda::grouped_gemm_target(stream.native_handle());
#endif
    GroupedGemmTarget t;
    t.backend = stream.backend();
    t.cutlass_built = grouped_gemm_provider_built(GroupedGemmProvider::kCutlassGrouped);
    return t;
}

namespace {

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

}  // namespace

std::string cutlass_grouped_gemm_unsupported(const GroupedGemmArgs& a, const GroupedGemmTarget& t) {
    std::ostringstream why;
    constexpr const char* kInstead = "; use device-grouped (any k, n), cublas-batched (capacity mode) or loop";
    if (t.backend != Backend::kCuda) {
        why << "grouped gemm provider cutlass-grouped needs the CUDA backend, not " << backend_name(t.backend)
            << "; the CPU backend has auto and loop";
    } else if (!t.cutlass_built) {
        why << "grouped gemm provider cutlass-grouped is not built: configure scmoe with CUTLASS (python3 -m pip "
               "install 'nvidia-cutlass>=4,<5', or set CUTLASS_HOME)"
            << kInstead;
    } else if (t.cc_major < 8) {
        why << "grouped gemm provider cutlass-grouped needs compute capability 8.0 or newer (bf16 tensor cores), got "
            << t.cc_major << "." << t.cc_minor << kInstead;
    } else if (a.ab_dtype != DType::kBF16) {
        why << "grouped gemm provider cutlass-grouped takes bf16 inputs, got " << dtype_name(a.ab_dtype) << kInstead;
    } else if (a.kind == GroupedGemmKind::kGradWeight ? a.c_dtype != DType::kF32 : a.c_dtype != DType::kBF16) {
        why << "grouped gemm provider cutlass-grouped writes "
            << (a.kind == GroupedGemmKind::kGradWeight ? "f32 weight gradients" : "bf16 rows") << ", got c_dtype "
            << dtype_name(a.c_dtype) << kInstead;
    } else if (a.k <= 0 || a.n <= 0 || a.k % 8 != 0 || a.n % 8 != 0) {
        why << "grouped gemm provider cutlass-grouped needs k and n to be positive multiples of 8 (16-byte rows of "
               "bf16), got k "
            << a.k << ", n " << a.n << kInstead;
    } else if (!aligned16(a.a) || !aligned16(a.b) || !aligned16(a.c)) {
        why << "grouped gemm provider cutlass-grouped needs a, b and c 16-byte aligned" << kInstead;
    } else if (a.k > INT_MAX || a.n > INT_MAX || a.max_rows > INT_MAX) {
        why << "grouped gemm provider cutlass-grouped takes k, n and max_rows below 2^31, got k " << a.k << ", n "
            << a.n << ", max_rows " << a.max_rows << kInstead;
    } else if (a.num_groups > kCutlassGroupedMaxGroups) {
        why << "grouped gemm provider cutlass-grouped takes at most " << kCutlassGroupedMaxGroups << " groups, got "
            << a.num_groups << kInstead;
    } else if (a.accumulate) {
        why << "grouped gemm provider cutlass-grouped overwrites C; accumulating weight gradients (accumulate) needs "
               "another provider"
            << kInstead;
    } else if (a.sm_limit < 0) {
        why << "grouped gemm provider cutlass-grouped: sm_limit " << a.sm_limit << " is negative (0: every SM)";
    }
    return why.str();
}

namespace {
struct CutlassGroupedCounters {
    std::atomic<long long> sm90_calls{0}, sm80_calls{0}, initializations{0};
    std::atomic<int> last_grid{0}, device_sms{0};
};
CutlassGroupedCounters& cutlass_grouped_counters() {
    static CutlassGroupedCounters counters;
    return counters;
}
}  // namespace

CutlassGroupedStats cutlass_grouped_stats() {
    const CutlassGroupedCounters& c = cutlass_grouped_counters();
    return {c.sm90_calls.load(), c.sm80_calls.load(), c.initializations.load(), c.last_grid.load(),
            c.device_sms.load()};
}

namespace detail {
void note_cutlass_grouped_call(bool sm90, bool initialized, int grid, int device_sms) {
    CutlassGroupedCounters& c = cutlass_grouped_counters();
    (sm90 ? c.sm90_calls : c.sm80_calls).fetch_add(1);
    if (initialized) c.initializations.fetch_add(1);
    c.last_grid.store(grid);
    c.device_sms.store(device_sms);
}
}  // namespace detail

GroupedGemmProvider resolve_grouped_gemm_provider(const GroupedGemmArgs& a, GroupedGemmProvider requested,
                                                  const GroupedGemmTarget& t) {
    if (requested != GroupedGemmProvider::kAuto) return requested;
    if (t.backend != Backend::kCuda) return GroupedGemmProvider::kLoop;
    // Native kernels only: sm_8x runs the CUTLASS 2.x kernel's sm_80 code, sm_90 the Hopper kernel;
    // newer devices would JIT PTX built for older ones, so auto leaves them to the other providers.
    const bool native = t.cc_major == 8 || t.cc_major == 9;
    if (native && cutlass_grouped_gemm_unsupported(a, t).empty()) return GroupedGemmProvider::kCutlassGrouped;
    if (a.rows_per_group > 0) return GroupedGemmProvider::kCublasStridedBatched;
    return a.ab_dtype == DType::kBF16 ? GroupedGemmProvider::kDeviceGrouped : GroupedGemmProvider::kLoop;
}

}  // namespace scmoe
