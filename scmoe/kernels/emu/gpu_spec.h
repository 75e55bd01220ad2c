// GpuSpec: what the emulated GPU (scmoe/kernels/emu/) knows about a GPU model. Every number of a built-in
// spec cites its source in gpu_spec.cpp; docs/emu-sources.md quotes them.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "scmoe/kernels/dtype.h"

namespace scmoe::emu {

// One measured point of GpuSpec::fused_attention.
struct AttentionEfficiency {
    double head_dim = 0;  // > 0
    double forward = 1;   // (0, 1]
    double backward = 1;  // (0, 1]
};

struct GpuSpec {
    std::string name;         // short name for --gpu: "h100"
    std::string description;  // "NVIDIA H100 SXM5 80GB"

    // Peaks from the vendor's datasheet.
    double bf16_tflops = 0;       // dense (no sparsity) BF16 tensor-core FLOP/s, in TFLOP/s
    double fp32_tflops = 0;       // CUDA-core FP32, in TFLOP/s
    double hbm_gbps = 0;          // device-memory bandwidth, GB/s (1e9 B/s)
    std::uint64_t memory_bytes = 0;  // capacity cudaMalloc can hand out
    int sms = 0;                  // streaming multiprocessors
    int threads_per_sm = 2048;    // resident threads per SM (compute capability 8.0 / 9.0)
    double host_link_gbps = 0;    // host <-> device copies (PCIe x16, one direction, nominal), GB/s
    double host_link_efficiency = 1;  // achieved fraction of host_link_gbps for a large pinned copy

    // What one SM holds for its resident blocks (scmoe/kernels/emu/residency.h): a block becomes resident
    // only where its registers, shared memory, threads and block slot fit. 0 = unknown: that
    // resource limits nothing (a profile of a CPU; a profile without a "base" GPU).
    int compute_capability = 0;        // 90 for sm_90: which of scmoe's kernels the GPU runs
    int registers_per_sm = 0;          // 32-bit registers
    int shared_bytes_per_sm = 0;       // shared memory an SM's blocks can take together
    int shared_bytes_reserved_per_block = 0;  // taken by the system from that for every resident block
    int blocks_per_sm = 0;             // resident blocks

    // Achieved fractions of the peaks (efficiency ceilings; the curve by shape is in cost_model.h).
    double gemm_efficiency = 0;       // large bf16 GEMM / bf16_tflops
    double bandwidth_efficiency = 0;  // streaming kernel / hbm_gbps
    // Fused causal attention (cuDNN SDPA on CUDA, FlashAttention-style): the measured fraction of
    // bf16_tflops its forward and backward reach beyond wave quantization (cost_model.h), by head_dim;
    // piecewise linear in log2(head_dim), flat beyond the ends. Empty: gemm_efficiency (as fast as a
    // large GEMM: what the emulator assumed before any was measured).
    std::vector<AttentionEfficiency> fused_attention;
    // scmoe's grouped GEMM (cutlass-grouped, what the emulated grouped GEMM stands for) over a dense
    // GEMM of the same FLOPs, measured: the factor on its rate. 1: as fast as dense (not measured).
    double grouped_gemm_efficiency = 1;

    // Fixed costs, in microseconds.
    double launch_us = 0;     // host time one kernel launch (cudaLaunchKernel) costs the issuing thread
    double kernel_gap_us = 0; // device time between back-to-back kernels of a stream
    double host_task_us = 0;  // callback thread time per cudaLaunchHostFunc task
    double sync_us = 0;       // host time from a stream's completion to cudaStreamSynchronize returning

    // The dtype activations and weights are stored in (Device::compute_dtype): bf16 as on the CUDA
    // backend; f32 for a profile of a CPU, whose backend computes in f32.
    DType compute_dtype = DType::kBF16;

    std::vector<std::string> sources;  // citations for the numbers above
};

// The built-in specs: a30, a800, h100, h200.
const std::vector<GpuSpec>& builtin_gpu_specs();
// A built-in spec by name (case-insensitive); throws Error listing the names otherwise.
const GpuSpec& builtin_gpu_spec(std::string_view name);
// GpuSpec::fused_attention at `head_dim`, for the forward or the backward (gemm_efficiency when empty).
double fused_attention_efficiency(const GpuSpec& spec, double head_dim, bool backward);
// Throws Error naming the point of spec.fused_attention out of range or out of order (`what` names
// the spec in the message).
void check_fused_attention(const std::vector<AttentionEfficiency>& points, const std::string& what);

// One line: "NVIDIA H100 SXM5 80GB: 132 SMs, 989 TFLOP/s bf16, 3350 GB/s, 80.0 GiB".
std::string describe(const GpuSpec& spec);

}  // namespace scmoe::emu
