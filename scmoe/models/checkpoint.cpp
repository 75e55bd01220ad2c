// Saving and loading a training checkpoint (save_checkpoint, load_checkpoint). Its files are
// detail/checkpoint_files.h's; the directory and its lock are checkpoint_dir.cpp's, the weights-only
// reader checkpoint_weights.cpp's.
#include "scmoe/models/checkpoint.h"

#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <utility>

#include "scmoe/kernels/error.h"
#include "scmoe/kernels/host_io.h"
#include "scmoe/models/detail/checkpoint_files.h"
#include "scmoe/models/detail/json_integer.h"
#include "scmoe/models/parallel.h"
#include "scmoe/models/safetensors.h"

namespace scmoe::models {

using namespace detail;
using nlohmann::ordered_json;

namespace {

struct HostState {
    std::vector<float> master, m, v;
};

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

}  // namespace scmoe::models
