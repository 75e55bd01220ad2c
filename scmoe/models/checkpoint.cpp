#include "scmoe/models/checkpoint.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>
#include <utility>

#include "scmoe/comm/communicator.h"
#include "scmoe/kernels/error.h"
#include "scmoe/kernels/host_io.h"
#include "scmoe/models/detail/json_integer.h"
#include "scmoe/models/parallel.h"
#include "scmoe/models/safetensors.h"

namespace scmoe::models {
namespace {

namespace fs = std::filesystem;
using nlohmann::ordered_json;

constexpr const char* kFormat = "scmoe-checkpoint-v1";

std::string step_dir_name(std::int64_t step) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "step-%08lld", static_cast<long long>(step));
    return buf;
}

std::string expert_file_name(int ep_rank, int ep) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "experts-%05d-of-%05d.safetensors", ep_rank + 1, ep);
    return buf;
}

std::string rank_file_name(int rank) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "rank-%05d.json", rank);
    return buf;
}

std::string read_text(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    SCMOE_CHECK(in, path << ": cannot open");
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
}

void write_text(const std::string& path, const std::string& text) {
    write_file_atomically(path, text.data(), text.size());
}

constexpr const char* kManifestFormat = "scmoe-checkpoint-manifest-v1";
constexpr const char* kManifestName = "manifest.json";
constexpr const char* kStateName = "trainer_state.json";
constexpr const char* kIndexName = "model.safetensors.index.json";
constexpr const char* kRunIdKey = "scmoe.run_id";
constexpr const char* kSaveIdKey = "scmoe.save_id";

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

// Size and CRC-32 of a file's bytes, read in pieces.
CheckpointManifest::File file_sum(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    SCMOE_CHECK(in, path << ": cannot open: " << std::strerror(errno));
    CheckpointManifest::File f;
    std::vector<char> buf(1 << 20);
    while (in) {
        in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
        const std::streamsize got = in.gcount();
        if (got <= 0) break;
        f.crc32 = crc32_update(f.crc32, buf.data(), static_cast<std::size_t>(got));
        f.bytes += got;
    }
    SCMOE_CHECK(in.eof(), path << ": read failed");
    return f;
}

std::string hex32(std::uint32_t v) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "%08x", v);
    return buf;
}

// 16 hex digits from the OS's entropy, the clock and the pid: distinct for every run and save.
std::string new_id() {
    std::random_device rd;
    std::uint64_t v = (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
    v ^=
        static_cast<std::uint64_t>(std::chrono::system_clock::now().time_since_epoch().count()) * 0x9e3779b97f4a7c15ull;
    v ^= static_cast<std::uint64_t>(::getpid()) << 17;
    char buf[32];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
    return buf;
}

void fsync_dir(const fs::path& dir) {
    const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    SCMOE_CHECK(fd >= 0, dir.string() << ": open (to fsync the directory): " << std::strerror(errno));
    const int rc = ::fsync(fd);
    const int err = errno;
    ::close(fd);
    SCMOE_CHECK(rc == 0, dir.string() << ": fsync (directory): " << std::strerror(err));
}

// "step-00000100" -> 100; -1 for any other name (step-N.tmp, latest, ...).
std::int64_t step_of_dir_name(const std::string& n) {
    if (n.size() != 13 || n.rfind("step-", 0) != 0) return -1;
    std::int64_t v = 0;
    const auto [end, ec] = std::from_chars(n.data() + 5, n.data() + n.size(), v);
    return ec == std::errc() && end == n.data() + n.size() ? v : -1;
}

// The step directories of `root`, newest first.
std::vector<std::pair<std::int64_t, fs::path>> step_dirs(const fs::path& root) {
    std::vector<std::pair<std::int64_t, fs::path>> out;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(root, ec)) {
        const std::int64_t s = step_of_dir_name(e.path().filename().string());
        if (s >= 0 && e.is_directory()) out.emplace_back(s, e.path());
    }
    std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    return out;
}

// The data fingerprint: every training file's name, size and CRC-32 of its bytes (one read).
std::string data_fingerprint(const std::vector<std::string>& paths) {
    ordered_json files = ordered_json::array();
    for (const std::string& p : paths) {
        const CheckpointManifest::File f = file_sum(p);
        files.push_back({{"path", p}, {"bytes", f.bytes}, {"crc32", hex32(f.crc32)}});
    }
    return files.dump();
}

std::string settings_json(const CheckpointRun* run) {
    ordered_json j = ordered_json::object();
    if (run)
        for (const auto& [k, v] : run->settings) j[k] = ordered_json::parse(v);
    return j.dump();
}

struct HostState {
    std::vector<float> master, m, v;
};

