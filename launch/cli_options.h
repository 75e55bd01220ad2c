// Command-line pieces scmoe-train and scmoe-plan share: the model-shape flags and comma lists. Bad
// values throw scmoe::Error; callers turn it into their usage error. (Built with the executables:
// cxxopts is found only with SCMOE_BUILD_BENCH.)
#pragma once

#include <cstdint>
#include <cxxopts.hpp>
#include <string>
#include <vector>

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

}  // namespace scmoe::launch
