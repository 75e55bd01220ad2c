// Private: the cutlass-grouped provider (scmoe/kernels/grouped_gemm.h) -- CUTLASS grouped GEMMs whose
// per-group problem shapes, pointers and strides a small kernel builds on the device from the group
// offsets, so nothing waits for the host. Two architecture paths, one translation unit each:
//   cutlass_grouped_gemm_sm90.cu  CUTLASS 3.x ptr-array grouped GEMM (TMA + WGMMA, persistent), sm_90a only
//   cutlass_grouped_gemm_sm80.cu  CUTLASS 2.x GemmGrouped (device-only schedule), sm_80 and newer
// cutlass_grouped_gemm.cu validates, carves the stream's scratch and picks the path by compute capability.
//
// Every kind is one GEMM per group, D[m, n] = A[m, k] * B[k, n] in CUTLASS's terms:
//   kForward:    m = rows_g, n = n, k = k;     A row-major [rows, k];  B row-major [k, n] (W_g);   D bf16 row-major
//   kGradInput:  m = rows_g, n = k, k = n;     A row-major [rows, n];  B column-major = W_g^T;     D bf16 row-major
//   kGradWeight: m = k, n = n, k = rows_g;     A column-major = X_g^T; B row-major [rows, n];      D f32 row-major
// Every leading dimension is k or n (never a row count), which is why k % 8 == n % 8 == 0 suffices
// for 16-byte aligned rows of every group.
//
// A GEMM's CUTLASS parameters depend only on (path, kind, groups, grid): the per-group arrays sit at
// fixed places of the stream's scratch and the sizes are read on the device. So each path initializes
// a GEMM once per stream and key (TMA descriptors, attributes, the launch preflight) and later calls
// only launch it (GemmCache). CUTLASS reads and so clears CUDA's error itself and reports any failure
// as "Error Internal"; the preflight (check_launchable) asks CUDA first, so a kernel that cannot run
// here fails with CUDA's reason.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>

#include "scmoe/kernels/error.h"
#include "scmoe/kernels/cuda/stream_resources.cuh"
#include "scmoe/kernels/grouped_gemm.h"

namespace scmoe::detail {
// scmoe/kernels/grouped_gemm.cpp: counts what cutlass_grouped_stats() reports.
void note_cutlass_grouped_call(bool sm90, bool initialized, int grid, int device_sms);
}  // namespace scmoe::detail

