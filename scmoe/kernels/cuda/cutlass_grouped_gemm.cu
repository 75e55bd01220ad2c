// The cutlass-grouped provider's entry: checks the arguments, zeroes the weight gradients of empty
// groups, takes the per-group arrays and CUTLASS's workspace from the stream's scratch, and runs the
// Hopper path on sm_90 (when built) or the CUTLASS 2.x path elsewhere.
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <string_view>

#include "scmoe/kernels/cuda/check.cuh"
#include "scmoe/kernels/cuda/cutlass_grouped_gemm.cuh"
#include "scmoe/kernels/cuda/stream_resources.cuh"

#ifndef SCMOE_CUTLASS_SM90
#define SCMOE_CUTLASS_SM90 0
#endif

namespace scmoe::cuda {
namespace {

// kGradWeight: C[g] = 0 for every group without rows (CUTLASS is given no tiles for those groups).
// Grid (chunks, groups); every block of a non-empty group returns at once.
__global__ void zero_empty_weight_groups(const std::int32_t* offsets, long long max_rows, long long group_elems,
                                         float* c) {
    const int g = static_cast<int>(blockIdx.y);
    const cutlass_grouped::RowRange rows = cutlass_grouped::group_rows(offsets, max_rows, g);
    if (rows.hi > rows.lo) return;
    float* out = c + static_cast<long long>(g) * group_elems;
    const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
    for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < group_elems; i += stride)
        out[i] = 0.0f;
}

// The persistent kernels size their grids by it; cached per device.
int sm_count(int device) {
    static std::mutex mutex;
    static std::map<int, int> counts;
    std::scoped_lock lock(mutex);
    auto it = counts.find(device);
    if (it != counts.end()) return it->second;
    int count = 0;
    SCMOE_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
    counts.emplace(device, count);
    return count;
}

// SCMOE_CUTLASS_ARCH: which path runs on an sm_90 device: sm90 (the default where built) or sm80
// (the CUTLASS 2.x kernel, which an A100 runs; to test it on a Hopper GPU).
bool sm80_path_forced() {
    const char* v = std::getenv("SCMOE_CUTLASS_ARCH");
    const std::string_view arch = v == nullptr ? "" : v;
    SCMOE_CHECK(arch.empty() || arch == "auto" || arch == "sm80" || arch == "sm90",
                "SCMOE_CUTLASS_ARCH='" << arch << "': auto, sm80 or sm90");
    return arch == "sm80";
}

bool trace_enabled() {
    const char* v = std::getenv("SCMOE_CUTLASS_TRACE");
    return v != nullptr && *v != 0 && std::string_view(v) != "0";
}

}  // namespace

void cutlass_grouped_gemm(const GroupedGemmArgs& a, const GroupedGemmTarget& target, cudaStream_t stream) {
    const std::string why = cutlass_grouped_gemm_unsupported(a, target);
    SCMOE_CHECK(why.empty(), why);
    if (a.num_groups == 0) return;
    if (a.kind == GroupedGemmKind::kGradWeight) {
        constexpr int kThreads = 256;
        const long long group_elems = a.k * a.n;
        const unsigned int chunks = blocks_for(group_elems, kThreads, 64);
        zero_empty_weight_groups<<<dim3(chunks, static_cast<unsigned int>(a.num_groups)), kThreads, 0, stream>>>(
            a.group_offsets, a.max_rows, group_elems, static_cast<float*>(a.c));
        SCMOE_CUDA_CHECK_LAUNCH("zero_empty_weight_groups");
    }
    if (a.max_rows == 0) return;  // every group is empty

    StreamResources& res = stream_resources(stream);
    cutlass_grouped::Launch l;
    l.kind = a.kind;
    l.num_groups = a.num_groups;
    l.k = a.k;
    l.n = a.n;
    l.max_rows = a.max_rows;
    l.offsets = a.group_offsets;
    l.a = a.a;
    l.b = a.b;
    l.c = a.c;
    l.device = res.device;
    l.device_sms = sm_count(res.device);
    l.sm_count = a.sm_limit > 0 && a.sm_limit < l.device_sms ? a.sm_limit : l.device_sms;
    l.trace = trace_enabled();
    // The scratch is free between ops on one stream (stream_resources.cuh), so the arrays the setup
    // kernel writes stay valid until the GEMM that reads them has run.
    const bool sm80_forced = sm80_path_forced();
#if SCMOE_CUTLASS_SM90
    if (target.cc_major == 9 && target.cc_minor == 0 && !sm80_forced) {
        cutlass_grouped::run_sm90(l, res, stream);
        return;
    }
#endif
    cutlass_grouped::run_sm80(l, res, stream);
}

}  // namespace scmoe::cuda