// The tensor names a checkpoint holds for `t` of a group: dense tensors once; expert tensors one
// per expert, <name>.<global expert>, with the local expert index.
struct Slice {
    std::string name;
    std::vector<std::int64_t> shape;
    std::int64_t offset;  // in the group's flat arrays
    std::int64_t numel;   // elements: the product of shape
};
std::vector<Slice> slices_of(const NamedTensor& t) {
    if (!t.expert) return {{t.name, t.shape, t.offset, t.numel()}};
    std::vector<Slice> out;
    const std::vector<std::int64_t> shape(t.shape.begin() + 1, t.shape.end());
    const std::int64_t n = t.numel() / t.shape[0];
    for (std::int64_t e = 0; e < t.shape[0]; ++e)
        out.push_back({t.name + "." + std::to_string(t.first_expert + e), shape, t.offset + e * n, n});
    return out;
}

std::string describe_config_difference(const std::string& ours, const std::string& theirs) {
    const ordered_json a = ordered_json::parse(ours), b = ordered_json::parse(theirs);
    std::string diff;
    for (auto it = a.begin(); it != a.end(); ++it) {
        const std::string other = b.contains(it.key()) ? b[it.key()].dump() : "(missing)";
        if (other != it.value().dump()) diff += " " + it.key() + " " + other + " (this run: " + it.value().dump() + ")";
    }
    return diff.empty() ? " (field order or format)" : diff;
}

}  // namespace

const std::vector<std::string>& checkpoint_setting_names() {
    static const std::vector<std::string> names = {"lr",    "min-lr", "warmup", "steps", "weight-decay", "beta1",
                                                   "beta2", "eps",    "clip",   "batch", "data"};
    return names;
}

CheckpointState parse_checkpoint_state(const std::string& text, const std::string& dir) {
    CheckpointState st;
    try {
        const ordered_json j = ordered_json::parse(text);
        SCMOE_CHECK(j.at("format").get<std::string>() == kFormat,
                    "format " << j.at("format") << ", expected " << kFormat);
        st.step = detail::json_integer<std::int64_t>(j.at("step"));
        st.world = detail::json_integer<int>(j.at("world"));
        st.ep = detail::json_integer<int>(j.at("ep"));
        st.config = j.at("config").dump();
        if (j.contains("run_id")) st.run_id = j.at("run_id").get<std::string>();
        if (j.contains("save_id")) st.save_id = j.at("save_id").get<std::string>();
    } catch (const nlohmann::json::exception& e) {
        SCMOE_FAIL((fs::path(dir) / kStateName).string() << ": corrupted checkpoint state: " << e.what());
    } catch (const Error& e) {
        SCMOE_FAIL(dir << ": " << e.what());
    }
    return st;
}

ByteBatcherState parse_checkpoint_rank_state(const std::string& text, const std::string& path) {
    ByteBatcherState data;
    try {
        const ordered_json r = ordered_json::parse(text);
        const ordered_json& d = r.at("data");
        data.seed = detail::json_integer<std::uint64_t>(d.at("seed"));
        data.epoch = detail::json_integer<std::int64_t>(d.at("epoch"));
        data.position = detail::json_integer<std::int64_t>(d.at("position"));
        data.num_windows = detail::json_integer<std::int64_t>(d.at("num_windows"));
    } catch (const nlohmann::json::exception& e) {
        SCMOE_FAIL(path << ": corrupted checkpoint rank state: " << e.what());
    }
    return data;
}

CheckpointManifest parse_checkpoint_manifest(const std::string& text, const std::string& dir) {
    CheckpointManifest m;
    const std::string where = (fs::path(dir) / kManifestName).string() + ": corrupted checkpoint manifest: ";
    try {
        const ordered_json j = ordered_json::parse(text);
        SCMOE_CHECK(j.at("format").get<std::string>() == kManifestFormat,
                    "format " << j.at("format") << ", expected " << kManifestFormat);
        m.run_id = j.at("run_id").get<std::string>();
        m.save_id = j.at("save_id").get<std::string>();
        SCMOE_CHECK(!m.run_id.empty() && !m.save_id.empty(), "an empty run_id or save_id");
        m.step = detail::json_integer<std::int64_t>(j.at("step"));
        SCMOE_CHECK(j.at("settings").is_object(), "settings is not an object");
        m.settings = j.at("settings").dump();
        m.data = j.at("data").dump();
        const ordered_json& files = j.at("files");
        SCMOE_CHECK(files.is_object() && !files.empty(), "files is not a non-empty object");
        for (auto it = files.begin(); it != files.end(); ++it) {
            const std::string& name = it.key();
            SCMOE_CHECK(!name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos,
                        "file name '" << name << "' is not a plain file name");
            CheckpointManifest::File f;
            f.bytes = detail::json_integer<std::int64_t>(it.value().at("bytes"));
            SCMOE_CHECK(f.bytes >= 0, name << ": bytes " << f.bytes << " < 0");
            const std::string crc = it.value().at("crc32").get<std::string>();
            std::uint32_t v = 0;
            const auto [end, ec] = std::from_chars(crc.data(), crc.data() + crc.size(), v, 16);
            SCMOE_CHECK(crc.size() == 8 && ec == std::errc() && end == crc.data() + crc.size(),
                        name << ": crc32 '" << crc << "' is not 8 hex digits");
            f.crc32 = v;
            m.files[name] = f;
        }
    } catch (const nlohmann::json::exception& e) {
        SCMOE_FAIL(where << e.what());
    } catch (const Error& e) {
        SCMOE_FAIL(where << e.what());
    }
    return m;
}

