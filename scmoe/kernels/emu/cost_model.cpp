#include "scmoe/kernels/emu/cost_model.h"

#include <algorithm>
#include <cmath>

namespace scmoe::emu {

KernelTime model_kernel(const OpCost& c, const GpuSpec& s, int sm_limit, double gemm_fraction) {
    KernelTime t;
    const double all = static_cast<double>(s.sms);
    const double sms = sm_limit > 0 && sm_limit < s.sms ? static_cast<double>(sm_limit) : all;  // the grid's
    const double fraction = sms / all;
    const double memory_us = c.bytes / (s.hbm_gbps * 1e9 * s.bandwidth_efficiency) * 1e6;
    double compute_us = 0;
    if (c.unit == OpUnit::kTensor) {
        const double tiles = c.threads / 256.0;
        const double waves = std::max(1.0, std::ceil(tiles / sms));
        const double wave_efficiency = tiles > 0 ? std::min(1.0, tiles / (waves * sms)) : 1.0;
        compute_us = c.flops / (s.bf16_tflops * 1e12 * fraction * s.gemm_efficiency * wave_efficiency * gemm_fraction *
                              c.efficiency) * 1e6;
        t.demand = std::min(1.0, tiles / sms) * fraction;
    } else {
        compute_us = c.flops / (s.fp32_tflops * 1e12 * fraction) * 1e6;
        t.demand = std::min(1.0, c.threads / (sms * static_cast<double>(s.threads_per_sm))) * fraction;
    }
    t.work_us = std::max(compute_us, memory_us);
    t.demand = std::max(t.demand, 1.0 / all);  // at least one SM
    return t;
}

double host_copy_us(double bytes, const GpuSpec& s) {
    return bytes / (s.host_link_gbps * s.host_link_efficiency * 1e9) * 1e6;
}

double device_copy_us(double bytes, const GpuSpec& s) {
    return 2.0 * bytes / (s.hbm_gbps * 1e9 * s.bandwidth_efficiency) * 1e6;
}

}  // namespace scmoe::emu
