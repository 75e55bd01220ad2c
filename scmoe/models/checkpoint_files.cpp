// A checkpoint's files (detail/checkpoint_files.h): names, text and checksums, step directories, the
// run's settings and data fingerprint; and the public parsers of its state, rank state and manifest.
#include "scmoe/models/detail/checkpoint_files.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "scmoe/kernels/host_io.h"
#include "scmoe/models/detail/json_integer.h"

namespace scmoe::models {
namespace detail {

using nlohmann::ordered_json;

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

CheckpointManifest::File text_sum(const std::string& text) {
    return {static_cast<std::int64_t>(text.size()), crc32_update(0, text.data(), text.size())};
}

std::string describe_file(const CheckpointManifest::File& f) {
    return std::to_string(f.bytes) + " bytes, CRC-32 " + hex32(f.crc32);
}

// The tensor names a checkpoint holds for a group's tensor (checkpoint_files.h).
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

std::string meta_value(const SafetensorsFile& f, const char* key) {
    const auto it = f.metadata.find(key);
    return it == f.metadata.end() ? std::string("(none)") : it->second;
}

}  // namespace detail

using namespace detail;
using nlohmann::ordered_json;

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

}  // namespace scmoe::models
