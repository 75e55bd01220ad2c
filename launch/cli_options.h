// Command-line pieces the executables share: the model-shape flags (scmoe-train, scmoe-plan) and the
// emulated-GPU flags (scmoe-train, scmoe-plan, scmoe-bench). Bad values throw scmoe::Error; callers
// turn it into their usage error.
#pragma once

#include <cstdint>
#include <cxxopts.hpp>
#include <memory>
#include <string>
#include <vector>

#include "comm/topology.h"
#include "kernels/device.h"
#include "models/lm_config.h"

namespace scmoe::launch {

// "a,b,,c" -> {"a", "b", "c"}.
std::vector<std::string> split_comma_list(const std::string& text);

// --preset --layers --hidden --heads --seq --ffn --experts --expert-ffn --vocab into group "model".
void add_model_shape_options(cxxopts::Options& options, const std::string& default_preset,
                             const std::string& default_vocab);
// The preset with the given overrides. `custom` (optional): set when a shape flag overrode the preset.
models::LmConfig read_model_shape_options(const cxxopts::ParseResult& result, bool* custom = nullptr);

// The emulated GPUs a run asks for: --gpu (default h100), --cluster (default the GPU's 8-GPU node),
// --routing (default balanced).
struct EmuChoice {
    std::string gpu = "h100";
    std::string cluster;
    std::string routing = "balanced";
};
// Checks the names and that `ranks` fit the cluster; fills the defaults.
EmuChoice resolve_emu_choice(std::string gpu, std::string cluster, std::string routing, int ranks);
// An emulated GPU of that choice.
std::unique_ptr<Device> make_emu_device(const EmuChoice& choice);

}  // namespace scmoe::launch
