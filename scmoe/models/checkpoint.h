// Training checkpoints: everything a step depends on, in safetensors files a Python reader can open,
// tied together and verified by a manifest.
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
//     manifest.json                       written last: the run id and the save id, the size and
//                                         CRC-32 of every other file, the training settings
//                                         (optimizer, schedule, batch, clipping), the data's
//                                         fingerprint (files, sizes, CRC-32 of each file's bytes)
// Every file carries the run id and the save id (safetensors metadata "scmoe.run_id" /
// "scmoe.save_id", JSON keys "run_id" / "save_id"): a file of another run or another save of the
// same step is refused even before its checksum is compared. The run id is drawn at a run's first
// save and kept across resumes; the save id is new for every save.
//
// The save protocol (crash-safe: a crash at any point leaves the previous checkpoint and a `latest`
// naming a complete step, or the new ones):
//   1. rank 0 creates root/step-N.tmp/ (removing a stale one);
//   2. every rank writes its files there, each atomically (temp file, fsync, rename, fsync the dir),
//      reads them back and sends their sizes and CRCs to rank 0;
//   3. rank 0 writes trainer_state.json, then manifest.json (fsync'ed, the directory too);
//   4. rank 0 renames step-N.tmp to step-N and fsyncs root. When step-N already exists (a re-save
//      after a rollback) the two are exchanged atomically (renameat2 RENAME_EXCHANGE), so step-N
//      is always a complete checkpoint, the old one until the exchange, the new one after it; the
//      old one is deleted only after step 5. Without the exchange (NFS: EINVAL) the old step-N is
//      renamed to step-N.old first, which a load's fallback takes while step-N is missing;
//   5. rank 0 writes root/latest atomically (fsync'ed, with root);
//   6. rank 0 deletes the older steps beyond `keep` (never the step this run resumed from; steps
//      newer than this one, abandoned by a rollback, are left alone).
//
// Loading verifies everything before anything changes: the manifest (mandatory; so are the
// checksums), every file's size and CRC, the run and save ids in every file, the format, the
// model config and the world / ep sizes (never allowed to change), then the training settings and
// the data fingerprint: a setting that differs is refused, naming it and both values, unless it is
// listed in `allow_change` (then the change is reported in CheckpointLoad::notes). Then every rank
// applies it. A failure on any rank fails the load on every rank, leaving the trainer as it was;
// the rank that saw it names its cause, and the others name that rank and the cause.
//
// A run that saves opens its directory first (open_checkpoint_dir: the lock, a fresh run over old
// checkpoints, writability and room; after a rollback to an older step of the directory, `latest`
// names that step at once).
//
// A root whose `latest` is missing, unreadable or names a step that is not there or has no
// manifest (a crash before step 5, a deleted pointer) is loaded from its newest step directory that
// verifies, and CheckpointLoad::notes says so. A `latest` naming a complete step that fails
// verification (a corrupted file) is refused: that needs a person.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "scmoe/models/data.h"
#include "scmoe/models/lm.h"
#include "scmoe/models/optimizer.h"
#include "scmoe/models/parallel.h"

namespace scmoe {
class Communicator;
}

