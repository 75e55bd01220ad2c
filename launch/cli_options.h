// Command-line pieces scmoe-train, scmoe-plan and scmoe-bench share: the model-shape flags, the
// emulated cluster's flags (one parser, so a command one tool prints the others accept), renamed
// flags, and comma lists. Bad
// values throw scmoe::Error; callers turn it into their usage error. (Built with the executables:
// cxxopts is found only with SCMOE_BUILD_BENCH.)
#pragma once

#include <cstdint>
#include <cxxopts.hpp>
#include <string>
#include <vector>

#include "launch/emu_choice.h"
#include "scmoe/models/lm_config.h"

namespace scmoe::launch {

// "a,b,,c" -> {"a", "b", "c"}.
std::vector<std::string> split_comma_list(const std::string& text);

// --preset --layers --hidden --heads --kv-heads --seq --ffn --activation --experts --expert-ffn --vocab into
// group "model".
void add_model_shape_options(cxxopts::Options& options, const std::string& default_preset,
                             const std::string& default_vocab);
// The preset with the given overrides. `custom` (optional): set when a shape flag overrode the preset.
models::LmConfig read_model_shape_options(const cxxopts::ParseResult& result, bool* custom = nullptr);

// The emulated cluster's flags, into `group`: --cluster, --nodes, --gpus-per-node, --fabric,
// --gpu-link-gbyte-s, --nic-gbit-s (units in the names: Gb/s for a NIC's line rate as NICs are sold,
// GB/s for a GPU link). `nic_list`: --nic-gbit-s takes a comma list (scmoe-plan's sweep). Also adds
// the renamed --nic-gbps to group "renamed", which no tool lists in --help.
void add_cluster_options(cxxopts::Options& options, const std::string& group, bool nic_list = false);
// Reads them. Without `nic_sweep` a list of NIC speeds is refused; with it, it gets every speed (one
// when a single one or none was given: then empty) and flags.nic_gbit_s the first. Throws Error naming
// the flag (a renamed one names its new name).
ClusterFlags read_cluster_options(const cxxopts::ParseResult& result, std::vector<double>* nic_sweep = nullptr);
// True when any cluster flag was given (they need --backend emu in scmoe-train and scmoe-bench).
bool any_cluster_option(const cxxopts::ParseResult& result);

// Adds a flag that was renamed, to group "renamed" (unlisted in --help); refuse_renamed_options
// throws Error naming its new name and the unit change, rather than reading it in another unit.
void add_renamed_option(cxxopts::Options& options, const std::string& old_name);
void refuse_renamed_options(const cxxopts::ParseResult& result);
// The groups of `options` that --help lists: all but "renamed".
std::vector<std::string> help_groups(const cxxopts::Options& options);

}  // namespace scmoe::launch
