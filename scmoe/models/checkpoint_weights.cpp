// A checkpoint's weights without its trainer (open_checkpoint_weights, load_checkpoint_weights): for
// evaluation and generation from a training checkpoint.
#include "scmoe/models/checkpoint.h"

#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "scmoe/kernels/error.h"
#include "scmoe/kernels/host_io.h"
#include "scmoe/models/detail/checkpoint_files.h"
#include "scmoe/models/lm.h"
#include "scmoe/models/safetensors.h"

namespace scmoe::models {

using namespace detail;

CheckpointWeights open_checkpoint_weights(const std::string& path) {
    SCMOE_CHECK(fs::exists(path), "no checkpoint at " << path << ": it does not exist");
    CheckpointWeights w;
    const fs::path dir = resolve_step_dir(path, w.notes);
    w.dir = dir.string();
    w.state = read_verified_state(dir).state;
    try {
        w.config = LmConfig::from_json(w.state.config);
    } catch (const nlohmann::json::exception& e) {
        SCMOE_FAIL((dir / kStateName).string() << ": corrupted checkpoint state: its config: " << e.what());
    } catch (const Error& e) {
        SCMOE_FAIL((dir / kStateName).string() << ": corrupted checkpoint state: its config: " << e.what());
    }
    SCMOE_CHECK(w.state.ep >= 1 && w.config.moe.num_experts % w.state.ep == 0,
                (dir / kStateName).string() << ": corrupted checkpoint state: ep " << w.state.ep << " for "
                                            << w.config.moe.num_experts << " experts");
    return w;
}

void load_checkpoint_weights(const CheckpointWeights& w, LanguageModel& model) {
    LmConfig ours = model.config(), theirs = w.config;
    ours.backbone.dtype = ours.moe.dtype = theirs.backbone.dtype = theirs.moe.dtype = DType::kF32;
    SCMOE_CHECK(ours.to_json() == theirs.to_json(),
                "the checkpoint's model config differs:" << describe_config_difference(ours.to_json(), theirs.to_json()));
    const fs::path dir = w.dir;
    const CheckpointManifest man = parse_checkpoint_manifest(read_manifest_text(dir), dir.string());
    std::map<std::string, SafetensorsFile> files;  // read on first use, verified
    auto file = [&](const std::string& name) -> const SafetensorsFile& {
        auto it = files.find(name);
        if (it != files.end()) return it->second;
        check_sum(dir, man, name, file_sum((dir / name).string()));
        SafetensorsFile f = read_safetensors((dir / name).string());
        check_ids(dir / name, man, meta_value(f, kRunIdKey), meta_value(f, kSaveIdKey));
        const auto step = f.metadata.find("step");
        SCMOE_CHECK(step != f.metadata.end() && step->second == std::to_string(w.state.step),
                    (dir / name).string() << ": its step differs from trainer_state.json (mixed checkpoints)");
        return files.emplace(name, std::move(f)).first->second;
    };
    const int experts_per_file = w.config.moe.num_experts / w.state.ep;
    model.blocks().synchronize();
    for (const ParamGroup& g : model.param_groups()) {
        std::vector<float> host(static_cast<std::size_t>(g.numel), 0.0f);
        for (const NamedTensor& nt : g.tensors) {
            for (const Slice& sl : slices_of(nt)) {
                std::string name = "dense.safetensors";
                if (nt.expert) {
                    const int global = std::stoi(sl.name.substr(sl.name.rfind('.') + 1));
                    name = expert_file_name(global / experts_per_file, w.state.ep);
                }
                const SafetensorsFile& f = file(name);
                const auto it = f.tensors.find(sl.name);
                SCMOE_CHECK(it != f.tensors.end(), (dir / name).string() << ": tensor " << sl.name << " is missing");
                SCMOE_CHECK(it->second.dtype == SafetensorsDType::kF32 && it->second.shape == sl.shape,
                            (dir / name).string() << ": tensor " << sl.name << " has the wrong dtype or shape");
                std::memcpy(host.data() + sl.offset, it->second.bytes.data(), it->second.bytes.size());
            }
        }
        copy_from_host(host, Tensor(g.params, g.dtype, {g.numel}), model.stream());  // converts; synchronizes
    }
}

}  // namespace scmoe::models
