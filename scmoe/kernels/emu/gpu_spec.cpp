#include "scmoe/kernels/emu/gpu_spec.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <string>

#include "scmoe/kernels/emu/log2_curve.h"
#include "scmoe/kernels/error.h"

namespace scmoe::emu {
namespace {

constexpr std::uint64_t kGiB = 1ull << 30;

// One GPU from its datasheet peaks (dense bf16 and fp32 TFLOP/s, HBM GB/s, capacity, SMs, PCIe GB/s
// per direction) and its achieved large-GEMM efficiency. Shared by every built-in spec:
//   bandwidth_efficiency 0.90: STREAM-like kernels reach 87-93% of HBM peak on A100 and H100;
//   launch_us 2.5: 10,000 back-to-back tiny kernels ran at 2.4-2.6 us per kernel on A100 and H200
//     with ordinary launches (the host's launch rate bounds them);
//   kernel_gap_us 1.3: the same kernels inside a CUDA Graph (no host launch cost) ran at ~1.3 us each;
//   host_task_us 26: cudaLaunchHostFunc round trip measured by Meta's torchcomms;
//   sync_us 3: an estimate (no published figure; a small kernel plus synchronize took 4.7-7.1 us).
// Quotes for all of them in docs/emu-sources.md.
GpuSpec spec(std::string name, std::string description, double bf16_tflops, double fp32_tflops, double hbm_gbps,
             std::uint64_t memory_bytes, int sms, double host_link_gbps, double gemm_efficiency,
             std::vector<std::string> sources) {
    GpuSpec s;
    s.name = std::move(name);
    s.description = std::move(description);
    s.bf16_tflops = bf16_tflops;
    s.fp32_tflops = fp32_tflops;
    s.hbm_gbps = hbm_gbps;
    s.memory_bytes = memory_bytes;
    s.sms = sms;
    s.host_link_gbps = host_link_gbps;
    s.gemm_efficiency = gemm_efficiency;
    s.bandwidth_efficiency = 0.90;
    s.launch_us = 2.5;
    s.kernel_gap_us = 1.3;
    s.host_task_us = 26.0;
    s.sync_us = 3.0;
    s.sources = std::move(sources);
    s.sources.push_back("efficiencies and fixed costs: docs/emu-sources.md, items 1-3 and 5 (sync_us is an estimate)");
    return s;
}

// The per-SM limits of a compute capability, from the CUDA C++ Programming Guide: "Technical
// Specifications per Compute Capability" (8.0 and 9.0: 64K 32-bit registers, 32 resident blocks and
// 2048 resident threads per SM; at most 164 KB (8.0) and 228 KB (9.0) of shared memory per SM) and
// the shared memory sections of "Compute Capability 8.x" / "Compute Capability 9.0" (1 KB of an
// SM's shared memory is reserved for system use for each resident block); the NVIDIA A100 and H100
// Tensor Core GPU Architecture whitepapers and the Ampere / Hopper Tuning Guides give the same
// per-SM register file (65,536 x 32-bit) and shared memory capacity (up to 164 KB on A100, 228 KB
// on H100). How the limits decide residency: scmoe/kernels/emu/residency.h.
GpuSpec with_sm_limits(GpuSpec s, int compute_capability) {
    s.compute_capability = compute_capability;
    s.registers_per_sm = 65536;
    s.shared_bytes_per_sm = (compute_capability >= 90 ? 228 : 164) * 1024;
    s.shared_bytes_reserved_per_block = 1024;
    s.blocks_per_sm = 32;
    s.threads_per_sm = 2048;
    s.sources.push_back("per-SM limits (registers, shared memory, blocks, threads) of compute capability " +
                        std::to_string(compute_capability / 10) + "." + std::to_string(compute_capability % 10) +
                        ": CUDA C++ Programming Guide, Technical Specifications per Compute Capability; 1 KB of shared "
                        "memory reserved per block: its Compute Capability 8.x / 9.0 shared memory sections");
    return s;
}

// The host link's achieved fraction of its per-direction peak for large pinned copies (docs/emu-sources.md,
// the PCIe rows): Gen4 x16 25 of 32 GB/s, "the peak *16 PCIe Gen4 is 25GBps ... it is measured peak"
// (BaM issue #54, an A100 PCIe, the A30's Gen4 x16 link); Gen5 x16 55.4 of 64 GB/s host-to-device,
// nvbandwidth on an 8 x H200 node (Stas Bekman, Machine Learning Engineering: "nvbandwidth reports
// 55.43GBps host-to-device and 55.06GBps device-to-host").
GpuSpec with_link_efficiency(GpuSpec s, double achieved_gbps, const char* source) {
    s.host_link_efficiency = achieved_gbps / s.host_link_gbps;
    s.sources.push_back(source);
    return s;
}

// cuDNN's fused causal attention (SDPA) measured by this project's acceptance runs (scmoe-bench
// attention --provider auto, cuDNN 9.19 through its frontend, bf16, batch 8, seq 1024, 12 heads),
// against 959.0 = the 989 TFLOP/s peak after wave quantization at that shape (768 tiles / (6 waves x
// 132 SMs)); a large GEMM reaches 0.80:
//   H200 (docs/results/gpu-h200-2026-11-26/raw/attention_b8_s1024_h12_d{64,128}.json): head_dim 64
//   forward 268.9 and backward 183.2 TFLOP/s, head_dim 128 396.6 and 279.9: forward 0.280 and 0.414,
//   backward 0.191 and 0.292.
//   H100 SXM (docs/results/gpu-h100-2026-11-27/acceptance/raw/, the same files): head_dim 64 269.5 and
//   166.4, head_dim 128 395.3 and 256.0: forward 0.281 and 0.412, backward 0.173 and 0.267.
// The forwards agree (the same GH100 SMs and clocks); the H100's backwards are 9% slower (its HBM
// moves 3.35 TB/s to the H200's 4.8). Until the H100 was measured it was ASSUMED to be the H200;
// that assumption was off by +3.1% / +1.6% forward and -8.5% / -8.1% backward.
GpuSpec with_gh100_fused_attention(GpuSpec s, bool h200) {
    if (h200) {
        s.fused_attention = {{64, 0.280, 0.191}, {128, 0.414, 0.292}};
        s.sources.push_back("fused_attention: cuDNN SDPA measured on this H200 (docs/results/gpu-h200-2026-11-26, "
                            "scmoe-bench attention, b8 s1024 h12, head_dim 64 and 128)");
    } else {
        s.fused_attention = {{64, 0.281, 0.173}, {128, 0.412, 0.267}};
        s.sources.push_back("fused_attention: cuDNN SDPA measured on this H100 SXM (docs/results/gpu-h100-2026-11-27, "
                            "scmoe-bench attention, b8 s1024 h12, head_dim 64 and 128)");
    }
    return s;
}

// scmoe's grouped GEMM (cutlass-grouped) against cuBLAS's dense GEMM of the same FLOPs, measured by
// this project's acceptance runs (scmoe-bench gemm --provider cutlass-grouped,...: A [16384, 768] x W
// [8 experts, 768, 3072], 2048 rows per expert, against one [16384, 768] x [768, 3072]; raw/gemm.json,
// the balanced load): H100 SXM 514.2 / 656.5 TFLOP/s = 0.783 (docs/results/gpu-h100-2026-11-27/
// acceptance; the rerun there 0.790), H200 556.0 / 708.3 = 0.785 (docs/results/gpu-h200-2026-11-26).
// Not measured on the A100's SM (sm_80: another CUTLASS kernel): 1 there.
GpuSpec with_grouped_gemm_efficiency(GpuSpec s, double efficiency, const char* source) {
    s.grouped_gemm_efficiency = efficiency;
    s.sources.push_back(source);
    return s;
}

// cuDNN's fused causal attention on the A100 (GA100; the A800 and A30 have its SM): the only published
// per-configuration figure found is a forward. NVIDIA/cudnn-frontend 51a3de7,
// benchmark/attention_inference/results/prefill_sweep/a100/prefill_sweep_20260928_140355.csv: "NVIDIA
// A100 80GB PCIe", cuDNN 9.27.0, bf16, batch 1, seq 2048, 64 query / 8 K/V heads, head_dim 128:
// "0.466913,147.178" (ms, TFLOP/s at the causal count: 4 x 2048^2 x 64 x 128 / 2 / 0.467 ms): 0.472 of
// the 312 TFLOP/s peak, 0.497 after wave quantization (1024 tiles / (10 waves x 108 SMs)). Nothing
// citable gives the backward or head_dim 64: ASSUMED in the H200's measured ratios (backward / forward
// 0.705 at head_dim 128 and 0.682 at 64; head_dim 64 / 128 forward 0.676; with_gh100_fused_attention).
GpuSpec with_a100_fused_attention(GpuSpec s, bool a100_sm) {
    const double fwd128 = 0.497, fwd64 = fwd128 * 0.280 / 0.414;
    s.fused_attention = {{64, fwd64, fwd64 * 0.191 / 0.280}, {128, fwd128, fwd128 * 0.292 / 0.414}};
    s.sources.push_back(std::string("fused_attention: the forward at head_dim 128 from cuDNN 9.27 on an A100 80GB PCIe "
                                    "(NVIDIA/cudnn-frontend prefill_sweep a100 CSV: 147.2 TFLOP/s at seq 2048); the "
                                    "backward and head_dim 64 ASSUMED in the H200's measured ratios") +
                        (a100_sm ? "" : "; ASSUMED the A100's (same GA100 SM; no A30 measurement found)"));
    return s;
}

constexpr const char* kGen4Achieved =
    "PCIe Gen4 x16 achieved 25 GB/s per direction of 32: BaM issue #54 (A100 PCIe, measured), docs/emu-sources.md";
constexpr const char* kGen5Achieved =
    "PCIe Gen5 x16 achieved 55.4 GB/s host-to-device of 64: nvbandwidth on 8 x H200 (Stas Bekman, Machine Learning "
    "Engineering), docs/emu-sources.md";

std::vector<GpuSpec> make_specs() {
    // PCIe per direction: Gen4 x16 64 GB/s and Gen5 x16 128 GB/s both directions together.
    return {
        // gemm_efficiency: ASSUMED, borrowed from the 400 W A100 SXM (same GA100 SM): no published A30
        // GEMM measurement was found. The A30 is a 165 W board, and a power-capped board sustains a
        // lower clock under continuous tensor work than its boost clock (NVIDIA's forum on the 70 W T4:
        // 24 of 65 TFLOPS, "due to power capping"), so this ceiling is more likely high than low.
        // SM count: the driver's own report (nvidia-smi mig -lgip on an A30: "MIG 4g.24gb ... SM 56",
        // the whole GPU; "MIG 1g.6gb ... 14" = 1/4 of the SMs, as NVIDIA's MIG User Guide lists), and
        // 56 SMs x 1024 FMA/clk x 2 x 1.44 GHz = 165.2 TFLOPS, the datasheet's peak.
        with_a100_fused_attention(with_sm_limits(spec("a30", "NVIDIA A30 PCIe 24GB", 165, 10.3, 933, 24 * kGiB, 56, 32, 0.87,
             {"NVIDIA A30 Tensor Core GPU datasheet (BF16 165 TFLOPS dense, FP32 10.3 TFLOPS, 24GB HBM2, 933 GB/s, "
              "PCIe Gen4 64GB/s)",
              "56 SMs: nvidia-smi mig -lgip on an A30 (MIG 4g.24gb, the whole GPU: 56 SMs; 1g.6gb: 14 = 1/4, NVIDIA "
              "MIG User Guide's A30 profile table); 56 x 1024 FMA/clk x 2 x 1.44 GHz = 165 TFLOPS (docs/emu-sources.md)",
              "assumed: gemm_efficiency 0.87 is the 400 W A100 SXM's; no A30 (165 W) GEMM measurement found"}), 80),
                                  false),
        // Every number is the A100 SXM4 80GB's (no public A800 SXM datasheet exists; the A800 differs
        // only in NVLink, which the cluster presets model). gemm_efficiency: the best measured large bf16
        // matmul on A100 SXM, 86.9% of peak.
        with_a100_fused_attention(with_sm_limits(spec("a800", "NVIDIA A800 SXM4 80GB", 312, 19.5, 2039, 80 * kGiB, 108, 32, 0.87,
             {"NVIDIA A100 80GB SXM datasheet (BF16 312 TFLOPS dense, FP32 19.5 TFLOPS, 80GB HBM2e, 2039 GB/s, "
              "PCIe Gen4 64GB/s): NVIDIA publishes no A800 SXM datasheet; the A800 is the A100 with NVLink limited "
              "to 400 GB/s (Reuters, 2022-11-08; docs/emu-sources.md)",
              "108 SMs: NVIDIA A100 Tensor Core GPU Architecture whitepaper"}), 80), true),
        // gemm_efficiency: the best measured large bf16 matmul on H100 SXM, 80.3% of peak.
        with_grouped_gemm_efficiency(with_gh100_fused_attention(with_sm_limits(spec("h100", "NVIDIA H100 SXM5 80GB", 989, 67, 3350, 80 * kGiB, 132, 64, 0.80,
             {"NVIDIA H100 Tensor Core GPU datasheet (SXM: BF16 1979 TFLOPS with sparsity = 989 dense, FP32 67 "
              "TFLOPS, 80GB, 3.35TB/s, NVLink 900GB/s, PCIe Gen5 128GB/s)",
              "132 SMs: NVIDIA H100 Tensor Core GPU Architecture whitepaper (H100 SXM5)"}), 90), false),
            0.783, "grouped_gemm_efficiency: cutlass-grouped 514.2 / cuBLAS dense 656.5 TFLOP/s at equal FLOPs, "
                   "measured on this H100 (docs/results/gpu-h100-2026-11-27, scmoe-bench gemm)"),
        // gemm_efficiency as the H100 (the same compute, measured the same).
        with_grouped_gemm_efficiency(with_gh100_fused_attention(with_sm_limits(spec("h200", "NVIDIA H200 SXM 141GB", 989, 67, 4800, 141ull * 1000 * 1000 * 1000, 132, 64, 0.80,
             {"NVIDIA H200 Tensor Core GPU product page/datasheet (SXM: BF16 1979 TFLOPS with sparsity = 989 dense, "
              "FP32 67 TFLOPS, 141GB HBM3e, 4.8TB/s, NVLink 900GB/s, PCIe Gen5 128GB/s)",
              "132 SMs: the H200 is the GH100 of the H100 SXM5 with HBM3e (docs/emu-sources.md)"}), 90), true),
            0.785, "grouped_gemm_efficiency: cutlass-grouped 556.0 / cuBLAS dense 708.3 TFLOP/s at equal FLOPs, "
                   "measured on this H200 (docs/results/gpu-h200-2026-11-26, scmoe-bench gemm)"),
    };
}

std::vector<GpuSpec> make_linked_specs() {
    std::vector<GpuSpec> specs = make_specs();
    for (GpuSpec& s : specs)
        s = with_link_efficiency(std::move(s), s.host_link_gbps < 60 ? 25.0 : 55.4,
                                 s.host_link_gbps < 60 ? kGen4Achieved : kGen5Achieved);
    return specs;
}

std::string lower(std::string_view s) {
    std::string out(s);
    std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return std::tolower(c); });
    return out;
}

}  // namespace

