// Fuzzes the JSON files of a checkpoint directory (scmoe/models/checkpoint.h, scmoe/models/safetensors.h): the
// input is given to each reader in turn, as trainer_state.json (parse_checkpoint_state, then the
// model config it holds: LmConfig::from_json and validate), as rank-NNNNN.json
// (parse_checkpoint_rank_state), as model.safetensors.index.json (read_safetensors_index) and as
// manifest.json (parse_checkpoint_manifest). Bad text must throw scmoe::Error; an accepted model
// config must read back from its own to_json(); an accepted manifest names only plain files with
// sizes >= 0.
#include <cstddef>
#include <cstdint>
#include <string>

#include "scmoe/kernels/error.h"
#include "scmoe/models/checkpoint.h"
#include "scmoe/models/lm_config.h"
#include "scmoe/models/safetensors.h"
#include "tests/fuzz/fuzz_util.h"

namespace models = scmoe::models;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    static const scmoe::fuzz::ScratchFile index_file("index");
    const std::string text(reinterpret_cast<const char*>(data), size);
    try {
        const models::CheckpointState st = models::parse_checkpoint_state(text, "ckpt/step-00000001");
        const models::LmConfig config = models::LmConfig::from_json(st.config);
        config.validate();
        const std::string json = config.to_json();
        if (models::LmConfig::from_json(json).to_json() != json)
            scmoe::fuzz::property_failed("a model config does not read back from its to_json()");
        (void)config.describe();
    } catch (const scmoe::Error&) {
    }
    try {
        (void)models::parse_checkpoint_rank_state(text, "ckpt/step-00000001/rank-00000.json");
    } catch (const scmoe::Error&) {
    }
    try {
        const models::CheckpointManifest m = models::parse_checkpoint_manifest(text, "ckpt/step-00000001");
        for (const auto& [name, file] : m.files) {
            if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos || file.bytes < 0)
                scmoe::fuzz::property_failed("the manifest names a file that is not a plain file name, or bytes < 0");
        }
    } catch (const scmoe::Error&) {
    }
    index_file.write(text);
    try {
        const scmoe::SafetensorsIndex index = scmoe::read_safetensors_index(index_file.path());
        for (const auto& [name, shard] : index.weight_map) {
            if (shard.empty() || shard == "." || shard == ".." || shard.find('/') != std::string::npos)
                scmoe::fuzz::property_failed("the index names a shard that is not a plain file name");
        }
    } catch (const scmoe::Error&) {
    }
    return 0;
}