namespace scmoe::cuda {

// Runs `args` with the cutlass-grouped provider; throws scmoe::Error (with what to use instead)
// for arguments it does not take. `target` is the stream device's (see grouped_gemm.cu).
void cutlass_grouped_gemm(const GroupedGemmArgs& args, const GroupedGemmTarget& target, cudaStream_t stream);

namespace cutlass_grouped {

// One call, as the architecture paths see it (passed by value to the setup kernels).
struct Launch {
    GroupedGemmKind kind = GroupedGemmKind::kForward;
    int num_groups = 0;
    long long k = 0, n = 0, max_rows = 0;
    const std::int32_t* offsets = nullptr;  // [num_groups + 1], device memory
    const void* a = nullptr;                // bf16
    const void* b = nullptr;                // bf16
    void* c = nullptr;                      // bf16 (kForward, kGradInput) or f32 (kGradWeight)
    int device = 0;
    int device_sms = 0;  // the device's SMs
    int sm_count = 0;    // the SMs the persistent grid may take (GroupedGemmArgs::sm_limit applied)
    bool trace = false;  // SCMOE_CUTLASS_TRACE=1: print the call to stderr
};

inline const char* kind_name(GroupedGemmKind k) {
    switch (k) {
        case GroupedGemmKind::kForward: return "forward";
        case GroupedGemmKind::kGradInput: return "grad-input";
        case GroupedGemmKind::kGradWeight: return "grad-weight";
    }
    return "?";
}

// Throws, with CUDA's reason, unless `kernel` can run on the current device with `threads` threads and
// `smem` bytes of dynamic shared memory per block: its image loads (sm_90a code on a non-sm_90a device
// does not), the shared memory can be granted, and at least one block fits an SM.
template <class Kernel>
void check_launchable(Kernel* kernel, int threads, int smem, const char* what) {
    cudaFuncAttributes attr{};
    cudaError_t e = cudaFuncGetAttributes(&attr, kernel);
    SCMOE_CHECK(e == cudaSuccess, "grouped gemm provider cutlass-grouped (" << what << "): the kernel cannot be loaded: "
                                      << cudaGetErrorString(e) << "; use device-grouped");
    if (smem >= (48 << 10)) {
        e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
        SCMOE_CHECK(e == cudaSuccess, "grouped gemm provider cutlass-grouped ("
                                          << what << "): " << smem << " bytes of shared memory per block refused: "
                                          << cudaGetErrorString(e) << "; use device-grouped");
    }
    int blocks = 0;
    e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, static_cast<std::size_t>(smem));
    SCMOE_CHECK(e == cudaSuccess && blocks > 0,
                "grouped gemm provider cutlass-grouped ("
                    << what << "): no block of " << threads << " threads with " << smem << " bytes of shared memory and "
                    << attr.numRegs << " registers per thread fits an SM"
                    << (e == cudaSuccess ? std::string() : std::string(": ") + cudaGetErrorString(e))
                    << "; use device-grouped");
}

// The initialized GEMMs of one stream (StreamResources::cutlass), by (path, kind, groups, grid).
struct CachedGemm {
    virtual ~CachedGemm() = default;
    int grid = 0;  // blocks of the persistent grid
};
template <class Gemm>
struct CachedGemmOf : CachedGemm {
    Gemm gemm;
};
struct GemmCache : StreamExtension {
    std::map<std::array<int, 4>, std::unique_ptr<CachedGemm>> gemms;
};
inline GemmCache& gemm_cache(StreamResources& res) {
    if (!res.cutlass) res.cutlass = std::make_unique<GemmCache>();
    return static_cast<GemmCache&>(*res.cutlass);
}

inline void trace_call(const Launch& l, const char* path, int grid, bool initialized) {
    if (!l.trace) return;
    std::fprintf(stderr,
                 "scmoe cutlass-grouped: %s %s groups=%d k=%lld n=%lld max_rows=%lld grid=%d blocks (%d of %d SMs)%s\n",
                 path, kind_name(l.kind), l.num_groups, l.k, l.n, l.max_rows, grid, l.sm_count, l.device_sms,
                 initialized ? ", initialized" : "");
}

// Group g's GEMM in CUTLASS's terms (see the table above); leading dimensions in elements.
struct Problem {
    int m = 0, n = 0, k = 0;
    const void* a = nullptr;
    const void* b = nullptr;
    void* d = nullptr;
    long long lda = 0, ldb = 0, ldd = 0;
};

// Group g's rows [lo, hi) of the row buffers.
// NOTES: offsets are clamped to [0, max_rows] (as device-grouped does), so a bad offset cannot make
// a group read or write outside the row buffers.
struct RowRange {
    long long lo = 0, hi = 0;
};
__device__ __forceinline__ RowRange group_rows(const std::int32_t* offsets, long long max_rows, int g) {
    long long lo = offsets[g], hi = offsets[g + 1];
    lo = lo < 0 ? 0 : (lo > max_rows ? max_rows : lo);
    hi = hi < lo ? lo : (hi > max_rows ? max_rows : hi);
    return {lo, hi};
}

// NOTES: an empty kGradWeight group gets m = 0 (no tiles): a k = 0 tile would store uninitialised
// accumulators in the sm90 kernel, so the entry's zero_empty_weight_groups writes its zeros instead.
__device__ __forceinline__ Problem group_problem(const Launch& l, int g) {
    const auto [lo, hi] = group_rows(l.offsets, l.max_rows, g);
    const long long rows = hi - lo;
    const auto* A = static_cast<const char*>(l.a);
    const auto* B = static_cast<const char*>(l.b);
    auto* C = static_cast<char*>(l.c);
    constexpr long long kAb = 2;  // bf16
    Problem p;
    switch (l.kind) {
        case GroupedGemmKind::kForward:
            p.m = static_cast<int>(rows), p.n = static_cast<int>(l.n), p.k = static_cast<int>(l.k);
            p.a = A + lo * l.k * kAb, p.lda = l.k;
            p.b = B + g * l.k * l.n * kAb, p.ldb = l.n;
            p.d = C + lo * l.n * 2, p.ldd = l.n;
            break;
        case GroupedGemmKind::kGradInput:
            p.m = static_cast<int>(rows), p.n = static_cast<int>(l.k), p.k = static_cast<int>(l.n);
            p.a = A + lo * l.n * kAb, p.lda = l.n;
            p.b = B + g * l.k * l.n * kAb, p.ldb = l.n;
            p.d = C + lo * l.k * 2, p.ldd = l.k;
            break;
        case GroupedGemmKind::kGradWeight:
            p.m = rows > 0 ? static_cast<int>(l.k) : 0, p.n = static_cast<int>(l.n), p.k = static_cast<int>(rows);
            p.a = A + lo * l.k * kAb, p.lda = l.k;
            p.b = B + lo * l.n * kAb, p.ldb = l.n;
            p.d = C + g * l.k * l.n * 4, p.ldd = l.n;
            break;
    }
    return p;
}

// Hands out 256-byte aligned pieces of the stream's scratch; throws when it runs out.
class ScratchCarver {
  public:
    ScratchCarver(void* base, std::size_t bytes) : base_(static_cast<char*>(base)), bytes_(bytes) {}
    template <class T>
    T* take(std::size_t count, const char* what) {
        used_ = (used_ + 255) / 256 * 256;
        const std::size_t need = count * sizeof(T);
        SCMOE_CHECK(used_ + need <= bytes_, "grouped gemm provider cutlass-grouped: "
                                                << what << " (" << need << " bytes) does not fit the stream's "
                                                << bytes_ << "-byte scratch after " << used_
                                                << " bytes; use fewer groups or device-grouped");
        T* p = reinterpret_cast<T*>(base_ + used_);
        used_ += need;
        return p;
    }

  private:
    char* base_;
    std::size_t bytes_;
    std::size_t used_ = 0;
};

// The architecture paths: build the per-group arrays in the stream's scratch (device code, no host
// sync), then run CUTLASS on `stream`, initializing it first when `res` has no GEMM for the call's key.
// Arguments already validated (cutlass_grouped_gemm_unsupported).
void run_sm80(const Launch& l, StreamResources& res, cudaStream_t stream);
void run_sm90(const Launch& l, StreamResources& res, cudaStream_t stream);

}  // namespace cutlass_grouped
}  // namespace scmoe::cuda
