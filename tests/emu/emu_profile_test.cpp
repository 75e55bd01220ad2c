// Emulated-GPU profiles (--gpu PROFILE.json): a built-in base with measured overrides, a complete
// profile, and the errors that name what is missing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>

#include "scmoe/kernels/error.h"
#include "launch/emu_choice.h"

namespace scmoe {
namespace {

std::string write_profile(const std::string& name, const std::string& json) {
    const std::string path = ::testing::TempDir() + name;
    std::ofstream(path) << json;
    return path;
}

TEST(EmuProfile, ABaseWithMeasuredOverrides) {
    const std::string path =
        write_profile("ours.json", R"({"base": "h100", "name": "h100-ours", "gemm_efficiency": 0.61,
                                      "sources": ["scmoe-bench gemm on our H100"]})");
    const emu::GpuSpec s = launch::load_gpu(path);
    EXPECT_EQ(s.name, "h100-ours");
    EXPECT_DOUBLE_EQ(s.gemm_efficiency, 0.61);
    EXPECT_DOUBLE_EQ(s.bf16_tflops, emu::builtin_gpu_spec("h100").bf16_tflops);  // kept from the base
    EXPECT_EQ(s.sms, 132);
    EXPECT_NE(std::find(s.sources.begin(), s.sources.end(), "scmoe-bench gemm on our H100"), s.sources.end());
    // The choice carries it; the cluster defaults to the one of its name's GPU (h100-ours: h100's).
    const launch::EmuChoice c = launch::resolve_emu_choice(path, "", "", 4);
    EXPECT_EQ(c.spec.name, "h100-ours");
    EXPECT_EQ(c.cluster, "h100-nvlink-8");
    EXPECT_EQ(launch::make_emu_device(c)->backend(), Backend::kEmu);
}

TEST(EmuProfile, ACompleteProfileAndItsErrors) {
    const std::string full = write_profile(
        "cpu.json", R"({"name": "vm", "description": "a CPU", "bf16_tflops": 0.1, "fp32_tflops": 0.1,
                       "hbm_gbps": 8, "memory_gib": 16, "sms": 2, "threads_per_sm": 1, "host_link_gbps": 8,
                       "gemm_efficiency": 1, "bandwidth_efficiency": 1, "launch_us": 0})");
    const emu::GpuSpec s = launch::load_gpu(full);
    EXPECT_EQ(s.sms, 2);
    EXPECT_EQ(s.compute_dtype, DType::kBF16);  // the default: a GPU's
    const std::string f32 = write_profile("cpu32.json", R"({"base": "a30", "name": "x", "compute_dtype": "f32"})");
    EXPECT_EQ(launch::make_emu_device(launch::resolve_emu_choice(f32, "", "", 1))->compute_dtype(), DType::kF32);
    EXPECT_THROW(launch::load_gpu(write_profile("f16.json", R"({"base": "a30", "compute_dtype": "f16"})")), Error);
    EXPECT_EQ(s.memory_bytes, 16ull << 30);
    EXPECT_THROW(launch::load_gpu(write_profile("partial.json", R"({"name": "x", "sms": 2})")), Error);
    EXPECT_THROW(launch::load_gpu(write_profile("broken.json", "{not json")), Error);
    EXPECT_THROW(launch::load_gpu(write_profile("badbase.json", R"({"base": "v100"})")), Error);
    EXPECT_THROW(launch::load_gpu(::testing::TempDir() + "does-not-exist.json"), Error);
    EXPECT_THROW(launch::resolve_emu_choice("a30", "a30-pcie-8", "", 9), Error);  // 9 ranks on 8 GPUs
}

}  // namespace
}  // namespace scmoe