bool has_checkpoint(const std::string& path) {
    const fs::path p = path;
    std::error_code ec;
    if (fs::exists(p / "latest", ec) || fs::exists(p / kManifestName, ec) || fs::exists(p / kStateName, ec))
        return true;
    return fs::is_directory(p, ec) && !step_dirs(p).empty();
}

namespace {

std::string describe_file(const CheckpointManifest::File& f) {
    return std::to_string(f.bytes) + " bytes, CRC-32 " + hex32(f.crc32);
}

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

CheckpointManifest::File text_sum(const std::string& text) {
    return {static_cast<std::int64_t>(text.size()), crc32_update(0, text.data(), text.size())};
}

// The run and save ids a file carries, compared with the manifest's.
void check_ids(const fs::path& file, const CheckpointManifest& m, const std::string& run_id,
               const std::string& save_id) {
    SCMOE_CHECK(run_id == m.run_id && save_id == m.save_id,
                file.string() << ": run id '" << run_id << "', save id '" << save_id << "'; manifest.json: run id '"
                              << m.run_id << "', save id '" << m.save_id
                              << "' (a file of another run or another save of this step): refusing to resume");
}

std::string meta_value(const SafetensorsFile& f, const char* key) {
    const auto it = f.metadata.find(key);
    return it == f.metadata.end() ? std::string("(none)") : it->second;
}

std::string read_manifest_text(const fs::path& dir) {
    const fs::path p = dir / kManifestName;
    SCMOE_CHECK(fs::exists(p), dir.string() << ": no manifest.json (an incomplete checkpoint, or one written before "
                                               "checkpoints had manifests): refusing to resume without checksums");
    return read_text(p.string());
}

// A step directory's manifest and its training state, the state's checksum and ids checked against
// the manifest.
struct VerifiedState {
    CheckpointManifest manifest;
    CheckpointState state;
};
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

}  // namespace

