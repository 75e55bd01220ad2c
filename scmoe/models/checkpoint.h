// Training checkpoints: everything a step depends on, in safetensors files a Python reader can open.
//
//   root/latest                           "step-00000100" (written atomically, last)
//   root/step-00000100/
//     dense.safetensors                   every replicated tensor: the f32 master weight under its
//                                         name, AdamW moments as <name>.adam_m / <name>.adam_v
//     experts-00001-of-00002.safetensors  expert-parallel rank 0's experts, one tensor per expert:
//                                         <name>.<global expert> (+ .adam_m / .adam_v)
//     model.safetensors.index.json        the weight map (Hugging Face layout) of every tensor
//     trainer_state.json                  format, step, world, ep, the model config
//     rank-00000.json ...                 each rank's data position
// Each file is written atomically (temp, fsync, rename) into step-N.tmp/, which is renamed to
// step-N only when every rank has written; older checkpoints beyond `keep` are deleted after that,
// so a failed or interrupted save never touches the previous checkpoint.
//
// Loading checks the format, that the model config and the world / ep sizes are the same, and every
// file (safetensors CRC and structure, shapes, presence of every tensor) before anything changes;
// then every rank applies it. A failure on any rank fails the load on every rank, leaving the
// trainer as it was.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "scmoe/models/data.h"
#include "scmoe/models/lm.h"
#include "scmoe/models/optimizer.h"
#include "scmoe/models/parallel.h"

namespace scmoe {
class Communicator;
}

namespace scmoe::models {

// What a checkpoint saves and restores (borrowed). optimizers[i] updates model.param_groups()[i].
struct CheckpointTarget {
    const ParallelLayout& layout;
    Communicator* world;  // null only for world size 1
    LanguageModel& model;
    std::vector<AdamW*> optimizers;
    ByteBatcher& batcher;
    std::int64_t& step;
};

// A checkpoint's trainer_state.json.
struct CheckpointState {
    std::int64_t step = 0;  // steps taken
    int world = 0, ep = 0;  // the world and expert-parallel sizes that wrote it
    std::string config;     // the model's LmConfig as JSON text (LmConfig::from_json reads it)
};

// Parses the text of `dir`/trainer_state.json (load_checkpoint's first check; pure, for tests and
// fuzzing). Throws scmoe::Error "<dir>/trainer_state.json: corrupted checkpoint state: <what>" when it
// is not a JSON object with format, step, world, ep and config, and "<dir>: format <f>, expected
// scmoe-checkpoint-v1" for another format.
CheckpointState parse_checkpoint_state(const std::string& text, const std::string& dir);
// Parses the text of a checkpoint's rank-NNNNN.json at `path`: that rank's data position. Throws
// scmoe::Error "<path>: corrupted checkpoint rank state: <what>".
ByteBatcherState parse_checkpoint_rank_state(const std::string& text, const std::string& path);

// Collective over the world. Returns the checkpoint directory written.
std::string save_checkpoint(const std::string& root, CheckpointTarget target, int keep = 2);
// Collective. `path`: a root with a `latest` file, or one step-N directory.
void load_checkpoint(const std::string& path, CheckpointTarget target);

}  // namespace scmoe::models
