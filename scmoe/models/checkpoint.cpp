#include "scmoe/models/checkpoint.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <utility>

#include "scmoe/comm/communicator.h"
#include "scmoe/kernels/error.h"
#include "scmoe/models/detail/json_integer.h"
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

void write_text(const std::string& path, const std::string& text) { write_file_atomically(path, text.data(), text.size()); }

// Every rank learns whether all ranks succeeded: a sum of failure flags over the world.
bool all_ok(Communicator* world, bool ok, Device& device, Stream& stream) {
    if (!world || world->size() == 1) return ok;
    DeviceBuffer scratch(device, sizeof(std::int32_t));
    std::int32_t failures = ok ? 0 : 1;
    all_reduce_sum_host(*world, &failures, 1, scratch.data(), stream);
    return failures == 0;
}

// Runs `fn`; then every rank agrees: a local error is rethrown, a peer's becomes a named error.
template <class Fn>
void collectively(const CheckpointTarget& t, const std::string& what, Fn&& fn) {
    std::exception_ptr error;
    try {
        fn();
    } catch (const CommError&) {
        throw;  // a failed collective is not agreed on (see Trainer::step)
    } catch (...) {
        error = std::current_exception();
    }
    const bool ok = all_ok(t.world, !error, t.model.device(), t.model.stream());
    if (error) std::rethrow_exception(error);
    SCMOE_CHECK(ok, what << ": failed on another rank (see its error)");
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

CheckpointState parse_checkpoint_state(const std::string& text, const std::string& dir) {
    CheckpointState st;
    try {
        const ordered_json j = ordered_json::parse(text);
        SCMOE_CHECK(j.at("format").get<std::string>() == kFormat, "format " << j.at("format") << ", expected " << kFormat);
        st.step = detail::json_integer<std::int64_t>(j.at("step"));
        st.world = detail::json_integer<int>(j.at("world"));
        st.ep = detail::json_integer<int>(j.at("ep"));
        st.config = j.at("config").dump();
    } catch (const nlohmann::json::exception& e) {
        SCMOE_FAIL((fs::path(dir) / "trainer_state.json").string() << ": corrupted checkpoint state: " << e.what());
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

std::string save_checkpoint(const std::string& root, CheckpointTarget t, int keep) {
    SCMOE_CHECK(t.optimizers.size() == t.model.param_groups().size(),
                "save_checkpoint: " << t.optimizers.size() << " optimizers for " << t.model.param_groups().size()
                                    << " parameter groups");
    const ParallelLayout& L = t.layout;
    const std::string name = step_dir_name(t.step);
    const fs::path final_dir = fs::path(root) / name, tmp_dir = fs::path(root) / (name + ".tmp");
    t.model.blocks().synchronize();
    collectively(t, "save_checkpoint " + final_dir.string(), [&] {
        if (L.rank != 0) return;
        fs::create_directories(root);
        fs::remove_all(tmp_dir);
        fs::create_directory(tmp_dir);
    });

    collectively(t, "save_checkpoint " + final_dir.string(), [&] {
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
        const std::map<std::string, std::string> meta = {{"format", kFormat},
                                                         {"step", std::to_string(t.step)},
                                                         {"world", std::to_string(L.world)},
                                                         {"ep", std::to_string(L.ep)},
                                                         {"config", t.model.config().to_json()}};
        if (L.rank == 0) write_safetensors((tmp_dir / "dense.safetensors").string(), dense, meta);
        if (L.ep_group() == 0) write_safetensors((tmp_dir / expert_file_name(L.ep_rank(), L.ep)).string(), experts, meta);
        const ByteBatcherState d = t.batcher.state();
        ordered_json r;
        r["rank"] = L.rank;
        r["step"] = t.step;
        r["data"] = {{"seed", d.seed}, {"epoch", d.epoch}, {"position", d.position}, {"num_windows", d.num_windows}};
        write_text((tmp_dir / rank_file_name(L.rank)).string(), r.dump(2) + "\n");

        if (L.rank != 0) return;
        // The index: every tensor of every expert-parallel rank (rank 0 knows their names).
        SafetensorsIndex index;
        index.metadata = {{"format", kFormat}, {"step", std::to_string(t.step)}};
        const int local_experts = t.model.config().moe.num_experts / L.ep;
        for (const ParamGroup& g : groups) {
            for (const NamedTensor& nt : g.tensors) {
                const int ranks = nt.expert ? L.ep : 1;
                for (int er = 0; er < ranks; ++er) {
                    NamedTensor other = nt;
                    other.first_expert = er * local_experts;
                    for (const Slice& sl : slices_of(other)) {
                        const std::string file = nt.expert ? expert_file_name(er, L.ep) : "dense.safetensors";
                        for (const char* suffix : {"", ".adam_m", ".adam_v"}) index.weight_map[sl.name + suffix] = file;
                    }
                }
            }
        }
        write_safetensors_index((tmp_dir / "model.safetensors.index.json").string(), index);
    });

    collectively(t, "save_checkpoint " + final_dir.string(), [&] {
        if (L.rank != 0) return;
        ordered_json st;
        st["format"] = kFormat;
        st["step"] = t.step;
        st["world"] = L.world;
        st["ep"] = L.ep;
        st["config"] = ordered_json::parse(t.model.config().to_json());
        write_text((tmp_dir / "trainer_state.json").string(), st.dump(2) + "\n");
        fs::remove_all(final_dir);
        fs::rename(tmp_dir, final_dir);
        write_text((fs::path(root) / "latest").string(), name + "\n");
        // Keep the newest `keep` complete checkpoints (names sort by step).
        std::vector<fs::path> dirs;
        for (const auto& e : fs::directory_iterator(root)) {
            const std::string n = e.path().filename().string();
            if (e.is_directory() && n.rfind("step-", 0) == 0 && n.find(".tmp") == std::string::npos) dirs.push_back(e.path());
        }
        std::sort(dirs.begin(), dirs.end());
        for (std::size_t i = 0; keep > 0 && i + static_cast<std::size_t>(keep) < dirs.size(); ++i)
            if (dirs[i] != final_dir) fs::remove_all(dirs[i]);
    });
    return final_dir.string();
}

void load_checkpoint(const std::string& path, CheckpointTarget t) {
    SCMOE_CHECK(t.optimizers.size() == t.model.param_groups().size(),
                "load_checkpoint: " << t.optimizers.size() << " optimizers for " << t.model.param_groups().size()
                                    << " parameter groups");
    const ParallelLayout& L = t.layout;
    const auto& groups = t.model.param_groups();
    std::vector<HostState> host(groups.size());
    ByteBatcherState data;
    std::int64_t step = 0;
    t.model.blocks().synchronize();
    // Read and check everything first; nothing changes until every rank has succeeded.
    collectively(t, "load_checkpoint " + path, [&] {
        fs::path dir = path;
        if (fs::exists(dir / "latest")) {
            std::string name = read_text((dir / "latest").string());
            while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
            SCMOE_CHECK(!name.empty() && name.find('/') == std::string::npos,
                        (dir / "latest").string() << ": corrupted checkpoint pointer '" << name << "'");
            dir /= name;
        }
        SCMOE_CHECK(fs::exists(dir / "trainer_state.json"),
                    "no checkpoint at " << path << " (neither a 'latest' file nor trainer_state.json)");
        std::string state_text;
        try {
            state_text = read_text((dir / "trainer_state.json").string());
        } catch (const Error& e) {
            SCMOE_FAIL(dir.string() << ": " << e.what());
        }
        const CheckpointState st = parse_checkpoint_state(state_text, dir.string());
        step = st.step;
        try {
            SCMOE_CHECK(st.world == L.world && st.ep == L.ep,
                        "the checkpoint was written by world " << st.world << " x ep " << st.ep << "; this run is world "
                                                               << L.world << " x ep " << L.ep
                                                               << ": refusing to resume");
            const std::string& theirs = st.config;
            const std::string ours = t.model.config().to_json();
            SCMOE_CHECK(LmConfig::from_json(theirs).to_json() == ours,
                        "the checkpoint's model config differs:" << describe_config_difference(ours, theirs)
                                                                  << "; refusing to resume");
        } catch (const nlohmann::json::exception& e) {
            SCMOE_FAIL((dir / "trainer_state.json").string() << ": corrupted checkpoint state: " << e.what());
        } catch (const Error& e) {
            SCMOE_FAIL(dir.string() << ": " << e.what());
        }
        const SafetensorsFile dense = read_safetensors((dir / "dense.safetensors").string());
        const SafetensorsFile experts = read_safetensors((dir / expert_file_name(L.ep_rank(), L.ep)).string());
        for (const SafetensorsFile* f : {&dense, &experts}) {
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
        data = parse_checkpoint_rank_state(read_text(rank_path), rank_path);
        SCMOE_CHECK(data.num_windows == t.batcher.num_windows(),
                    dir.string() << ": the data differs: the checkpoint's shard has " << data.num_windows
                                 << " windows, this run's " << t.batcher.num_windows());
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
}

}  // namespace scmoe::models