std::string save_checkpoint(const std::string& root, CheckpointTarget t, int keep) {
    SCMOE_CHECK(t.optimizers.size() == t.model.param_groups().size(),
                "save_checkpoint: " << t.optimizers.size() << " optimizers for " << t.model.param_groups().size()
                                    << " parameter groups");
    const ParallelLayout& L = t.layout;
    const std::string name = step_dir_name(t.step);
    const fs::path final_dir = fs::path(root) / name, tmp_dir = fs::path(root) / (name + ".tmp");
    const std::string what = "save_checkpoint " + final_dir.string();
    t.model.blocks().synchronize();
    std::string ids;  // rank 0's "<run id> <save id>"
    collectively(t, what, [&] {
        if (L.rank != 0) return;
        fs::create_directories(root);
        fs::remove_all(tmp_dir);
        fs::create_directory(tmp_dir);
        ids = (t.run && !t.run->run_id.empty() ? t.run->run_id : new_id()) + " " + new_id();
    });
    ids = gather_strings(t.world, ids, t.model.device(), t.model.stream())[0];
    const std::string run_id = ids.substr(0, ids.find(' ')), save_id = ids.substr(ids.find(' ') + 1);
    if (t.run) t.run->run_id = run_id;

    std::string sums;  // this rank's files: "<name> <bytes> <crc32 hex>\n" each
    collectively(t, what, [&] {
        const auto& groups = t.model.param_groups();
        std::vector<HostState> host(groups.size());
        Stream& s = t.model.stream();
        for (std::size_t g = 0; g < groups.size(); ++g) {
            const auto n = static_cast<std::size_t>(groups[g].numel);
            host[g].master.resize(n);
            host[g].m.resize(n);
            host[g].v.resize(n);
            s.copy(host[g].master.data(), t.optimizers[g]->master(), n * sizeof(float));
            s.copy(host[g].m.data(), t.optimizers[g]->m(), n * sizeof(float));
            s.copy(host[g].v.data(), t.optimizers[g]->v(), n * sizeof(float));
        }
        s.synchronize();
        std::vector<SafetensorsTensor> dense, experts;
        for (std::size_t g = 0; g < groups.size(); ++g) {
            for (const NamedTensor& nt : groups[g].tensors) {
                for (const Slice& sl : slices_of(nt)) {
                    auto& out = nt.expert ? experts : dense;
                    const std::pair<const std::vector<float>*, const char*> parts[] = {
                        {&host[g].master, ""}, {&host[g].m, ".adam_m"}, {&host[g].v, ".adam_v"}};
                    for (const auto& [part, suffix] : parts) {
                        // A checkpoint never holds non-finite values: resuming from one could only diverge.
                        const float* begin = part->data() + sl.offset;
                        const float* end = begin + sl.numel;
                        const float* bad = std::find_if(begin, end, [](float v) { return !std::isfinite(v); });
                        SCMOE_CHECK(bad == end,
                                    "save_checkpoint: " << sl.name << suffix << "[" << bad - begin << "] = " << *bad
                                                        << ": the state is not finite; no checkpoint is written");
                        out.push_back({sl.name + suffix, SafetensorsDType::kF32, sl.shape, begin});
                    }
                }
            }
        }
        const std::map<std::string, std::string> meta = {
            {"format", kFormat},          {"step", std::to_string(t.step)},       {"world", std::to_string(L.world)},
            {"ep", std::to_string(L.ep)}, {"config", t.model.config().to_json()}, {kRunIdKey, run_id},
            {kSaveIdKey, save_id}};
        std::vector<std::string> written;
        if (L.rank == 0) {
            write_safetensors((tmp_dir / "dense.safetensors").string(), dense, meta);
            written.push_back("dense.safetensors");
        }
        if (L.ep_group() == 0) {
            write_safetensors((tmp_dir / expert_file_name(L.ep_rank(), L.ep)).string(), experts, meta);
            written.push_back(expert_file_name(L.ep_rank(), L.ep));
        }
        const ByteBatcherState d = t.batcher.state();
        ordered_json r;
        r["rank"] = L.rank;
        r["step"] = t.step;
        r["run_id"] = run_id;
        r["save_id"] = save_id;
        r["data"] = {{"seed", d.seed}, {"epoch", d.epoch}, {"position", d.position}, {"num_windows", d.num_windows}};
        write_text((tmp_dir / rank_file_name(L.rank)).string(), r.dump(2) + "\n");
        written.push_back(rank_file_name(L.rank));

        if (L.rank == 0) {
            // The index: every tensor of every expert-parallel rank (rank 0 knows their names).
            SafetensorsIndex index;
            index.metadata = {
                {"format", kFormat}, {"step", std::to_string(t.step)}, {kRunIdKey, run_id}, {kSaveIdKey, save_id}};
            const int local_experts = t.model.config().moe.num_experts / L.ep;
            for (const ParamGroup& g : groups) {
                for (const NamedTensor& nt : g.tensors) {
                    const int ranks = nt.expert ? L.ep : 1;
                    for (int er = 0; er < ranks; ++er) {
                        NamedTensor other = nt;
                        other.first_expert = er * local_experts;
                        for (const Slice& sl : slices_of(other)) {
                            const std::string file = nt.expert ? expert_file_name(er, L.ep) : "dense.safetensors";
                            for (const char* suffix : {"", ".adam_m", ".adam_v"})
                                index.weight_map[sl.name + suffix] = file;
                        }
                    }
                }
            }
            write_safetensors_index((tmp_dir / kIndexName).string(), index);
            written.push_back(kIndexName);
        }
        // Read back what landed on disk: the manifest's checksums are of the files as stored.
        for (const std::string& f : written) {
            const CheckpointManifest::File sum = file_sum((tmp_dir / f).string());
            sums += f + " " + std::to_string(sum.bytes) + " " + hex32(sum.crc32) + "\n";
        }
    });
    const std::vector<std::string> all_sums = gather_strings(t.world, sums, t.model.device(), t.model.stream());

    collectively(t, what, [&] {
        if (L.rank != 0) return;
        ordered_json st;
        st["format"] = kFormat;
        st["step"] = t.step;
        st["world"] = L.world;
        st["ep"] = L.ep;
        st["run_id"] = run_id;
        st["save_id"] = save_id;
        st["config"] = ordered_json::parse(t.model.config().to_json());
        const std::string state_text = st.dump(2) + "\n";
        write_text((tmp_dir / kStateName).string(), state_text);

        ordered_json m;
        m["format"] = kManifestFormat;
        m["run_id"] = run_id;
        m["save_id"] = save_id;
        m["step"] = t.step;
        m["world"] = L.world;
        m["ep"] = L.ep;
        m["config"] = st["config"];
        m["settings"] = ordered_json::parse(settings_json(t.run));
        if (t.run && t.run->data_fingerprint.empty()) t.run->data_fingerprint = data_fingerprint(t.run->data);
        m["data"] = t.run ? ordered_json::parse(t.run->data_fingerprint) : ordered_json();
        ordered_json files = ordered_json::object();
        const CheckpointManifest::File state_sum = text_sum(state_text);
        files[kStateName] = {{"bytes", state_sum.bytes}, {"crc32", hex32(state_sum.crc32)}};
        for (const std::string& rank_sums : all_sums) {
            std::istringstream lines(rank_sums);
            std::string file, crc;
            std::int64_t bytes = 0;
            while (lines >> file >> bytes >> crc) files[file] = {{"bytes", bytes}, {"crc32", crc}};
        }
        // Every file a load will ask for must be listed (a rank's sums cut short would show here).
        std::vector<std::string> expected = {kStateName, kIndexName, "dense.safetensors"};
        for (int e = 0; e < L.ep; ++e) expected.push_back(expert_file_name(e, L.ep));
        for (int r = 0; r < L.world; ++r) expected.push_back(rank_file_name(r));
        for (const std::string& f : expected)
            SCMOE_CHECK(files.contains(f), "save_checkpoint: no checksum of " << f << " reached rank 0");
        m["files"] = files;
        write_text((tmp_dir / kManifestName).string(), m.dump(2) + "\n");  // fsyncs the file and tmp_dir

        // Publish: step-N appears (or is exchanged with the old step-N) only now that it is complete
        // and durable; `latest` follows; the old step-N is deleted last.
        fs::path old;
        if (!fs::exists(final_dir)) {
            fs::rename(tmp_dir, final_dir);
        } else if (::renameat2(AT_FDCWD, tmp_dir.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) == 0) {
            old = tmp_dir;  // now holds the old step-N
        } else {
            const int err = errno;
            SCMOE_CHECK(err == EINVAL || err == ENOSYS, final_dir.string()
                                                            << ": renameat2 (RENAME_EXCHANGE with " << tmp_dir.string()
                                                            << "): " << std::strerror(err));
            // A file system without the exchange: the old step-N moves aside first.
            old = fs::path(root) / (name + ".old");
            fs::remove_all(old);
            fs::rename(final_dir, old);
            fs::rename(tmp_dir, final_dir);
        }
        fsync_dir(root);
        write_text((fs::path(root) / "latest").string(), name + "\n");
        if (!old.empty()) fs::remove_all(old);
        fs::remove_all(fs::path(root) / (name + ".old"));  // a crashed earlier re-save's, now replaced

        // Keep the newest `keep` steps up to this one; never the step this run resumed from; steps
        // newer than this one (abandoned by a rollback) are left alone.
        if (keep <= 0) return;
        std::error_code ec;
        const fs::path resumed =
            t.run && !t.run->resumed_from.empty() ? fs::weakly_canonical(t.run->resumed_from, ec) : fs::path();
        int kept = 0;
        for (const auto& [step, dir] : step_dirs(root)) {
            if (step > t.step) continue;
            if (kept < keep) {
                ++kept;
                continue;
            }
            if (!resumed.empty() && fs::weakly_canonical(dir, ec) == resumed) continue;
            fs::remove_all(dir);
        }
    });
    return final_dir.string();
}

