// A step directory verified against its manifest, the one a resume takes, and the run's settings
// compared with the checkpoint's (detail/checkpoint_files.h).
#include "scmoe/models/detail/checkpoint_files.h"

#include <algorithm>
#include <nlohmann/json.hpp>

namespace scmoe::models::detail {
namespace {

using nlohmann::ordered_json;

// The data fingerprints' difference in words, or "" when the contents agree (paths may differ).
std::string describe_data_difference(const std::string& theirs, const std::string& ours) {
    const ordered_json a = ordered_json::parse(theirs), b = ordered_json::parse(ours);
    auto content = [](const ordered_json& j) {
        std::vector<std::pair<std::int64_t, std::string>> c;
        if (j.is_array())
            for (const auto& f : j) c.emplace_back(f.value("bytes", std::int64_t{-1}), f.value("crc32", std::string()));
        return c;
    };
    if (a.is_array() && content(a) == content(b)) return "";
    auto words = [](const ordered_json& j) {
        if (!j.is_array()) return std::string("(not recorded)");
        std::string w;
        for (std::size_t i = 0; i < j.size(); ++i) {
            if (i == 3) return w + " and " + std::to_string(j.size() - 3) + " more";
            w += (i ? ", " : "") + j[i].value("path", std::string("?")) + " (" +
                 std::to_string(j[i].value("bytes", std::int64_t{-1})) + " bytes, CRC-32 " +
                 j[i].value("crc32", std::string("?")) + ")";
        }
        return w;
    };
    return words(a) + " in the checkpoint, " + words(b) + " in this run";
}

}  // namespace

// The manifest's entry for `name`, compared with the bytes `name` has (their sum `got`).
void check_sum(const fs::path& dir, const CheckpointManifest& m, const std::string& name,
               const CheckpointManifest::File& got) {
    const auto it = m.files.find(name);
    SCMOE_CHECK(it != m.files.end(), (dir / name).string() << ": not in manifest.json: refusing to resume");
    SCMOE_CHECK(it->second.bytes == got.bytes && it->second.crc32 == got.crc32,
                (dir / name).string() << ": checksum mismatch: manifest.json has " << describe_file(it->second)
                                      << ", the file " << describe_file(got)
                                      << " (corrupted, or a file of another checkpoint): refusing to resume");
}

// The run and save ids a file carries, compared with the manifest's.
void check_ids(const fs::path& file, const CheckpointManifest& m, const std::string& run_id,
               const std::string& save_id) {
    SCMOE_CHECK(run_id == m.run_id && save_id == m.save_id,
                file.string() << ": run id '" << run_id << "', save id '" << save_id << "'; manifest.json: run id '"
                              << m.run_id << "', save id '" << m.save_id
                              << "' (a file of another run or another save of this step): refusing to resume");
}

std::string read_manifest_text(const fs::path& dir) {
    const fs::path p = dir / kManifestName;
    SCMOE_CHECK(fs::exists(p), dir.string() << ": no manifest.json (an incomplete checkpoint, or one written before "
                                               "checkpoints had manifests): refusing to resume without checksums");
    return read_text(p.string());
}

// A step directory's manifest and its training state, checked (checkpoint_files.h).
VerifiedState read_verified_state(const fs::path& dir) {
    VerifiedState v{parse_checkpoint_manifest(read_manifest_text(dir), dir.string()), {}};
    std::string state_text;
    try {
        state_text = read_text((dir / kStateName).string());
    } catch (const Error& e) {
        SCMOE_FAIL(dir.string() << ": " << e.what());
    }
    check_sum(dir, v.manifest, kStateName, text_sum(state_text));
    v.state = parse_checkpoint_state(state_text, dir.string());
    check_ids(dir / kStateName, v.manifest, v.state.run_id, v.state.save_id);
    return v;
}

// Every file of `dir`'s manifest has its size and CRC: "" or why not (rank 0's fallback search).
std::string verify_complete(const fs::path& dir) {
    try {
        const CheckpointManifest m = parse_checkpoint_manifest(read_manifest_text(dir), dir.string());
        for (const auto& [name, f] : m.files) {
            SCMOE_CHECK(fs::exists(dir / name), (dir / name).string() << ": missing");
            check_sum(dir, m, name, file_sum((dir / name).string()));
        }
        return "";
    } catch (const std::exception& e) {
        return e.what();
    }
}

// Rank 0: the step directory `path` names; a root's `latest` when it names a step that verifies
// (every file's size and CRC), else the newest step that does, with a note saying why `latest`
// was passed over (missing, dangling, incomplete, or failing its checksums). Verifying reads the
// step's files once more (rank 0, every rank's files) before each rank reads its own.
fs::path resolve_step_dir(const std::string& path, std::vector<std::string>& notes) {
    const fs::path p = path;
    if (fs::exists(p / kManifestName) || fs::exists(p / kStateName)) return p;
    const fs::path latest = p / "latest";
    std::string why;
    if (fs::exists(latest)) {
        std::string name;
        try {
            name = read_text(latest.string());
        } catch (const std::exception& e) {
            why = e.what();
        }
        while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
        if (!why.empty()) {
        } else if (step_of_dir_name(name) < 0) {
            why = latest.string() + ": corrupted checkpoint pointer '" + name + "'";
        } else if (!fs::exists(p / name / kManifestName)) {
            why = latest.string() + " names " + name + ", which " +
                  (fs::exists(p / name) ? "has no manifest.json (incomplete)" : "does not exist");
        } else if (const std::string bad = verify_complete(p / name); !bad.empty()) {
            why = latest.string() + " names " + name + ", which fails verification (" + bad + ")";
        } else {
            return p / name;
        }
    } else {
        why = latest.string() + " is missing";
    }
    auto dirs = step_dirs(p);
    // A re-save on a file system without RENAME_EXCHANGE moves the old step-N aside to step-N.old
    // before renaming the new one in: a crash between the two leaves only step-N.old.
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(p, ec)) {
        const std::string n = e.path().filename().string();
        if (n.size() == 17 && n.compare(13, 4, ".old") == 0 && !fs::exists(p / n.substr(0, 13))) {
            const std::int64_t step = step_of_dir_name(n.substr(0, 13));
            if (step >= 0 && e.is_directory()) dirs.emplace_back(step, e.path());
        }
    }
    std::sort(dirs.begin(), dirs.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    SCMOE_CHECK(!dirs.empty(), "no checkpoint at " << path << " (" << why << ", and there is no step directory)");
    std::string rejected;
    for (const auto& [step, dir] : dirs) {
        const std::string bad = verify_complete(dir);
        if (bad.empty()) {
            notes.push_back(why + ": resuming from the newest complete, verified step, " + dir.string());
            return dir;
        }
        rejected += "\n  " + bad;
    }
    SCMOE_FAIL("no checkpoint at " << path << " verifies (" << why << "); its step directories:" << rejected);
}

// Compares the checkpoint's settings (and on rank 0 its data) with the run's: refused unless allowed.
void compare_run(const fs::path& dir, const CheckpointManifest& m, CheckpointRun& run, bool lead,
                 const std::vector<std::string>& allow, std::vector<std::string>& notes) {
    const ordered_json theirs = ordered_json::parse(m.settings), ours = ordered_json::parse(settings_json(&run));
    std::vector<std::pair<std::string, std::string>> diffs;  // name, what differs
    std::vector<std::string> keys;
    for (auto it = ours.begin(); it != ours.end(); ++it) keys.push_back(it.key());
    for (auto it = theirs.begin(); it != theirs.end(); ++it)
        if (!ours.contains(it.key())) keys.push_back(it.key());
    for (const std::string& k : keys) {
        const std::string a = theirs.contains(k) ? theirs[k].dump() : "(missing)";
        const std::string b = ours.contains(k) ? ours[k].dump() : "(missing)";
        if (a != b) diffs.emplace_back(k, k + " " + a + " in the checkpoint, " + b + " in this run");
    }
    if (lead) {
        if (run.data_fingerprint.empty()) run.data_fingerprint = data_fingerprint(run.data);
        const std::string d = describe_data_difference(m.data, run.data_fingerprint);
        if (!d.empty()) diffs.emplace_back("data", "data: " + d);
    }
    std::string refused, names;
    for (const auto& [name, what] : diffs) {
        if (std::find(allow.begin(), allow.end(), name) != allow.end()) {
            notes.push_back("allowed change (--allow-change " + name + "): " + what);
        } else {
            refused += (refused.empty() ? "" : "; ") + what;
            names += (names.empty() ? "" : ",") + name;
        }
    }
    SCMOE_CHECK(refused.empty(), dir.string() << ": the training settings differ: " << refused
                                              << ": refusing to resume (to change them on purpose: --allow-change "
                                              << names << ")");
}

}  // namespace scmoe::models::detail
