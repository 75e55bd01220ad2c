// The emulated GPU's time model: an op's OpCost (scmoe/kernels/op_cost.h) and a GpuSpec give the time
// the op takes alone on the GPU and the share of the SMs it can fill.
//
//   time alone = max(flops / (peak * efficiency(shape)), bytes / (hbm_gbps * bandwidth_efficiency))
//   (a roofline: the op is bound by whichever of arithmetic and memory traffic takes longer)
//   tensor ops: peak = bf16_tflops, efficiency = gemm_efficiency * wave_efficiency * OpCost::efficiency, where
//     wave_efficiency = tiles / (waves * SMs), tiles = 128x128 output tiles, waves = ceil(tiles / SMs)
//     (the "wave quantization" of NVIDIA's Matrix Multiplication Background User's Guide: the last
//     wave of tiles leaves SMs idle; small GEMMs fill only tiles/SMs of the GPU);
//     (OpCost::efficiency: what a kernel is known to reach below that, e.g. fused attention, GpuSpec::fused_attention);
//   vector ops: peak = fp32_tflops, bandwidth-bound in practice.
//   demand (share of the SMs it fills alone) = min(1, threads / (SMs * threads per SM)); for tensor
//     ops one 256-thread tile block per SM fills it: min(1, tiles / SMs).
// A kernel limited to S < SMs SMs (sm_limit: Stream::set_sm_budget, GroupedGemmArgs::sm_limit) runs
// on those alone: the formulas above with SMs = S for the waves, S / SMs of each peak, and its demand
// at most S / SMs (a share of the whole GPU). HBM bandwidth is not scaled: S of the SMs still
// stream at the memory's rate.
// The launch's fixed device-side cost (kernel_gap_us) is added by the stream, not here.
#pragma once

#include "scmoe/kernels/emu/gpu_spec.h"
#include "scmoe/kernels/op_cost.h"

namespace scmoe::emu {

struct KernelTime {
    double work_us = 0;  // alone on the GPU
    double demand = 1;   // (0, 1]
};

// sm_limit: the most SMs the kernel's grid may cover (0: every SM). gemm_fraction: a further factor on
// a tensor op's efficiency (the stack's small-GEMM curve, stack.h; 1: none).
KernelTime model_kernel(const OpCost& cost, const GpuSpec& spec, int sm_limit = 0, double gemm_fraction = 1.0);

// Copies over the host link (one direction, at host_link_gbps x host_link_efficiency) and
// device-to-device copies (read + write of HBM).
double host_copy_us(double bytes, const GpuSpec& spec);
double device_copy_us(double bytes, const GpuSpec& spec);

}  // namespace scmoe::emu
