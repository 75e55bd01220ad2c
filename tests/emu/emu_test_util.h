// A GPU spec with round numbers, so expected model times can be worked out by hand.
#pragma once

#include "scmoe/kernels/emu/gpu_spec.h"

namespace scmoe::test {

inline emu::GpuSpec round_spec() {
    emu::GpuSpec s;
    s.name = "round";
    s.description = "a GPU with round numbers";
    s.bf16_tflops = 100;           // 1e8 FLOP per us
    s.fp32_tflops = 10;
    s.hbm_gbps = 1000;             // 1e3 bytes per ns = 1e6 bytes per us
    s.memory_bytes = 1ull << 30;   // 1 GiB
    s.sms = 100;
    s.threads_per_sm = 1000;
    s.host_link_gbps = 10;         // 1e4 bytes per us
    s.gemm_efficiency = 1.0;
    s.bandwidth_efficiency = 1.0;
    s.launch_us = 2;
    s.kernel_gap_us = 1;
    s.host_task_us = 10;
    s.sync_us = 3;
    return s;
}

}  // namespace scmoe::test