CheckpointLoad load_checkpoint(const std::string& path, CheckpointTarget t, const std::vector<std::string>& allow) {
    SCMOE_CHECK(t.optimizers.size() == t.model.param_groups().size(),
                "load_checkpoint: " << t.optimizers.size() << " optimizers for " << t.model.param_groups().size()
                                    << " parameter groups");
    for (const std::string& a : allow) {
        const auto& names = checkpoint_setting_names();
        SCMOE_CHECK(std::find(names.begin(), names.end(), a) != names.end(),
                    "load_checkpoint: allow_change '" << a << "' is not a setting a checkpoint records");
    }
    const ParallelLayout& L = t.layout;
    const auto& groups = t.model.param_groups();
    std::vector<HostState> host(groups.size());
    ByteBatcherState data;
    std::int64_t step = 0;
    CheckpointLoad result;
    t.model.blocks().synchronize();
    const std::string what = "load_checkpoint " + path;
    // Rank 0 picks the step directory (a root's `latest`, or the fallback), every rank loads it.
    std::string chosen;
    collectively(t, what, [&] {
        if (L.rank == 0) chosen = resolve_step_dir(path, result.notes).string();
    });
    chosen = gather_strings(t.world, chosen, t.model.device(), t.model.stream())[0];
    const fs::path dir = chosen;
    // Read and check everything first; nothing changes until every rank has succeeded.
    collectively(t, what, [&] {
        const VerifiedState verified = read_verified_state(dir);
        const CheckpointManifest& man = verified.manifest;
        const CheckpointState& st = verified.state;
        SCMOE_CHECK(st.step == man.step, (dir / kStateName).string() << ": step " << st.step << ", manifest.json: step "
                                                                     << man.step << ": refusing to resume");
        step = st.step;
        try {
            SCMOE_CHECK(st.world == L.world && st.ep == L.ep, "the checkpoint was written by world "
                                                                  << st.world << " x ep " << st.ep
                                                                  << "; this run is world " << L.world << " x ep "
                                                                  << L.ep << ": refusing to resume");
            const std::string& theirs = st.config;
            const std::string ours = t.model.config().to_json();
            SCMOE_CHECK(LmConfig::from_json(theirs).to_json() == ours,
                        "the checkpoint's model config differs:" << describe_config_difference(ours, theirs)
                                                                 << "; refusing to resume");
        } catch (const nlohmann::json::exception& e) {
            SCMOE_FAIL((dir / kStateName).string() << ": corrupted checkpoint state: " << e.what());
        } catch (const Error& e) {
            SCMOE_FAIL(dir.string() << ": " << e.what());
        }
        if (t.run) compare_run(dir, man, *t.run, L.rank == 0, allow, result.notes);
        if (L.rank == 0) {
            // Rank 0 checks the index (no other rank reads it); each rank checks the files it reads.
            const std::string index_path = (dir / kIndexName).string();
            check_sum(dir, man, kIndexName, file_sum(index_path));
            const SafetensorsIndex index = read_safetensors_index(index_path);
            const auto at = [&](const char* k) {
                const auto it = index.metadata.find(k);
                return it == index.metadata.end() ? std::string("(none)") : it->second;
            };
            check_ids(index_path, man, at(kRunIdKey), at(kSaveIdKey));
        }
        const std::string dense_name = "dense.safetensors", expert_name = expert_file_name(L.ep_rank(), L.ep);
        check_sum(dir, man, dense_name, file_sum((dir / dense_name).string()));
        check_sum(dir, man, expert_name, file_sum((dir / expert_name).string()));
        const SafetensorsFile dense = read_safetensors((dir / dense_name).string());
        const SafetensorsFile experts = read_safetensors((dir / expert_name).string());
        for (const auto& [file, f] : {std::pair{dense_name, &dense}, std::pair{expert_name, &experts}}) {
            check_ids(dir / file, man, meta_value(*f, kRunIdKey), meta_value(*f, kSaveIdKey));
            const auto it = f->metadata.find("step");
            SCMOE_CHECK(it != f->metadata.end() && it->second == std::to_string(step),
                        dir.string() << ": a shard's step differs from trainer_state.json (mixed checkpoints)");
        }
        for (std::size_t g = 0; g < groups.size(); ++g) {
            const auto n = static_cast<std::size_t>(groups[g].numel);
            host[g].master.assign(n, 0.0f);
            host[g].m.assign(n, 0.0f);
            host[g].v.assign(n, 0.0f);
            for (const NamedTensor& nt : groups[g].tensors) {
                const SafetensorsFile& f = nt.expert ? experts : dense;
                for (const Slice& sl : slices_of(nt)) {
                    const std::pair<const char*, std::vector<float>*> parts[] = {
                        {"", &host[g].master}, {".adam_m", &host[g].m}, {".adam_v", &host[g].v}};
                    for (const auto& [suffix, out] : parts) {
                        const std::string key = sl.name + suffix;
                        const auto it = f.tensors.find(key);
                        SCMOE_CHECK(it != f.tensors.end(), dir.string() << ": tensor " << key << " is missing");
                        SCMOE_CHECK(it->second.dtype == SafetensorsDType::kF32 && it->second.shape == sl.shape,
                                    dir.string() << ": tensor " << key << " has the wrong dtype or shape");
                        std::memcpy(out->data() + sl.offset, it->second.bytes.data(), it->second.bytes.size());
                    }
                }
            }
        }
        const std::string rank_path = (dir / rank_file_name(L.rank)).string();
        const std::string rank_text = read_text(rank_path);
        check_sum(dir, man, rank_file_name(L.rank), text_sum(rank_text));
        data = parse_checkpoint_rank_state(rank_text, rank_path);
        try {
            const ordered_json r = ordered_json::parse(rank_text);
            check_ids(rank_path, man, r.value("run_id", std::string("(none)")),
                      r.value("save_id", std::string("(none)")));
            SCMOE_CHECK(r.at("rank") == L.rank && r.at("step") == step,
                        rank_path << ": rank " << r.at("rank") << ", step " << r.at("step") << "; expected rank "
                                  << L.rank << ", step " << step << ": refusing to resume");
        } catch (const nlohmann::json::exception& e) {
            SCMOE_FAIL(rank_path << ": corrupted checkpoint rank state: " << e.what());
        }
        SCMOE_CHECK(data.num_windows == t.batcher.num_windows(),
                    dir.string() << ": the data differs: the checkpoint's shard has " << data.num_windows
                                 << " windows, this run's " << t.batcher.num_windows());
        result.run_id = man.run_id;
    });

    Stream& s = t.model.stream();
    for (std::size_t g = 0; g < groups.size(); ++g) {
        const auto n = static_cast<std::size_t>(groups[g].numel) * sizeof(float);
        s.copy(t.optimizers[g]->master(), host[g].master.data(), n);
        s.copy(t.optimizers[g]->m(), host[g].m.data(), n);
        s.copy(t.optimizers[g]->v(), host[g].v.data(), n);
        t.optimizers[g]->write_params(s);
        t.optimizers[g]->set_steps_taken(step);
    }
    s.synchronize();
    t.batcher.restore(data);
    t.step = step;
    result.dir = dir.string();
    if (t.run) {
        t.run->run_id = result.run_id;
        t.run->resumed_from = result.dir;
    }
    return result;
}

