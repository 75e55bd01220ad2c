#include "launch/emu_choice.h"

#include "launch/emu_stack.h"

#include <fstream>
#include <nlohmann/json.hpp>

#include "scmoe/comm/topology.h"
#include "scmoe/kernels/emu/emu_device.h"
#include "scmoe/kernels/error.h"
#include "scmoe/models/data.h"

namespace scmoe::launch {

namespace {

bool ends_with(const std::string& s, const std::string& tail) {
    return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

}  // namespace

emu::GpuSpec load_gpu(const std::string& name) {
    if (!ends_with(name, ".json")) return emu::builtin_gpu_spec(name);
    // Before opening: a FIFO would wait for a writer.
    if (const std::string why = models::data_file_problem(name); !why.empty())
        SCMOE_FAIL("--gpu " << name << ": the profile " << why << "; expected a JSON file (docs/emu.md)");
    std::ifstream in(name);
    SCMOE_CHECK(in, "--gpu " << name << ": cannot open the profile");
    nlohmann::json j;
    try {
        in >> j;
    } catch (const std::exception& e) {
        SCMOE_FAIL("--gpu " << name << ": not JSON: " << e.what());
    }
    SCMOE_CHECK(j.is_object(), "--gpu " << name << ": a profile is a JSON object");
    emu::GpuSpec s = j.contains("base") ? emu::builtin_gpu_spec(j.at("base").get<std::string>()) : emu::GpuSpec{};
    auto num = [&](const char* key, double& field) {
        if (j.contains(key)) field = j.at(key).get<double>();
    };
    try {
        if (j.contains("name")) s.name = j.at("name").get<std::string>();
        if (j.contains("description")) s.description = j.at("description").get<std::string>();
        num("bf16_tflops", s.bf16_tflops);
        num("fp32_tflops", s.fp32_tflops);
        num("hbm_gbps", s.hbm_gbps);
        if (j.contains("memory_gib"))
            s.memory_bytes = static_cast<std::uint64_t>(j.at("memory_gib").get<double>() * (1ull << 30));
        if (j.contains("sms")) s.sms = j.at("sms").get<int>();
        if (j.contains("threads_per_sm")) s.threads_per_sm = j.at("threads_per_sm").get<int>();
        num("host_link_gbps", s.host_link_gbps);
        num("host_link_efficiency", s.host_link_efficiency);
        num("gemm_efficiency", s.gemm_efficiency);
        num("bandwidth_efficiency", s.bandwidth_efficiency);
        num("launch_us", s.launch_us);
        num("kernel_gap_us", s.kernel_gap_us);
        num("host_task_us", s.host_task_us);
        num("sync_us", s.sync_us);
        if (j.contains("compute_dtype")) {
            const std::string d = j.at("compute_dtype").get<std::string>();
            SCMOE_CHECK(d == "bf16" || d == "f32", "--gpu " << name << ": compute_dtype '" << d << "': bf16 or f32");
            s.compute_dtype = d == "f32" ? DType::kF32 : DType::kBF16;
        }
        if (j.contains("sources")) {
            for (const auto& v : j.at("sources")) s.sources.push_back(v.get<std::string>());
        }
    } catch (const nlohmann::json::exception& e) {
        SCMOE_FAIL("--gpu " << name << ": " << e.what());
    }
    SCMOE_CHECK(!s.name.empty() && s.sms > 0 && s.bf16_tflops > 0 && s.fp32_tflops > 0 && s.hbm_gbps > 0 &&
                    s.memory_bytes > 0 && s.host_link_gbps > 0 && s.gemm_efficiency > 0 && s.bandwidth_efficiency > 0,
                "--gpu " << name << ": the profile needs name, sms, bf16_tflops, fp32_tflops, hbm_gbps, memory_gib, "
                         << "host_link_gbps, gemm_efficiency and bandwidth_efficiency > 0 (or a \"base\" GPU)");
    s.sources.push_back("profile " + name);
    return s;
}

EmuChoice resolve_emu_choice(std::string gpu, std::string cluster, std::string routing, int ranks) {
    EmuChoice c;
    if (!gpu.empty()) c.gpu = std::move(gpu);
    if (!routing.empty()) c.routing = std::move(routing);
    c.spec = load_gpu(c.gpu);
    emu::parse_routing_model(c.routing);
    c.cluster = cluster.empty() ? default_cluster_for_gpu(c.spec.name) : std::move(cluster);
    const Topology& t = cluster_topology(c.cluster);
    SCMOE_CHECK(ranks <= t.world_size(),
                "--ranks " << ranks << ": cluster " << t.name << " has " << t.world_size() << " GPUs");
    return c;
}

std::unique_ptr<Device> make_emu_device(const EmuChoice& choice) {
    emu::EmuOptions options;
    options.spec = choice.spec.name.empty() ? load_gpu(choice.gpu) : choice.spec;
    options.routing = emu::parse_routing_model(choice.routing);
    options.stack = load_stack(choice.stack);
    return emu::make_device(std::move(options));
}

}  // namespace scmoe::launch