const std::vector<GpuSpec>& builtin_gpu_specs() {
    static const std::vector<GpuSpec> specs = make_linked_specs();
    return specs;
}

const GpuSpec& builtin_gpu_spec(std::string_view name) {
    const std::string want = lower(name);
    std::string names;
    for (const GpuSpec& s : builtin_gpu_specs()) {
        if (s.name == want) return s;
        names += (names.empty() ? "" : ", ") + s.name;
    }
    SCMOE_FAIL("unknown emulated GPU '" << name << "': built-in specs are " << names);
}

double fused_attention_efficiency(const GpuSpec& spec, double head_dim, bool backward) {
    if (spec.fused_attention.empty()) return spec.gemm_efficiency;
    return log2_curve(
        spec.fused_attention, head_dim, [](const AttentionEfficiency& a) { return a.head_dim; },
        [backward](const AttentionEfficiency& a) { return backward ? a.backward : a.forward; });
}

void check_fused_attention(const std::vector<AttentionEfficiency>& points, const std::string& what) {
    for (std::size_t i = 0; i < points.size(); ++i) {
        const AttentionEfficiency& a = points[i];
        SCMOE_CHECK(std::isfinite(a.head_dim) && a.head_dim > 0,
                    what << ": fused_attention[" << i << "].head_dim " << a.head_dim << ": must be > 0");
        SCMOE_CHECK(a.forward > 0 && a.forward <= 1,
                    what << ": fused_attention[" << i << "].forward " << a.forward << ": must be in (0, 1]");
        SCMOE_CHECK(a.backward > 0 && a.backward <= 1,
                    what << ": fused_attention[" << i << "].backward " << a.backward << ": must be in (0, 1]");
        SCMOE_CHECK(i == 0 || a.head_dim > points[i - 1].head_dim,
                    what << ": fused_attention[" << i << "].head_dim: head dims must increase");
    }
}

std::string describe(const GpuSpec& s) {
    char buf[256];
    std::snprintf(buf, sizeof buf, "%s: %d SMs, %.4g TFLOP/s bf16, %.4g GB/s, %.1f GiB", s.description.c_str(), s.sms,
                  s.bf16_tflops, s.hbm_gbps, static_cast<double>(s.memory_bytes) / static_cast<double>(kGiB));
    return buf;
}

}  // namespace scmoe::emu