namespace {

// root/lock's flock, released (its text emptied first) when the last owner lets go.
class DirLock {
  public:
    explicit DirLock(int fd) : fd_(fd) {}
    ~DirLock() {
        if (::ftruncate(fd_, 0) != 0) {
        }              // an empty lock file: nobody holds it (a failure here only leaves a stale note)
        ::close(fd_);  // releases the flock
    }
    DirLock(const DirLock&) = delete;
    DirLock& operator=(const DirLock&) = delete;

  private:
    int fd_;
};

std::string host_name() {
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    return host;
}

std::string now_utc() {
    const std::time_t now = std::time(nullptr);
    std::tm tm{};
    gmtime_r(&now, &tm);
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
    return buf;
}

// "host H pid P run R since T" as written by take_lock: the words for an error or a note.
std::string describe_holder(std::string text) {
    while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
    std::istringstream in(text);
    std::string host, pid, run, since, word;
    while (in >> word) {
        const auto eq = word.find('=');
        if (eq == std::string::npos) continue;
        const std::string k = word.substr(0, eq), v = word.substr(eq + 1);
        if (k == "host") host = v;
        if (k == "pid") pid = v;
        if (k == "run") run = v;
        if (k == "since") since = v;
    }
    if (host.empty() && pid.empty()) return "an unknown holder ('" + text + "')";
    return "host " + host + ", pid " + pid + ", run " + run + " (since " + since + ")";
}

// Rank 0: takes root/lock for `run_id`; returns the lock, and a note when a stale holder is replaced.
std::shared_ptr<void> take_lock(const fs::path& root, const std::string& run_id, std::vector<std::string>& notes) {
    const fs::path path = root / "lock";
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    SCMOE_CHECK(fd >= 0, path.string() << ": open: " << std::strerror(errno));
    auto read_holder = [&] {
        std::string text(4096, '\0');
        const ssize_t n = ::pread(fd, text.data(), text.size(), 0);
        text.resize(n > 0 ? static_cast<std::size_t>(n) : 0);
        return text;
    };
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
        const int err = errno;
        const std::string holder = read_holder();
        ::close(fd);
        SCMOE_CHECK(err != EWOULDBLOCK, root.string()
                                            << ": the checkpoint directory is locked by " << describe_holder(holder)
                                            << ": another trainer is using it (wait for it to end, or give "
                                               "this run another --checkpoint-dir)");
        SCMOE_FAIL(path.string() << ": flock: " << std::strerror(err));
    }
    auto lock = std::make_shared<DirLock>(fd);
    const std::string previous = read_holder();
    if (previous.find_first_not_of(" \n") != std::string::npos)
        notes.push_back("took over the lock of " + root.string() + " left by " + describe_holder(previous) +
                        ", which ended without releasing it");
    const std::string text =
        "host=" + host_name() + " pid=" + std::to_string(::getpid()) + " run=" + run_id + " since=" + now_utc() + "\n";
    SCMOE_CHECK(::ftruncate(fd, 0) == 0 &&
                    ::pwrite(fd, text.data(), text.size(), 0) == static_cast<ssize_t>(text.size()) && ::fsync(fd) == 0,
                path.string() << ": writing the lock holder: " << std::strerror(errno));
    return lock;
}

