// Whether a GPU test may skip (review L3): only when no GPU is there. When nvidia-smi lists a GPU
// but CUDA answers with no device (a CUDA 13 runtime on an older driver reports
// cudaErrorInsufficientDriver), the GPU tests fail with CUDA's reason instead of skipping silently.
#pragma once

#include <cstdio>
#include <sstream>
#include <string>

namespace scmoe::testing {

// True when `list` (the output of `nvidia-smi -L`) names a GPU: a line "GPU <n>: <name> ...".
inline bool lists_gpu(const std::string& list) {
    std::istringstream lines(list);
    for (std::string line; std::getline(lines, line);) {
        std::size_t i = 0;
        if (line.rfind("GPU ", 0) != 0) continue;
        for (i = 4; i < line.size() && line[i] >= '0' && line[i] <= '9'; ++i) {
        }
        if (i > 4 && i < line.size() && line[i] == ':') return true;
    }
    return false;
}

// The output of `nvidia-smi -L` ("" when nvidia-smi is missing or fails).
inline std::string nvidia_smi_list() {
    std::string out;
    if (FILE* p = popen("nvidia-smi -L 2>/dev/null", "r")) {
        char buf[256];
        while (std::fgets(buf, sizeof buf, p)) out += buf;
        pclose(p);
    }
    return out;
}

enum class GpuTestAction { kRun, kSkip, kFail };

inline GpuTestAction gpu_test_action(bool cuda_device_available, bool nvidia_smi_lists_gpu) {
    if (cuda_device_available) return GpuTestAction::kRun;
    return nvidia_smi_lists_gpu ? GpuTestAction::kFail : GpuTestAction::kSkip;
}

}  // namespace scmoe::testing
