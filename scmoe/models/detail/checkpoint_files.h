// The checkpoint's files, shared by its save and load (checkpoint.cpp), its directory and lock
// (checkpoint_dir.cpp) and the weights-only reader (checkpoint_weights.cpp): names and constants,
// text and checksums, step directories, the run's settings and data fingerprint (checkpoint_files.cpp),
// and a step directory's verification and choice on resume (checkpoint_verify.cpp). Internal: not
// part of the installed API.
#pragma once

#include <cstdint>
#include <exception>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "scmoe/comm/communicator.h"
#include "scmoe/kernels/error.h"
#include "scmoe/models/checkpoint.h"
#include "scmoe/models/parallel.h"
#include "scmoe/models/safetensors.h"

namespace scmoe::models::detail {

namespace fs = std::filesystem;

inline constexpr const char* kFormat = "scmoe-checkpoint-v1";
inline constexpr const char* kManifestFormat = "scmoe-checkpoint-manifest-v1";
inline constexpr const char* kManifestName = "manifest.json";
inline constexpr const char* kStateName = "trainer_state.json";
inline constexpr const char* kIndexName = "model.safetensors.index.json";
inline constexpr const char* kRunIdKey = "scmoe.run_id";
inline constexpr const char* kSaveIdKey = "scmoe.save_id";

// ---- checkpoint_files.cpp ----

std::string step_dir_name(std::int64_t step);        // "step-00000100"
std::string expert_file_name(int ep_rank, int ep);   // "experts-00001-of-00004.safetensors"
std::string rank_file_name(int rank);                // "rank-00003.json"
std::string read_text(const std::string& path);      // throws naming the path
void write_text(const std::string& path, const std::string& text);  // atomically (write_file_atomically)
// Size and CRC-32 of a file's bytes, read in pieces; of a string.
CheckpointManifest::File file_sum(const std::string& path);
CheckpointManifest::File text_sum(const std::string& text);
std::string hex32(std::uint32_t v);
std::string describe_file(const CheckpointManifest::File& f);  // "N bytes, CRC-32 xxxxxxxx"
// 16 hex digits from the OS's entropy, the clock and the pid: distinct for every run and save.
std::string new_id();
void fsync_dir(const fs::path& dir);
// "step-00000100" -> 100; -1 for any other name (step-N.tmp, latest, ...).
std::int64_t step_of_dir_name(const std::string& n);
// The step directories of `root`, newest first.
std::vector<std::pair<std::int64_t, fs::path>> step_dirs(const fs::path& root);
// The data fingerprint: every training file's name, size and CRC-32 of its bytes (one read).
std::string data_fingerprint(const std::vector<std::string>& paths);
std::string settings_json(const CheckpointRun* run);  // the run's settings as one JSON object
// The tensor names a checkpoint holds for `t` of a group: dense tensors once; expert tensors one
// per expert, <name>.<global expert>, with the local expert index.
struct Slice {
    std::string name;
    std::vector<std::int64_t> shape;
    std::int64_t offset;  // in the group's flat arrays
    std::int64_t numel;   // elements: the product of shape
};
std::vector<Slice> slices_of(const NamedTensor& t);
// " key theirs (this run: ours)" for every top-level field of two config JSONs that differs.
std::string describe_config_difference(const std::string& ours, const std::string& theirs);
// A safetensors file's metadata value, "(none)" when absent.
std::string meta_value(const SafetensorsFile& f, const char* key);

// Runs `fn`; then every rank agrees: a local error is rethrown, a peer's becomes an error naming
// that rank and its cause (every rank's cause is gathered, so none says only "see its error").
template <class Fn>
void collectively(const CheckpointTarget& t, const std::string& what, Fn&& fn) {
    std::exception_ptr error;
    std::string cause;
    try {
        fn();
    } catch (const CommError&) {
        throw;  // a failed collective is not agreed on (see Trainer::step)
    } catch (const std::exception& e) {
        error = std::current_exception();
        cause = e.what();
    } catch (...) {
        error = std::current_exception();
        cause = "an unknown exception";
    }
    // "!" marks a failure, so an empty cause still counts.
    const std::vector<std::string> causes =
        gather_strings(t.world, error ? "!" + cause : std::string(), t.model.device(), t.model.stream());
    if (error) std::rethrow_exception(error);
    std::string first, others;
    for (std::size_t r = 0; r < causes.size(); ++r) {
        if (causes[r].empty()) continue;
        if (first.empty())
            first = "failed on rank " + std::to_string(r) + ": " + causes[r].substr(1);
        else
            others += (others.empty() ? "" : ", ") + std::to_string(r);
    }
    if (!first.empty()) SCMOE_FAIL(what << ": " << first << (others.empty() ? "" : " (and on rank(s) " + others + ")"));
}

// ---- checkpoint_verify.cpp ----

// The manifest's entry for `name`, compared with the bytes `name` has (their sum `got`).
void check_sum(const fs::path& dir, const CheckpointManifest& m, const std::string& name,
               const CheckpointManifest::File& got);
// The run and save ids a file carries, compared with the manifest's.
void check_ids(const fs::path& file, const CheckpointManifest& m, const std::string& run_id,
               const std::string& save_id);
// dir/manifest.json's text; refuses a step directory without one.
std::string read_manifest_text(const fs::path& dir);
// A step directory's manifest and its training state, the state's checksum and ids checked against
// the manifest.
struct VerifiedState {
    CheckpointManifest manifest;
    CheckpointState state;
};
VerifiedState read_verified_state(const fs::path& dir);
// Every file of `dir`'s manifest has its size and CRC: "" or why not (rank 0's fallback search).
std::string verify_complete(const fs::path& dir);
// Rank 0: the step directory `path` names; a root's `latest` when it names a step that verifies
// (every file's size and CRC), else the newest step that does, with a note saying why `latest`
// was passed over (missing, dangling, incomplete, or failing its checksums).
fs::path resolve_step_dir(const std::string& path, std::vector<std::string>& notes);
// Compares the checkpoint's settings (and on rank 0 its data) with the run's: refused unless allowed.
void compare_run(const fs::path& dir, const CheckpointManifest& m, CheckpointRun& run, bool lead,
                 const std::vector<std::string>& allow, std::vector<std::string>& notes);

}  // namespace scmoe::models::detail
