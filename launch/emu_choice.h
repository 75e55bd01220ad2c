// The emulated GPUs a run asks for (--gpu, --routing and the cluster flags of scmoe-train, scmoe-plan
// and scmoe-bench): checked once, with their defaults, and the device they make. --gpu names a
// built-in spec (a30, a800, h100, h200) or a profile JSON file (docs/emu.md, "Profiles"). The cluster
// is a Topology preset (--cluster) with the overrides every tool takes alike (ClusterFlags; the
// command-line side is launch/cli_options.h). Bad values throw scmoe::Error naming the flag or the
// profile's field; callers turn it into their usage error.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "scmoe/comm/topology.h"
#include "scmoe/kernels/device.h"
#include "scmoe/kernels/emu/gpu_spec.h"

namespace scmoe::launch {

// The cluster flags, as given (empty / nullopt: not given).
struct ClusterFlags {
    std::string cluster;                   // --cluster PRESET (or link:gbyte_s=...)
    std::optional<int> nodes;              // --nodes
    std::optional<int> gpus_per_node;      // --gpus-per-node
    std::optional<std::string> fabric;     // --fabric nvlink|pcie
    std::optional<double> gpu_link_gbyte_s;  // --gpu-link-gbyte-s: per GPU, one direction, GB/s
    std::optional<double> nic_gbit_s;      // --nic-gbit-s: per node, all NICs, line rate in Gb/s

    bool any_override() const {
        return nodes || gpus_per_node || fabric || gpu_link_gbyte_s || nic_gbit_s;
    }
};

struct EmuChoice {
    std::string gpu = "h100";  // a built-in name or a profile's path
    std::string cluster;       // the Topology preset the cluster starts from
    std::string routing = "balanced";
    std::string stack = "scmoe";  // --stack: a built-in stack or a stack JSON (launch/emu_stack.h)
    emu::GpuSpec spec;         // resolved from `gpu`
    ClusterFlags flags;        // as given (cluster filled with the preset used)
    Topology topology;         // the cluster: the preset with the overrides, its gpu the emulated GPU's name
    std::string cluster_note;  // how the cluster was chosen when --cluster was not given; else empty
};

// A built-in spec, or a profile: {"base": "h100", <GpuSpec fields to override>} or every field.
// Strict: an unknown key, a value of the wrong type or out of range is an error naming the field.
emu::GpuSpec load_gpu(const std::string& name_or_profile);
bool is_gpu_profile(const std::string& name_or_profile);  // a path ending in .json

// The GPU and routing only (a single emulated device: scmoe-bench gemm, layer, attention).
EmuChoice resolve_emu_device(std::string gpu, std::string routing);
// The GPU, routing and cluster; checks that `ranks` fit the cluster. Without --cluster a built-in GPU
// gets its 8-GPU node (cluster_note says so); a profile needs --cluster (the planner does not guess a
// profile's interconnect).
EmuChoice resolve_emu_choice(std::string gpu, std::string routing, const ClusterFlags& flags, int ranks);
// Kept for callers that take only --cluster.
EmuChoice resolve_emu_choice(std::string gpu, std::string cluster, std::string routing, int ranks);
// The preset with the overrides applied (checked; the overridden parameters lose their assumptions,
// and the overrides' own assumptions are added). `spec`: the GPU (its PCIe link for --fabric pcie).
Topology apply_cluster_flags(const ClusterFlags& flags, const emu::GpuSpec& spec);

// The flags that give this choice again, for a command another tool accepts as is:
// "--gpu a30 --cluster a800-2x8 --gpus-per-node 4 --nic-gbit-s 200" (routing included when not balanced,
// the stack when not scmoe).
std::string emu_choice_flags(const EmuChoice& choice);
// Lines to print under a tool's header: each "assumed: ..." of the cluster, and cluster_note.
std::vector<std::string> cluster_notes(const EmuChoice& choice);

// An emulated GPU of that choice.
std::unique_ptr<Device> make_emu_device(const EmuChoice& choice);

}  // namespace scmoe::launch
