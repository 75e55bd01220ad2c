#include "kernels/grouped_gemm.h"

#include <string_view>

#include "kernels/error.h"

namespace scmoe {

const char* grouped_gemm_provider_name(GroupedGemmProvider p, Backend backend) {
    switch (p) {
        case GroupedGemmProvider::kAuto: return "auto";
        case GroupedGemmProvider::kLoop: return backend == Backend::kCpu ? "blas-loop" : "cublas-loop-hostsync";
        case GroupedGemmProvider::kCublasStridedBatched: return "cublas-batched";
        case GroupedGemmProvider::kDeviceGrouped: return "device-grouped";
    }
    return "?";
}

GroupedGemmProvider parse_grouped_gemm_provider(const char* name) {
    std::string_view n = name;
    if (n == "auto") return GroupedGemmProvider::kAuto;
    if (n == "loop" || n == "blas-loop" || n == "cublas-loop-hostsync") return GroupedGemmProvider::kLoop;
    if (n == "cublas-batched") return GroupedGemmProvider::kCublasStridedBatched;
    if (n == "device-grouped") return GroupedGemmProvider::kDeviceGrouped;
    SCMOE_FAIL("unknown grouped GEMM provider '" << n << "': expected auto, loop, cublas-batched or device-grouped");
}

}  // namespace scmoe