namespace scmoe::models {

// The run a checkpoint belongs to and what it was trained with: the caller (Trainer) owns one for
// the run and passes it to every save and load.
struct CheckpointRun {
    // The training settings a resume must match, by the scmoe-train flag that sets each (names from
    // checkpoint_setting_names()): name -> JSON value text ("0.003", "200"). The seed is not among
    // them: a resume takes the parameters and the data order from the checkpoint.
    std::vector<std::pair<std::string, std::string>> settings;
    std::vector<std::string> data;   // the training files, fingerprinted on rank 0 (read once, cached)
    std::string run_id;              // "": drawn at the first save; a load sets the checkpoint's
    std::string resumed_from;        // the step directory loaded last, never deleted by `keep`
    std::string data_fingerprint;    // cache (JSON text), filled on rank 0 at the first save or load
    std::shared_ptr<void> dir_lock;  // rank 0: the checkpoint directory's lock (open_checkpoint_dir)
};

// The names `allow_change` may hold: the settings ("lr", "min-lr", "warmup", "steps",
// "weight-decay", "beta1", "beta2", "eps", "clip", "batch") and "data".
const std::vector<std::string>& checkpoint_setting_names();

// What a checkpoint saves and restores (borrowed). optimizers[i] updates model.param_groups()[i].
struct CheckpointTarget {
    const ParallelLayout& layout;
    Communicator* world;  // null only for world size 1
    LanguageModel& model;
    std::vector<AdamW*> optimizers;
    ByteBatcher& batcher;
    std::int64_t& step;
    // null: no settings or data are recorded or compared, and every save draws a new run id.
    CheckpointRun* run = nullptr;
};

// A checkpoint's trainer_state.json.
struct CheckpointState {
    std::int64_t step = 0;        // steps taken
    int world = 0, ep = 0;        // the world and expert-parallel sizes that wrote it
    std::string config;           // the model's LmConfig as JSON text (LmConfig::from_json reads it)
    std::string run_id, save_id;  // "" when absent (load_checkpoint requires the manifest's)
};

// A checkpoint's manifest.json.
struct CheckpointManifest {
    std::string run_id, save_id;
    std::int64_t step = 0;
    struct File {
        std::int64_t bytes = 0;
        std::uint32_t crc32 = 0;
    };
    std::map<std::string, File> files;  // by plain file name in the step directory
    std::string settings;               // JSON object text: CheckpointRun::settings ("{}" without a run)
    std::string data;                   // JSON text: the data fingerprint ("null" without a run)
};

// Parses the text of `dir`/trainer_state.json (load_checkpoint's first check; pure, for tests and
// fuzzing). Throws scmoe::Error "<dir>/trainer_state.json: corrupted checkpoint state: <what>" when it
// is not a JSON object with format, step, world, ep and config, and "<dir>: format <f>, expected
// scmoe-checkpoint-v1" for another format.
CheckpointState parse_checkpoint_state(const std::string& text, const std::string& dir);
// Parses the text of a checkpoint's rank-NNNNN.json at `path`: that rank's data position. Throws
// scmoe::Error "<path>: corrupted checkpoint rank state: <what>".
ByteBatcherState parse_checkpoint_rank_state(const std::string& text, const std::string& path);
// Parses the text of `dir`/manifest.json. Throws scmoe::Error "<dir>/manifest.json: corrupted
// checkpoint manifest: <what>" unless it has the format, ids, step, and every file with its size and
// CRC (8 hex digits) under a plain file name.
CheckpointManifest parse_checkpoint_manifest(const std::string& text, const std::string& dir);

// What load_checkpoint did.
struct CheckpointLoad {
    std::string dir;                 // the step directory loaded
    std::string run_id;              // the checkpoint's run id (the run continues it)
    std::vector<std::string> notes;  // a fallback from a bad `latest`, allowed setting changes
                                     // (complete on rank 0; print them there)
};

// Collective over the world. Returns the checkpoint directory written (the protocol: the top of
// this file).
std::string save_checkpoint(const std::string& root, CheckpointTarget target, int keep = 2);
// Collective. `path`: a root (its `latest`, or its newest step that verifies when `latest` is
// missing or dangling), or one step-N directory. `allow_change`: setting names (or "data") that
// may differ from the checkpoint's; anything else that differs is refused.
CheckpointLoad load_checkpoint(const std::string& path, CheckpointTarget target,
                               const std::vector<std::string>& allow_change = {});
// How a run uses its checkpoint directory (open_checkpoint_dir).
struct CheckpointDirOptions {
    int keep = 2;            // checkpoints kept (save_checkpoint's keep; <= 0: all)
    std::int64_t saves = 1;  // checkpoints the run will write (the room needed when keep <= 0)
    bool overwrite = false;  // a fresh run may delete the checkpoints already in the directory
};

// Collective, at the start of a run that saves into `root`: after a resume (load_checkpoint),
// before the first step, so that a problem is found before any training is lost. Rank 0
//  - creates `root` and locks it: root/lock, an flock(2) held while `target.run` lives, naming the
//    holder ("host H pid P run R since T"); a second trainer is refused with "the checkpoint
//    directory is locked by host H, pid P, run R (since T)". A lock file whose holder ended without
//    releasing it (its flock went with the process) is taken over, with a note naming it;
//  - refuses a fresh run (nothing resumed into target.run) in a directory that holds checkpoints,
//    naming them and their run, unless options.overwrite: then it deletes them, with a note;
//  - after a resume from an older step of `root` (a rollback), points root/latest at that step, with
//    a note naming the newer steps (left on disk);
//  - checks that `root` is writable (a probe file written, fsync'ed and removed) and has room for
//    the checkpoints options.keep implies (keep + 1 while a save is written, less the steps already
//    there; each the f32 weights and two AdamW moments of every parameter, estimated from the
//    model), naming both numbers if not.
// Needs target.run (which keeps the lock). Returns the notes (rank 0's).
std::vector<std::string> open_checkpoint_dir(const std::string& root, CheckpointTarget target,
                                             const CheckpointDirOptions& options);

// For inference (scmoe-generate, scmoe/models/decoder.h): a checkpoint's model config and weights,
// whatever world and ep wrote it. open_checkpoint_weights resolves `path` as load_checkpoint does (a
// step directory, or a root's `latest`, or its newest step that verifies), checks the manifest and
// trainer_state.json (sizes, CRCs, ids, format) and parses the config; not a collective.
struct CheckpointWeights {
    std::string dir;                 // the step directory
    CheckpointState state;           // step, world, ep and the config text
    LmConfig config;                 // the model (dtype as saved: set the device's compute dtype)
    std::vector<std::string> notes;  // a fallback from a bad `latest`
};
CheckpointWeights open_checkpoint_weights(const std::string& path);
// Writes the checkpoint's master weights into `model`'s parameters (converted to its dtype),
// verifying every file it reads (size, CRC, ids, step). Expert tensors are read by global expert
// from whichever of the checkpoint's expert files holds them, so any expert-parallel size loads any
// checkpoint. The model's config must equal the checkpoint's but for the dtype. Synchronizes.
void load_checkpoint_weights(const CheckpointWeights& checkpoint, LanguageModel& model);

// Whether `path` holds a checkpoint to resume: a `latest` file, a step directory (manifest.json or
// trainer_state.json), or a step-NNNNNNNN directory (--resume auto: resume, not start fresh).
bool has_checkpoint(const std::string& path);

}  // namespace scmoe::models
