// The emulated GPUs a run asks for (--gpu, --cluster, --routing of scmoe-train, scmoe-plan and
// scmoe-bench): checked once, with their defaults, and the device they make. --gpu names a built-in
// spec (a30, a800, h100, h200) or a profile JSON file (docs/emu.md, "Profiles"). Bad values throw
// scmoe::Error; callers turn it into their usage error.
#pragma once

#include <memory>
#include <string>

#include "scmoe/kernels/device.h"
#include "scmoe/kernels/emu/gpu_spec.h"

namespace scmoe::launch {

struct EmuChoice {
    std::string gpu = "h100";  // a built-in name or a profile's path
    std::string cluster;       // a Topology preset; default: the GPU's 8-GPU node
    std::string routing = "balanced";
    std::string stack = "scmoe";  // --stack: a built-in stack or a stack JSON (launch/emu_stack.h)
    emu::GpuSpec spec;         // resolved from `gpu`
};

// A built-in spec, or a profile: {"base": "h100", <GpuSpec fields to override>} or every field.
emu::GpuSpec load_gpu(const std::string& name_or_profile);
// Checks the names and that `ranks` fit the cluster; fills the defaults and the spec.
EmuChoice resolve_emu_choice(std::string gpu, std::string cluster, std::string routing, int ranks);
// An emulated GPU of that choice.
std::unique_ptr<Device> make_emu_device(const EmuChoice& choice);

}  // namespace scmoe::launch