std::string mib(double bytes) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f MiB", bytes / (1024.0 * 1024.0));
    return buf;
}

}  // namespace

std::vector<std::string> open_checkpoint_dir(const std::string& root, CheckpointTarget t,
                                             const CheckpointDirOptions& o) {
    SCMOE_CHECK(t.run, "open_checkpoint_dir: needs the run (CheckpointTarget::run) to keep the lock in");
    std::vector<std::string> notes;
    collectively(t, "checkpoint directory " + root, [&] {
        if (t.layout.rank != 0) return;
        const fs::path dir = root;
        std::error_code ec;
        fs::create_directories(dir, ec);
        SCMOE_CHECK(!ec && fs::is_directory(dir),
                    root << ": cannot create the checkpoint directory: " << (ec ? ec.message() : "not a directory"));
        if (t.run->run_id.empty()) t.run->run_id = new_id();
        t.run->dir_lock = take_lock(dir, t.run->run_id, notes);

        if (!t.run->resumed_from.empty()) {
            // A rollback (a resume from an older step of this root): `latest` names where this run
            // is from now on, so that a crash before its first save resumes it, not the abandoned
            // newer steps (left on disk as they are).
            const fs::path from = fs::weakly_canonical(t.run->resumed_from, ec);
            const std::string name = from.filename().string();
            if (step_of_dir_name(name) >= 0 && from.parent_path() == fs::weakly_canonical(dir, ec)) {
                std::string latest;
                try {
                    latest = read_text((dir / "latest").string());
                } catch (const std::exception&) {
                }
                if (latest != name + "\n") {
                    write_text((dir / "latest").string(), name + "\n");
                    std::string newer;
                    for (const auto& [step, path] : step_dirs(dir))
                        if (step > step_of_dir_name(name))
                            newer = path.filename().string() + (newer.empty() ? "" : ", ") + newer;
                    notes.push_back("latest now names " + name + ", the step this run resumed from" +
                                    (newer.empty() ? std::string() : "; the newer " + newer + " are left as they are"));
                }
            }
        }
        if (t.run->resumed_from.empty()) {
            const auto steps = step_dirs(dir);
            const bool has_latest = fs::exists(dir / "latest");
            if (!steps.empty() || has_latest) {
                std::string names, run;
                for (std::size_t i = 0; i < steps.size(); ++i) {
                    if (i == 4) {
                        names += " and " + std::to_string(steps.size() - 4) + " more";
                        break;
                    }
                    names += (i ? ", " : "") + steps[i].second.filename().string();
                }
                try {
                    if (!steps.empty())
                        run = parse_checkpoint_manifest(read_manifest_text(steps.front().second),
                                                        steps.front().second.string())
                                  .run_id;
                } catch (const std::exception&) {
                }
                const std::string what = (names.empty() ? std::string("a 'latest' file") : names) +
                                         (run.empty() ? std::string() : " of run " + run);
                SCMOE_CHECK(o.overwrite, root << ": the checkpoint directory holds checkpoints (" << what
                                              << "): a fresh run would overwrite them; resume them (--resume auto), "
                                                 "give another --checkpoint-dir, or pass --overwrite to delete them");
                for (const auto& [step, path] : steps) fs::remove_all(path);
                for (const auto& e : fs::directory_iterator(dir)) {
                    const std::string n = e.path().filename().string();
                    if (n.rfind("step-", 0) == 0) fs::remove_all(e.path());  // .tmp / .old leftovers
                }
                fs::remove(dir / "latest");
                fsync_dir(dir);
                notes.push_back("--overwrite: deleted the checkpoints in " + root + " (" + what + ")");
            }
        }

        // Writable, fsync-able: found now, not after a whole --checkpoint-every interval.
        const fs::path probe = dir / (".write-probe-" + std::to_string(::getpid()));
        try {
            write_text(probe.string(), "scmoe-train write probe\n");
        } catch (const std::exception& e) {
            SCMOE_FAIL(root << ": the checkpoint directory is not writable: " << e.what());
        }
        fs::remove(probe);

        struct statvfs sv {};
        SCMOE_CHECK(::statvfs(dir.c_str(), &sv) == 0, root << ": statvfs: " << std::strerror(errno));
        const double free_bytes = static_cast<double>(sv.f_bavail) * static_cast<double>(sv.f_frsize);
        const double per = static_cast<double>(t.model.num_global_params()) * 3.0 * sizeof(float) + (1 << 20);
        // keep + 1 exist at once while a save is written (all of them with keep <= 0); the kept
        // steps already here take their place, so only the rest must fit in the free space.
        const std::int64_t total = o.keep > 0 ? std::int64_t{o.keep} + 1 : std::max<std::int64_t>(o.saves, 1);
        const auto here = static_cast<std::int64_t>(step_dirs(dir).size());
        const std::int64_t count =
            std::max<std::int64_t>(1, total - (o.keep > 0 ? std::min<std::int64_t>(here, o.keep) : 0));
        SCMOE_CHECK(free_bytes >= per * static_cast<double>(count),
                    root << ": " << mib(free_bytes) << " free; the checkpoints "
                         << (o.keep > 0 ? "--keep " + std::to_string(o.keep) : std::string("this run"))
                         << " implies need about " << mib(per * static_cast<double>(count)) << " more (" << count
                         << " of about " << mib(per) << " each: the f32 weights and two AdamW moments of "
                         << t.model.num_global_params() << " parameters)");
    });
    return notes;
}

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
