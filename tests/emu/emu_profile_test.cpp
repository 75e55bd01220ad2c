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
    EXPECT_DOUBLE_EQ(s.grouped_gemm_efficiency, emu::builtin_gpu_spec("h100").grouped_gemm_efficiency);
    EXPECT_EQ(s.sms, 132);
    EXPECT_NE(std::find(s.sources.begin(), s.sources.end(), "scmoe-bench gemm on our H100"), s.sources.end());
    // The documented name heads the description (the output's header), not the base's model.
    EXPECT_EQ(s.description.rfind("h100-ours", 0), 0u) << s.description;
    EXPECT_EQ(emu::describe(s).rfind("h100-ours", 0), 0u) << emu::describe(s);
    // A profile is not planned on a guessed interconnect: without --cluster it is an error naming it.
    try {
        launch::resolve_emu_choice(path, "", "", 4);
        FAIL() << "a profile without --cluster was given a cluster";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("give --cluster"), std::string::npos) << e.what();
    }
    const launch::EmuChoice c = launch::resolve_emu_choice(path, "h100-nvlink-8", "", 4);
    EXPECT_EQ(c.spec.name, "h100-ours");
    EXPECT_EQ(c.cluster, "h100-nvlink-8");
    EXPECT_TRUE(c.cluster_note.empty());
    EXPECT_EQ(launch::make_emu_device(c)->backend(), Backend::kEmu);
    // A built-in GPU without --cluster gets its node, and the output says so.
    const launch::EmuChoice a30 = launch::resolve_emu_choice("a30", "", "", 8);
    EXPECT_EQ(a30.cluster, "a30-pcie-8");
    EXPECT_NE(a30.cluster_note.find("no --cluster given"), std::string::npos) << a30.cluster_note;
}

// Strict: an unknown key (a typo that would keep the base's value) and a value of the wrong type are
// errors naming the field.
TEST(EmuProfile, UnknownKeysAndWrongTypesNameTheField) {
    auto error_of = [](const std::string& file, const std::string& json) {
        try {
            launch::load_gpu(write_profile(file, json));
        } catch (const Error& e) {
            return std::string(e.what());
        }
        return std::string("(accepted)");
    };
    EXPECT_NE(error_of("typo.json", R"({"base": "a800", "name": "a", "memroy_gib": 40})")
                  .find("unknown field \"memroy_gib\""),
              std::string::npos);
    EXPECT_NE(error_of("type.json", R"({"base": "a800", "name": "a", "memory_gib": "40"})")
                  .find("field \"memory_gib\" must be a number"),
              std::string::npos);
    EXPECT_NE(error_of("int.json", R"({"base": "a800", "name": "a", "sms": 84.5})").find("field \"sms\""),
              std::string::npos);
    EXPECT_NE(error_of("neg.json", R"({"base": "a800", "name": "a", "hbm_gbps": -1})").find("field \"hbm_gbps\""),
              std::string::npos);
    EXPECT_NE(error_of("src.json", R"({"base": "a800", "name": "a", "sources": "datasheet"})").find("field \"sources\""),
              std::string::npos);
    EXPECT_NE(error_of("eff.json", R"({"base": "a800", "name": "a", "gemm_efficiency": 1.5})")
                  .find("field \"gemm_efficiency\""),
              std::string::npos);
    EXPECT_NE(error_of("geff.json", R"({"base": "a800", "name": "a", "grouped_gemm_efficiency": 1.2})")
                  .find("field \"grouped_gemm_efficiency\""),
              std::string::npos);
    // Every documented field is accepted.
    EXPECT_EQ(error_of("all.json", R"({"base": "a800", "name": "a", "description": "d", "sms": 84, "bf16_tflops": 150,
        "fp32_tflops": 38, "hbm_gbps": 768, "memory_gib": 48, "host_link_gbps": 32, "gemm_efficiency": 0.8,
        "bandwidth_efficiency": 0.9, "threads_per_sm": 1536, "launch_us": 2.5, "kernel_gap_us": 1.3,
        "host_task_us": 26, "sync_us": 3, "compute_dtype": "bf16", "compute_capability": 86,
        "registers_per_sm": 65536, "shared_bytes_per_sm": 102400, "shared_bytes_reserved_per_block": 1024,
        "blocks_per_sm": 16, "fused_attention": [{"head_dim": 64, "forward": 0.3, "backward": 0.2}],
        "grouped_gemm_efficiency": 0.7, "sources": ["x"]})"),
              "(accepted)");
    // fused_attention: a list of {head_dim, forward, backward} points, fractions of the peak, head dims
    // increasing.
    EXPECT_NE(error_of("fa-type.json", R"({"base": "a800", "name": "a", "fused_attention": {"head_dim": 64}})")
                  .find("field \"fused_attention\" must be a list of"),
              std::string::npos);
    EXPECT_NE(error_of("fa-field.json", R"({"base": "a800", "name": "a",
                                           "fused_attention": [{"head_dim": 64, "forwrd": 0.3, "backward": 0.2}]})")
                  .find("field \"fused_attention\""),
              std::string::npos);
    EXPECT_NE(error_of("fa-range.json", R"({"base": "a800", "name": "a",
                                           "fused_attention": [{"head_dim": 64, "forward": 1.3, "backward": 0.2}]})")
                  .find("fused_attention[0].forward 1.3"),
              std::string::npos);
    EXPECT_NE(error_of("fa-order.json", R"({"base": "a800", "name": "a", "fused_attention": [
                                           {"head_dim": 128, "forward": 0.4, "backward": 0.3},
                                           {"head_dim": 64, "forward": 0.3, "backward": 0.2}]})")
                  .find("fused_attention[1].head_dim: head dims must increase"),
              std::string::npos);
}

