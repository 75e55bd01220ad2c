#include "launch/emu_choice.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "launch/emu_stack.h"
#include "scmoe/kernels/emu/emu_device.h"
#include "scmoe/kernels/error.h"
#include "scmoe/models/data.h"

namespace scmoe::launch {

namespace {

bool ends_with(const std::string& s, const std::string& tail) {
    return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

std::string number(double v) {
    std::ostringstream os;
    os << v;
    return os.str();
}

// A profile's keys and what each takes (docs/emu.md, "Profiles").
enum class Kind { kString, kNumber, kCount, kStrings, kPoints };
struct ProfileKey {
    const char* name;
    Kind kind;
};
constexpr ProfileKey kProfileKeys[] = {
    {"base", Kind::kString},           {"name", Kind::kString},
    {"description", Kind::kString},    {"compute_dtype", Kind::kString},
    {"sources", Kind::kStrings},       {"bf16_tflops", Kind::kNumber},
    {"fp32_tflops", Kind::kNumber},    {"hbm_gbps", Kind::kNumber},
    {"memory_gib", Kind::kNumber},     {"host_link_gbps", Kind::kNumber},
    {"host_link_efficiency", Kind::kNumber},
    {"gemm_efficiency", Kind::kNumber}, {"bandwidth_efficiency", Kind::kNumber},
    {"launch_us", Kind::kNumber},      {"kernel_gap_us", Kind::kNumber},
    {"host_task_us", Kind::kNumber},   {"sync_us", Kind::kNumber},
    {"sms", Kind::kCount},             {"threads_per_sm", Kind::kCount},
    {"compute_capability", Kind::kCount}, {"registers_per_sm", Kind::kCount},
    {"shared_bytes_per_sm", Kind::kCount}, {"shared_bytes_reserved_per_block", Kind::kCount},
    {"blocks_per_sm", Kind::kCount},  {"fused_attention", Kind::kPoints},
    {"grouped_gemm_efficiency", Kind::kNumber},
};

const char* kind_name(Kind k) {
    switch (k) {
        case Kind::kString: return "a string";
        case Kind::kNumber: return "a number >= 0";
        case Kind::kCount: return "a whole number >= 0";
        case Kind::kStrings: return "a list of strings";
        case Kind::kPoints: return "a list of {\"head_dim\", \"forward\", \"backward\"} objects of numbers";
    }
    return "";
}

std::string json_type(const nlohmann::json& v) {
    if (v.is_number_integer()) return "the integer " + v.dump();
    if (v.is_number()) return "the number " + v.dump();
    return std::string("a ") + v.type_name() + " (" + v.dump() + ")";
}

// Checks every key of the profile: known, of its kind. Throws naming the field.
void check_profile_keys(const std::string& path, const nlohmann::json& j) {
    for (const auto& item : j.items()) {
        // References, not a structured binding: clang 14 refuses a lambda capturing one (C++20 allows it).
        const std::string& key = item.key();
        const nlohmann::json& value = item.value();
        const auto* k = std::find_if(std::begin(kProfileKeys), std::end(kProfileKeys),
                                     [&](const ProfileKey& p) { return key == p.name; });
        if (k == std::end(kProfileKeys)) {
            std::string known;
            for (const ProfileKey& p : kProfileKeys) known += (known.empty() ? "" : ", ") + std::string(p.name);
            SCMOE_FAIL("--gpu " << path << ": unknown field \"" << key << "\" (a typo would silently keep the base's "
                                << "value); the fields are " << known);
        }
        bool ok = false;
        switch (k->kind) {
            case Kind::kString: ok = value.is_string(); break;
            case Kind::kNumber: ok = value.is_number() && std::isfinite(value.get<double>()) && value.get<double>() >= 0; break;
            case Kind::kCount: ok = value.is_number_unsigned() || (value.is_number_integer() && value.get<long long>() >= 0); break;
            case Kind::kStrings:
                ok = value.is_array() && std::all_of(value.begin(), value.end(), [](const auto& s) { return s.is_string(); });
                break;
            case Kind::kPoints:
                ok = value.is_array() && std::all_of(value.begin(), value.end(), [](const auto& p) {
                         constexpr const char* kFields[] = {"head_dim", "forward", "backward"};
                         return p.is_object() && p.size() == 3 &&
                                std::all_of(std::begin(kFields), std::end(kFields),
                                            [&](const char* f) { return p.contains(f) && p.at(f).is_number(); });
                     });
                break;
        }
        SCMOE_CHECK(ok, "--gpu " << path << ": field \"" << key << "\" must be " << kind_name(k->kind) << ", not "
                                 << json_type(value));
    }
}

// The built-in GPU's 8-GPU node.
std::string default_node(const std::string& gpu) { return default_cluster_for_gpu(gpu); }

}  // namespace

bool is_gpu_profile(const std::string& name) { return ends_with(name, ".json"); }

emu::GpuSpec load_gpu(const std::string& name) {
    if (!is_gpu_profile(name)) return emu::builtin_gpu_spec(name);
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
    check_profile_keys(name, j);
    emu::GpuSpec s = j.contains("base") ? emu::builtin_gpu_spec(j.at("base").get<std::string>()) : emu::GpuSpec{};
    const std::string base_description = s.description;
    auto num = [&](const char* key, double& field) {
        if (j.contains(key)) field = j.at(key).get<double>();
    };
    auto count = [&](const char* key, int& field) {
        if (!j.contains(key)) return;
        const auto v = j.at(key).get<unsigned long long>();
        SCMOE_CHECK(v <= 1u << 30, "--gpu " << name << ": field \"" << key << "\" " << v << " is out of range");
        field = static_cast<int>(v);
    };
    if (j.contains("name")) s.name = j.at("name").get<std::string>();
    if (j.contains("description")) {
        s.description = j.at("description").get<std::string>();
    } else if (j.contains("name")) {
        // The documented name, not the base's model, heads the output.
        s.description = s.name + (j.contains("base") ? " (profile, base " + base_description + ")" : " (profile)");
    }
    num("bf16_tflops", s.bf16_tflops);
    num("fp32_tflops", s.fp32_tflops);
    num("hbm_gbps", s.hbm_gbps);
    if (j.contains("memory_gib")) s.memory_bytes = static_cast<std::uint64_t>(j.at("memory_gib").get<double>() * (1ull << 30));
    count("sms", s.sms);
    count("threads_per_sm", s.threads_per_sm);
    count("compute_capability", s.compute_capability);
    count("registers_per_sm", s.registers_per_sm);
    count("shared_bytes_per_sm", s.shared_bytes_per_sm);
    count("shared_bytes_reserved_per_block", s.shared_bytes_reserved_per_block);
    count("blocks_per_sm", s.blocks_per_sm);
    num("host_link_gbps", s.host_link_gbps);
    num("host_link_efficiency", s.host_link_efficiency);
    num("gemm_efficiency", s.gemm_efficiency);
    num("grouped_gemm_efficiency", s.grouped_gemm_efficiency);
    num("bandwidth_efficiency", s.bandwidth_efficiency);
    num("launch_us", s.launch_us);
    num("kernel_gap_us", s.kernel_gap_us);
    num("host_task_us", s.host_task_us);
    num("sync_us", s.sync_us);
    if (j.contains("compute_dtype")) {
        const std::string d = j.at("compute_dtype").get<std::string>();
        SCMOE_CHECK(d == "bf16" || d == "f32",
                    "--gpu " << name << ": field \"compute_dtype\" '" << d << "': bf16 or f32");
        s.compute_dtype = d == "f32" ? DType::kF32 : DType::kBF16;
    }
    if (j.contains("fused_attention")) {
        s.fused_attention.clear();
        for (const auto& v : j.at("fused_attention"))
            s.fused_attention.push_back({v.at("head_dim").get<double>(), v.at("forward").get<double>(),
                                         v.at("backward").get<double>()});
        emu::check_fused_attention(s.fused_attention, "--gpu " + name);
    }
    if (j.contains("sources"))
        for (const auto& v : j.at("sources")) s.sources.push_back(v.get<std::string>());
    for (const char* key : {"gemm_efficiency", "grouped_gemm_efficiency", "bandwidth_efficiency", "host_link_efficiency"})
        if (j.contains(key))
            SCMOE_CHECK(j.at(key).get<double>() <= 1.0,
                        "--gpu " << name << ": field \"" << key << "\" " << j.at(key).get<double>()
                                 << " is a fraction of the peak: at most 1");
    SCMOE_CHECK(!s.name.empty() && s.sms > 0 && s.bf16_tflops > 0 && s.fp32_tflops > 0 && s.hbm_gbps > 0 &&
                    s.memory_bytes > 0 && s.host_link_gbps > 0 && s.gemm_efficiency > 0 && s.bandwidth_efficiency > 0 &&
                    s.grouped_gemm_efficiency > 0,
                "--gpu " << name << ": the profile needs name, sms, bf16_tflops, fp32_tflops, hbm_gbps, memory_gib, "
                         << "host_link_gbps, gemm_efficiency and bandwidth_efficiency > 0 (or a \"base\" GPU)");
    if (s.description.empty()) s.description = s.name;
    s.sources.push_back("profile " + name);
    return s;
}

Topology apply_cluster_flags(const ClusterFlags& f, const emu::GpuSpec& spec) {
    Topology t = cluster_topology(f.cluster);
    const bool link = f.cluster.rfind("link:", 0) == 0;
    t.gpu = spec.name;
    if (!f.any_override()) return t;
    SCMOE_CHECK(!link, "--cluster " << f.cluster << ": a link: cluster takes its own keys (gbyte_s, latency_us, "
                                    << "gpus), not --nodes, --gpus-per-node, --fabric, --gpu-link-gbyte-s or "
                                    << "--nic-gbit-s");
    auto drop = [&](const std::string& about) {
        std::erase_if(t.assumptions, [&](const Topology::Assumption& a) { return a.about == about; });
    };
    std::string name = t.name;
    if (f.nodes) {
        SCMOE_CHECK(*f.nodes >= 1, "--nodes " << *f.nodes << ": expected 1 or more nodes");
        t.nodes = *f.nodes;
        name += "+nodes=" + std::to_string(t.nodes);
    }
    if (f.gpus_per_node) {
        SCMOE_CHECK(*f.gpus_per_node >= 1, "--gpus-per-node " << *f.gpus_per_node << ": expected 1 or more GPUs");
        t.gpus_per_node = *f.gpus_per_node;
        name += "+gpus-per-node=" + std::to_string(t.gpus_per_node);
    }
    if (f.fabric) {
        const std::string& fabric = *f.fabric;
        SCMOE_CHECK(fabric == "pcie" || fabric == "nvlink", "--fabric " << fabric << ": expected nvlink or pcie");
        if (fabric == "pcie" && t.fabric != Topology::Fabric::kPcie) {
            t.fabric = Topology::Fabric::kPcie;
            t.gpu_link_gbps = spec.host_link_gbps;  // the GPU's own PCIe link
            t.gpus_per_switch = 4;
            t.switch_uplink_gbps = t.gpu_link_gbps;
            t.link_efficiency = 0.8;
            t.hop_latency_us = 5.7;  // NCCL src/graph/tuning.cc, PCIe per step
            t.comm_sms = 8;          // NCCL src/graph/paths.cc: 2 p2p channels per PCIe peer
            drop("nvlink");
            t.assumptions.push_back({"pcie-efficiency", "NCCL reaches 80% of a PCIe link, as on NVLink (no PCIe "
                                                        "measurement found)"});
        } else if (fabric == "nvlink" && t.fabric != Topology::Fabric::kNvlink) {
            SCMOE_CHECK(f.gpu_link_gbyte_s, "--fabric nvlink on the PCIe preset " << t.name
                                                << " needs --gpu-link-gbyte-s (the NVLink bandwidth per GPU per "
                                                   "direction in GB/s, e.g. 300 for an A100's 600 GB/s NVLink)");
            t.fabric = Topology::Fabric::kNvlink;
            t.gpus_per_switch = 0;
            t.switch_uplink_gbps = 0;
            t.link_efficiency = 0.78;  // the A100's nccl-tests all_reduce (the a800-nvlink-8 preset's source)
            t.hop_latency_us = 3.4;
            t.comm_sms = 16;
            drop("pcie-switches");
            drop("pcie-efficiency");
            t.assumptions.push_back({"nvlink", "--fabric nvlink: every GPU of a node reaches every other at its full "
                                               "link rate (an NVSwitch board), NCCL at 78% of it (the A100's), 16 "
                                               "channels"});
        }
        name += "+fabric=" + fabric;
    }
    if (f.gpu_link_gbyte_s) {
        SCMOE_CHECK(*f.gpu_link_gbyte_s > 0 && std::isfinite(*f.gpu_link_gbyte_s),
                    "--gpu-link-gbyte-s " << *f.gpu_link_gbyte_s << ": expected GB/s > 0");
        t.gpu_link_gbps = *f.gpu_link_gbyte_s;
        if (t.fabric == Topology::Fabric::kPcie) t.switch_uplink_gbps = t.gpu_link_gbps;
        name += "+gpu-link-gbyte-s=" + number(t.gpu_link_gbps);
    }
    if (f.nic_gbit_s) {
        SCMOE_CHECK(*f.nic_gbit_s > 0 && std::isfinite(*f.nic_gbit_s),
                    "--nic-gbit-s " << *f.nic_gbit_s << ": expected a line rate in Gb/s > 0 (e.g. 100 for 100 GbE)");
        SCMOE_CHECK(t.nodes > 1, "--nic-gbit-s " << number(*f.nic_gbit_s) << ": the cluster " << t.name
                                                 << " has one node, with no NICs between nodes (--nodes N for more)");
        if (t.nic_gbps <= 0) {
            // A single-node preset made multi-node: the NICs' kind and efficiency are not known.
            t.nic_efficiency = 0.9;
            t.nics_per_node = 0;
            t.nic_kind.clear();
            t.assumptions.push_back({"nic-efficiency", "the NICs reach 90% of their line rate (as the a800-2x8 "
                                                       "preset's Ethernet)"});
        }
        t.nic_gbps = *f.nic_gbit_s / 8;
        t.nics_per_node = 0;  // the rate given is all of a node's NICs together
        drop("nic");
        name += "+nic-gbit-s=" + number(*f.nic_gbit_s);
    }
    if (t.fabric == Topology::Fabric::kPcie && t.gpus_per_switch > t.gpus_per_node) t.gpus_per_switch = t.gpus_per_node;
    // A PCIe tree changed by the overrides: its switches are still an assumption, now of this shape.
    if (t.fabric == Topology::Fabric::kPcie && (f.gpus_per_node || f.fabric || f.gpu_link_gbyte_s)) {
        drop("pcie-switches");
        const int switches = (t.gpus_per_node + t.gpus_per_switch - 1) / t.gpus_per_switch;
        t.assumptions.insert(t.assumptions.begin(),
                             {"pcie-switches", std::to_string(switches) + " PCIe switch" + (switches > 1 ? "es" : "") +
                                                   " of " + std::to_string(t.gpus_per_switch) +
                                                   " GPUs per node, each with one uplink of " +
                                                   number(t.switch_uplink_gbps) +
                                                   " GB/s per direction to the CPU (the servers' PCIe tree is not "
                                                   "known)"});
    }
    SCMOE_CHECK(t.nodes == 1 || t.nic_gbps > 0,
                "a cluster of " << t.nodes << " nodes needs --nic-gbit-s (the line rate of a node's NICs together, "
                                << "in Gb/s: 100 for one 100 GbE NIC, 3200 for 8x 400 Gb/s NDR)");
    t.name = name;
    return t;
}

EmuChoice resolve_emu_device(std::string gpu, std::string routing) {
    EmuChoice c;
    if (!gpu.empty()) c.gpu = std::move(gpu);
    if (!routing.empty()) c.routing = std::move(routing);
    c.spec = load_gpu(c.gpu);
    emu::parse_routing_model(c.routing);
    return c;
}

EmuChoice resolve_emu_choice(std::string gpu, std::string routing, const ClusterFlags& flags, int ranks) {
    EmuChoice c = resolve_emu_device(std::move(gpu), std::move(routing));
    c.flags = flags;
    if (c.flags.cluster.empty()) {
        SCMOE_CHECK(!is_gpu_profile(c.gpu),
                    "--gpu " << c.gpu << " is a profile: give --cluster (a preset such as a30-pcie-8 or a800-2x8, "
                             << "with --gpus-per-node, --nodes, --fabric, --gpu-link-gbyte-s and --nic-gbit-s for "
                             << "your machines); the interconnect is not guessed from the GPU");
        c.flags.cluster = default_node(c.spec.name);
        c.cluster_note = "cluster " + c.flags.cluster + ": the " + c.spec.name +
                         "'s default 8-GPU node (no --cluster given)";
    }
    c.cluster = c.flags.cluster;
    c.topology = apply_cluster_flags(c.flags, c.spec);
    SCMOE_CHECK(ranks <= c.topology.world_size(), "--ranks " << ranks << ": cluster " << c.topology.name << " has "
                                                             << c.topology.world_size() << " GPUs");
    return c;
}

EmuChoice resolve_emu_choice(std::string gpu, std::string cluster, std::string routing, int ranks) {
    ClusterFlags f;
    f.cluster = std::move(cluster);
    return resolve_emu_choice(std::move(gpu), std::move(routing), f, ranks);
}

std::string emu_choice_flags(const EmuChoice& c) {
    std::ostringstream os;
    os << "--gpu " << c.gpu << " --cluster " << c.flags.cluster;
    if (c.flags.nodes) os << " --nodes " << *c.flags.nodes;
    if (c.flags.gpus_per_node) os << " --gpus-per-node " << *c.flags.gpus_per_node;
    if (c.flags.fabric) os << " --fabric " << *c.flags.fabric;
    if (c.flags.gpu_link_gbyte_s) os << " --gpu-link-gbyte-s " << number(*c.flags.gpu_link_gbyte_s);
    if (c.flags.nic_gbit_s) os << " --nic-gbit-s " << number(*c.flags.nic_gbit_s);
    if (c.routing != "balanced") os << " --routing " << c.routing;
    if (c.stack != "scmoe") os << " --stack " << c.stack;  // a replay predicts under the same stack
    return os.str();
}

std::vector<std::string> cluster_notes(const EmuChoice& c) {
    std::vector<std::string> out;
    for (const Topology::Assumption& a : c.topology.assumptions) out.push_back("assumed: " + a.text);
    if (!c.cluster_note.empty()) out.push_back(c.cluster_note);
    return out;
}

std::unique_ptr<Device> make_emu_device(const EmuChoice& choice) {
    emu::EmuOptions options;
    options.spec = choice.spec.name.empty() ? load_gpu(choice.gpu) : choice.spec;
    options.routing = emu::parse_routing_model(choice.routing);
    options.stack = load_stack(choice.stack);
    return emu::make_device(std::move(options));
}

}  // namespace scmoe::launch
