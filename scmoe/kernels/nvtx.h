// NVTX ranges (NVIDIA Tools Extension, nvtx3: header-only, in the CUDA toolkit) in the "scmoe"
// domain. Nsight Systems shows a range on the host thread's row and projects it onto the kernels
// launched inside it, so every scheduled op and exchange appears under the name its Perfetto trace
// entry has (scmoe/moe/trace.h: run_op). Without the CUDA backend these are no-ops; with it and no
// profiler attached, a range costs a null-pointer check.
#pragma once

#include <string>
#include <vector>

namespace scmoe {

class NvtxRange {
public:
    // comm: communication (colored apart from compute in the profiler).
    explicit NvtxRange(const std::string& name, bool comm = false);
    ~NvtxRange();
    NvtxRange(const NvtxRange&) = delete;
    NvtxRange& operator=(const NvtxRange&) = delete;
};

// Test hook: while set, the calling thread's ranges are also appended here by name.
void set_nvtx_log(std::vector<std::string>* log);

}  // namespace scmoe