// A profile's fused_attention replaces its base's; without one it keeps the base's measured points.
TEST(EmuProfile, FusedAttentionReplacesTheBasesOrKeepsIt) {
    const emu::GpuSpec ours = launch::load_gpu(write_profile("fa.json", R"({"base": "h200", "name": "ours",
        "fused_attention": [{"head_dim": 64, "forward": 0.5, "backward": 0.25}]})"));
    ASSERT_EQ(ours.fused_attention.size(), 1u);
    EXPECT_DOUBLE_EQ(emu::fused_attention_efficiency(ours, 128, true), 0.25);
    const emu::GpuSpec kept = launch::load_gpu(write_profile("fa-kept.json", R"({"base": "h200", "name": "kept"})"));
    EXPECT_DOUBLE_EQ(emu::fused_attention_efficiency(kept, 64, false),
                     emu::fused_attention_efficiency(emu::builtin_gpu_spec("h200"), 64, false));
}

// The cluster flags: the description follows the overrides (no "NVLink" on PCIe, "2 nodes x 4" with
// 4 GPUs per node), an overridden assumption is dropped, and two different clusters get different
// labels.
TEST(EmuCluster, OverridesChangeTheDescriptionAndTheAssumptions) {
    launch::ClusterFlags f;
    f.cluster = "a800-2x8";
    const launch::EmuChoice base = launch::resolve_emu_choice("a800", "", f, 16);
    ASSERT_EQ(launch::cluster_notes(base).size(), 2u);
    EXPECT_NE(launch::cluster_notes(base)[0].find("assumed: one 100 Gb/s Ethernet NIC"), std::string::npos);

    f.gpus_per_node = 4;
    f.fabric = "pcie";
    f.nic_gbit_s = 200;
    const launch::EmuChoice c = launch::resolve_emu_choice("a800", "", f, 8);
    const std::string d = describe(c.topology);
    EXPECT_NE(d.find("2 nodes x 4 a800"), std::string::npos) << d;
    EXPECT_EQ(d.find("NVLink"), std::string::npos) << d;
    EXPECT_NE(d.find("PCIe"), std::string::npos) << d;
    EXPECT_NE(d.find("200 Gb/s (25 GB/s)"), std::string::npos) << d;
    EXPECT_DOUBLE_EQ(c.topology.nic_gbps, 25.0);  // Gb/s / 8
    EXPECT_EQ(c.topology.world_size(), 8);
    for (const std::string& n : launch::cluster_notes(c)) EXPECT_EQ(n.find("100 Gb/s"), std::string::npos) << n;
    EXPECT_NE(cluster_label(c.topology), cluster_label(base.topology));
    EXPECT_THROW(launch::resolve_emu_choice("a800", "", f, 9), Error);  // 9 ranks on 8 GPUs
    // The flags that give it again.
    EXPECT_EQ(launch::emu_choice_flags(c),
              "--gpu a800 --cluster a800-2x8 --gpus-per-node 4 --fabric pcie --nic-gbit-s 200");
    launch::EmuChoice paper = c;
    paper.stack = "paper";
    EXPECT_EQ(launch::emu_choice_flags(paper),
              "--gpu a800 --cluster a800-2x8 --gpus-per-node 4 --fabric pcie --nic-gbit-s 200 --stack paper");
    // Only the NIC speed differs: the labels still differ.
    launch::ClusterFlags g;
    g.cluster = "a800-2x8";
    g.nic_gbit_s = 400;
    EXPECT_NE(cluster_label(launch::resolve_emu_choice("a800", "", g, 16).topology), cluster_label(base.topology));
}

TEST(EmuCluster, BadOverridesNameTheFlag) {
    auto error_of = [](launch::ClusterFlags f) {
        try {
            launch::resolve_emu_choice("a800", "", f, 1);
        } catch (const Error& e) {
            return std::string(e.what());
        }
        return std::string("(accepted)");
    };
    launch::ClusterFlags two_nodes;
    two_nodes.cluster = "a800-nvlink-8";
    two_nodes.nodes = 2;
    EXPECT_NE(error_of(two_nodes).find("needs --nic-gbit-s"), std::string::npos);
    two_nodes.nic_gbit_s = 100;
    EXPECT_EQ(error_of(two_nodes), "(accepted)");
    launch::ClusterFlags one_node;
    one_node.cluster = "a800-nvlink-8";
    one_node.nic_gbit_s = 100;
    EXPECT_NE(error_of(one_node).find("--nic-gbit-s 100: the cluster"), std::string::npos);
    launch::ClusterFlags nvlink;
    nvlink.cluster = "a30-pcie-8";
    nvlink.fabric = "nvlink";
    EXPECT_NE(error_of(nvlink).find("needs --gpu-link-gbyte-s"), std::string::npos);
    nvlink.gpu_link_gbyte_s = 300;
    EXPECT_EQ(error_of(nvlink), "(accepted)");
    launch::ClusterFlags fabric;
    fabric.cluster = "a30-pcie-8";
    fabric.fabric = "infiniband";
    EXPECT_NE(error_of(fabric).find("--fabric infiniband"), std::string::npos);
    launch::ClusterFlags link;
    link.cluster = "link:gbyte_s=1,gpus=4";
    link.nodes = 2;
    EXPECT_NE(error_of(link).find("link: cluster takes its own keys"), std::string::npos);
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
    EXPECT_EQ(launch::make_emu_device(launch::resolve_emu_device(f32, ""))->compute_dtype(), DType::kF32);
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
