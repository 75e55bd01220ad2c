// Checkpoints as one verifiable unit (issue 26): every file's checksum is in the manifest and is
// mandatory, every file carries the run and save id, the training settings and the data are
// compared on resume (a change refused naming the field and both values unless allowed), a bad
// `latest` falls back to the newest verified step, a re-save and `keep` never lose the step a run
// resumed from, and a failure on one rank is named, with its cause, on every rank.
#include "scmoe/models/checkpoint.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "scmoe/kernels/error.h"
#include "scmoe/models/trainer.h"
#include "train_test_util.h"

namespace scmoe::models {
namespace {

namespace fs = std::filesystem;
using testing::fresh_dir;
using testing::run_train_ranks;
using testing::small_training;

std::string slurp(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void spit(const fs::path& p, const std::string& bytes) {
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out << bytes;
}

void flip_bit(const fs::path& p, std::size_t byte, int bit) {
    std::string b = slurp(p);
    ASSERT_LT(byte, b.size());
    b[byte] = static_cast<char>(b[byte] ^ (1 << bit));
    spit(p, b);
}

// Trains a world-`world` run of `config` and saves after each step in `saves` (keep 0: all).
void train_and_save(const TrainConfig& config, int world, const fs::path& dir, const std::vector<int>& saves) {
    run_train_ranks(world, world, [&](int rank, const TrainComms& comms) {
        auto device = make_device("cpu");
        Trainer t(config, *device, {world, rank, world}, comms);
        for (int s = 1; s <= saves.back(); ++s) {
            t.step();
            if (std::find(saves.begin(), saves.end(), s) != saves.end()) t.save(dir.string(), 0);
        }
    });
}

// Loads `path` on every rank of a fresh world-`world` trainer; returns each rank's error ("" loaded)
// and checks that a failed load changed nothing.
std::vector<std::string> load_errors(const TrainConfig& config, int world, const std::string& path,
                                     const std::vector<std::string>& allow = {},
                                     std::vector<CheckpointLoad>* loads = nullptr) {
    std::vector<std::string> errors(static_cast<std::size_t>(world));
    if (loads) loads->assign(static_cast<std::size_t>(world), {});
    run_train_ranks(world, world, [&](int rank, const TrainComms& comms) {
        auto device = make_device("cpu");
        Trainer t(config, *device, {world, rank, world}, comms);
        try {
            CheckpointLoad l = t.load(path, allow);
            if (loads) (*loads)[static_cast<std::size_t>(rank)] = l;
        } catch (const Error& e) {
            errors[static_cast<std::size_t>(rank)] = e.what();
            EXPECT_EQ(t.steps_done(), 0) << "rank " << rank << ": a failed load changed the trainer";
        }
    });
    return errors;
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Before: a rank file copied from step 2 into step 4 was accepted (steps 5-8 then differed), and
// some one-bit flips of a rank file were accepted (seed, epoch, position). Now the manifest's CRC of
// every file catches both; the rank that read the file names it, the other rank names that rank
// and the cause (not "see its error").
TEST(Checkpoint, RankFilesAreChecksummed) {
    const TrainConfig config = small_training(8);
    const fs::path dir = fresh_dir("ckpt_rankfile");
    train_and_save(config, 2, dir, {2, 4});
    const fs::path step4 = dir / "step-00000004";
    const std::string original = slurp(step4 / "rank-00001.json");
    spit(step4 / "rank-00001.json", slurp(dir / "step-00000002" / "rank-00001.json"));
    // The step itself: refused, by the rank that read the file and, naming it, by the other.
    std::vector<std::string> errors = load_errors(config, 2, step4.string());
    EXPECT_TRUE(has(errors[1], "rank-00001.json: checksum mismatch")) << errors[1];
    EXPECT_TRUE(has(errors[0], "failed on rank 1: ")) << errors[0];
    EXPECT_TRUE(has(errors[0], "rank-00001.json: checksum mismatch")) << errors[0];

    // A flip of the seed's last digit: still valid JSON, a different data order.
    std::string flipped = original;
    const std::size_t seed = flipped.find("\"seed\": ");
    ASSERT_NE(seed, std::string::npos) << original;
    const std::size_t digit = flipped.find_first_of(",\n", seed) - 1;
    flipped[digit] = static_cast<char>(flipped[digit] ^ 1);
    spit(step4 / "rank-00001.json", flipped);
    errors = load_errors(config, 2, step4.string());
    EXPECT_TRUE(has(errors[1], "rank-00001.json: checksum mismatch")) << errors[1];
    // The root (--resume auto): `latest` names the bad step 4, so the newest verified step, 2, loads,
    // with a note saying why.
    std::vector<CheckpointLoad> loads;
    errors = load_errors(config, 2, dir.string(), {}, &loads);
    EXPECT_EQ(errors[0] + errors[1], "");
    EXPECT_EQ(loads[0].dir, (dir / "step-00000002").string());
    ASSERT_FALSE(loads[0].notes.empty());
    EXPECT_TRUE(has(loads[0].notes[0], "names step-00000004, which fails verification")) << loads[0].notes[0];
    EXPECT_TRUE(has(loads[0].notes[0], "rank-00001.json: checksum mismatch")) << loads[0].notes[0];
    spit(step4 / "rank-00001.json", original);
    errors = load_errors(config, 2, dir.string(), {}, &loads);
    EXPECT_EQ(errors[0] + errors[1], "");
    EXPECT_EQ(loads[0].dir, step4.string());
    fs::remove_all(dir);
}

// Before: another run's shard of the same step was accepted (nothing tied the files together).
// Now its checksum differs; and with the manifest's checksum made to match (as a hand-assembled
// checkpoint would), its run and save ids still differ from the manifest's.
TEST(Checkpoint, AnotherRunsShardIsRefused) {
    TrainConfig config = small_training(8);
    const fs::path a = fresh_dir("ckpt_run_a"), b = fresh_dir("ckpt_run_b");
    train_and_save(config, 2, a, {2});
    TrainConfig other = config;
    other.seed = 8;
    train_and_save(other, 2, b, {2});
    const std::string shard = "experts-00002-of-00002.safetensors";
    fs::copy_file(b / "step-00000002" / shard, a / "step-00000002" / shard, fs::copy_options::overwrite_existing);
    std::vector<std::string> errors = load_errors(config, 2, a.string());
    EXPECT_TRUE(has(errors[1], shard + ": checksum mismatch")) << errors[1];

    // The manifest patched to the foreign shard's size and CRC: the ids give it away.
    const fs::path manifest = a / "step-00000002" / "manifest.json";
    nlohmann::ordered_json ma = nlohmann::ordered_json::parse(slurp(manifest));
    const nlohmann::ordered_json mb = nlohmann::ordered_json::parse(slurp(b / "step-00000002" / "manifest.json"));
    ma["files"][shard] = mb["files"][shard];
    spit(manifest, ma.dump(2));
    errors = load_errors(config, 2, a.string());
    EXPECT_TRUE(has(errors[1], shard + ": run id '" + mb["run_id"].get<std::string>())) << errors[1];
    EXPECT_TRUE(has(errors[1], "a file of another run or another save")) << errors[1];
    EXPECT_NE(ma["run_id"], mb["run_id"]);
    fs::remove_all(a);
    fs::remove_all(b);
}

// Before: the safetensors CRC was checked only when its metadata key was present, so renaming the
// key and flipping tensor data went through. Now the manifest's checksum of the whole file is
// mandatory, and a step without a manifest is refused.
TEST(Checkpoint, ChecksumsAreMandatory) {
    const TrainConfig config = small_training(8);
    const fs::path dir = fresh_dir("ckpt_crc");
    train_and_save(config, 1, dir, {2});
    const fs::path dense = dir / "step-00000002" / "dense.safetensors";
    std::string bytes = slurp(dense);
    const std::size_t key = bytes.find("scmoe.data_crc32");
    ASSERT_NE(key, std::string::npos);
    bytes.replace(key, 16, "scmoe.data_crcXX");  // same length: the header still parses
    bytes[bytes.size() - 5] = static_cast<char>(bytes[bytes.size() - 5] ^ 0x04);
    spit(dense, bytes);
    std::vector<std::string> errors = load_errors(config, 1, dir.string());
    EXPECT_TRUE(has(errors[0], "dense.safetensors: checksum mismatch")) << errors[0];

    fs::remove(dir / "step-00000002" / "manifest.json");
    errors = load_errors(config, 1, (dir / "step-00000002").string());
    EXPECT_TRUE(has(errors[0], "no manifest.json")) << errors[0];
    fs::remove_all(dir);
}

// Before: a changed lr, min-lr, warmup, steps, weight decay, clip or batch was accepted without a
// word (the lr jumped). Now each is refused naming the field and both values, unless allowed; the
// allowed change is reported.
TEST(Checkpoint, ChangedSettingsAreRefusedUnlessAllowed) {
    const TrainConfig config = small_training(8);
    const fs::path dir = fresh_dir("ckpt_settings");
    train_and_save(config, 1, dir, {2});
    struct Change {
        const char* name;
        void (*apply)(TrainConfig&);
        const char* expect;
    };
    const Change changes[] = {
        {"lr", [](TrainConfig& c) { c.adamw.schedule.peak_lr = 1e-3f; },
         "lr 0.003 in the checkpoint, 0.001 in this run"},
        {"min-lr", [](TrainConfig& c) { c.adamw.schedule.min_lr = 1e-4f; },
         "min-lr 0.0003 in the checkpoint, 0.0001 in this run"},
        {"warmup", [](TrainConfig& c) { c.adamw.schedule.warmup_steps = 3; },
         "warmup 2 in the checkpoint, 3 in this run"},
        {"steps", [](TrainConfig& c) { c.steps = 9; }, "steps 8 in the checkpoint, 9 in this run"},
        {"weight-decay", [](TrainConfig& c) { c.adamw.weight_decay = 0.1f; },
         "weight-decay 0 in the checkpoint, 0.1 in this run"},
        {"clip", [](TrainConfig& c) { c.max_grad_norm = 0.5f; }, "clip 1 in the checkpoint, 0.5 in this run"},
        {"batch", [](TrainConfig& c) { c.batch = 2; }, "batch 4 in the checkpoint, 2 in this run"},
    };
    for (const Change& ch : changes) {
        SCOPED_TRACE(ch.name);
        TrainConfig changed = config;
        ch.apply(changed);
        std::vector<std::string> errors = load_errors(changed, 1, dir.string());
        EXPECT_TRUE(has(errors[0], std::string("the training settings differ: ") + ch.expect)) << errors[0];
        EXPECT_TRUE(has(errors[0], std::string("--allow-change ") + ch.name)) << errors[0];
        std::vector<CheckpointLoad> loads;
        errors = load_errors(changed, 1, dir.string(), {ch.name}, &loads);
        EXPECT_EQ(errors[0], "");
        ASSERT_EQ(loads[0].notes.size(), 1u);
        EXPECT_EQ(loads[0].notes[0], std::string("allowed change (--allow-change ") + ch.name + "): " + ch.expect);
    }
    // Allowing one change does not allow another.
    TrainConfig two = config;
    two.adamw.schedule.peak_lr = 1e-3f;
    two.steps = 9;
    const std::vector<std::string> errors = load_errors(two, 1, dir.string(), {"lr"});
    EXPECT_TRUE(has(errors[0], "differ: steps 8 in the checkpoint, 9 in this run: refusing")) << errors[0];
    fs::remove_all(dir);
}

// Before: another data file of the same size (even random bytes) was accepted, and the losses
// differed. Now the data's fingerprint (sizes and content CRCs) is compared.
TEST(Checkpoint, OtherDataOfTheSameSizeIsRefused) {
    const fs::path dir = fresh_dir("ckpt_data");
    const fs::path a = dir / "a.txt", b = dir / "b.txt";
    std::string text;
    for (int i = 0; text.size() < 20000; ++i) text += "line " + std::to_string(i) + " of the training text\n";
    spit(a, text);
    std::string other = text;
    other[1000] = '#';
    spit(b, other);
    TrainConfig config = small_training(8);
    config.data = {a.string()};
    train_and_save(config, 1, dir / "ck", {2});
    TrainConfig changed = config;
    changed.data = {b.string()};
    std::vector<std::string> errors = load_errors(changed, 1, (dir / "ck").string());
    EXPECT_TRUE(has(errors[0], "differ: data: " + a.string() + " (20")) << errors[0];
    EXPECT_TRUE(has(errors[0], "in the checkpoint, " + b.string() + " (20")) << errors[0];
    std::vector<CheckpointLoad> loads;
    errors = load_errors(changed, 1, (dir / "ck").string(), {"data"}, &loads);
    EXPECT_EQ(errors[0], "");
    ASSERT_EQ(loads[0].notes.size(), 1u);
    EXPECT_TRUE(has(loads[0].notes[0], "allowed change (--allow-change data): data: ")) << loads[0].notes[0];
    // The same bytes under another name are the same data.
    fs::copy_file(a, dir / "a-copy.txt");
    TrainConfig renamed = config;
    renamed.data = {(dir / "a-copy.txt").string()};
    errors = load_errors(renamed, 1, (dir / "ck").string());
    EXPECT_EQ(errors[0], "");
    fs::remove_all(dir);
}

// Before: a deleted or dangling `latest` made `--resume auto` start from step 0 or refuse. Now a
// root without a usable `latest` loads its newest step that verifies, and says so.
TEST(Checkpoint, BadLatestFallsBackToTheNewestVerifiedStep) {
    const TrainConfig config = small_training(8);
    const fs::path dir = fresh_dir("ckpt_latest");
    train_and_save(config, 2, dir, {2, 4});
    std::vector<CheckpointLoad> loads;
    fs::remove(dir / "latest");
    EXPECT_TRUE(has_checkpoint(dir.string()));
    std::vector<std::string> errors = load_errors(config, 2, dir.string(), {}, &loads);
    EXPECT_EQ(errors[0] + errors[1], "");
    EXPECT_EQ(loads[0].dir, (dir / "step-00000004").string());
    ASSERT_EQ(loads[0].notes.size(), 1u);
    EXPECT_TRUE(has(loads[0].notes[0], "latest is missing: resuming from the newest complete, verified step"))
        << loads[0].notes[0];
    // `latest` naming a step that is not there, and the newest step incomplete (no manifest).
    spit(dir / "latest", "step-00000006\n");
    fs::remove(dir / "step-00000004" / "manifest.json");
    errors = load_errors(config, 2, dir.string(), {}, &loads);
    EXPECT_EQ(errors[0] + errors[1], "");
    EXPECT_EQ(loads[1].dir, (dir / "step-00000002").string());
    EXPECT_TRUE(has(loads[0].notes.at(0), "names step-00000006, which does not exist")) << loads[0].notes[0];
    // A re-save without RENAME_EXCHANGE (NFS) that crashed between its two renames leaves the old
    // step 4 as step-00000004.old: the fallback takes it.
    train_and_save(config, 2, dir / "moved", {2, 4});
    fs::rename(dir / "moved" / "step-00000004", dir / "moved" / "step-00000004.old");
    errors = load_errors(config, 2, (dir / "moved").string(), {}, &loads);
    EXPECT_EQ(errors[0] + errors[1], "");
    EXPECT_EQ(loads[0].dir, (dir / "moved" / "step-00000004.old").string());
    // A complete step that `latest` names but that fails its checksums: with no other step that
    // verifies (step 4 is incomplete here), the resume is refused naming each step's failure.
    spit(dir / "latest", "step-00000002\n");
    flip_bit(dir / "step-00000002" / "trainer_state.json", 10, 0);
    errors = load_errors(config, 2, dir.string());
    EXPECT_TRUE(has(errors[0], "trainer_state.json: checksum mismatch")) << errors[0];
    EXPECT_TRUE(has(errors[0], "verifies")) << errors[0];
    fs::remove_all(dir);
}

// Before: after a rollback, the first save under `keep` deleted the step the run resumed from and
// kept the abandoned newer steps, and `latest` kept naming the abandoned newest step. Now `keep` counts the steps up to
// the one saved, never deletes the resumed-from step and leaves newer ones alone; a re-saved step is replaced whole
// (new save id) and loads.
TEST(Checkpoint, KeepAfterARollbackKeepsTheResumedFromStep) {
    const TrainConfig config = small_training(8);
    const fs::path dir = fresh_dir("ckpt_keep");
    train_and_save(config, 2, dir, {2, 4, 6});
    const std::string old_save_id =
        nlohmann::json::parse(slurp(dir / "step-00000004" / "manifest.json"))["save_id"].get<std::string>();
    run_train_ranks(2, 2, [&](int rank, const TrainComms& comms) {
        auto device = make_device("cpu");
        Trainer t(config, *device, {2, rank, 2}, comms);
        t.load((dir / "step-00000002").string());
        // The rollback moves `latest` at once: a crash before the first save resumes step 2.
        CheckpointDirOptions o;
        o.keep = 1;
        const std::vector<std::string> notes = t.open_checkpoint_dir(dir.string(), o);
        if (rank == 0) {
            ASSERT_EQ(notes.size(), 1u);
            EXPECT_EQ(notes[0],
                      "latest now names step-00000002, the step this run resumed from; the newer step-00000004, "
                      "step-00000006 are left as they are");
            EXPECT_EQ(slurp(dir / "latest"), "step-00000002\n");
        }
        t.step();
        t.save(dir.string(), 1);  // step 3
        t.step();
        t.save(dir.string(), 1);  // step 4 again
    });
    EXPECT_TRUE(fs::exists(dir / "step-00000002" / "manifest.json")) << "the resumed-from step was deleted";
    EXPECT_FALSE(fs::exists(dir / "step-00000003")) << "keep 1: step 3 is older than the newest kept";
    EXPECT_TRUE(fs::exists(dir / "step-00000006" / "manifest.json")) << "a newer step was deleted";
    EXPECT_FALSE(fs::exists(dir / "step-00000004.tmp"));
    EXPECT_EQ(slurp(dir / "latest"), "step-00000004\n");
    const std::string new_save_id =
        nlohmann::json::parse(slurp(dir / "step-00000004" / "manifest.json"))["save_id"].get<std::string>();
    EXPECT_NE(new_save_id, old_save_id);
    std::vector<CheckpointLoad> loads;
    const std::vector<std::string> errors = load_errors(config, 2, dir.string(), {}, &loads);
    EXPECT_EQ(errors[0] + errors[1], "");
    EXPECT_EQ(loads[0].dir, (dir / "step-00000004").string());
    fs::remove_all(dir);
}

// Before: two trainers on one checkpoint directory were not noticed (one died, or both exited 0
// with one run's checkpoints holding the other's weights). Now the second is refused at start,
// naming the holder; the lock goes with the first trainer.
TEST(Checkpoint, SecondTrainerOnADirectoryIsRefusedNamingTheHolder) {
    const TrainConfig config = small_training(8);
    const fs::path dir = fresh_dir("ckpt_lock");
    auto device = make_device("cpu");
    std::optional<Trainer> first(std::in_place, config, *device, ParallelLayout{1, 0, 1}, TrainComms{});
    EXPECT_TRUE(first->open_checkpoint_dir(dir.string(), {}).empty());
    const std::string run = first->run_id();
    ASSERT_FALSE(run.empty());
    Trainer second(config, *device, {1, 0, 1}, {});
    char host[256] = {};
    gethostname(host, sizeof host - 1);
    try {
        second.open_checkpoint_dir(dir.string(), {});
        ADD_FAILURE() << "a second trainer took a locked directory";
    } catch (const Error& e) {
        EXPECT_TRUE(has(e.what(), dir.string() + ": the checkpoint directory is locked by host " + host + ", pid " +
                                      std::to_string(getpid()) + ", run " + run + " (since "))
            << e.what();
    }
    first->step();
    first->save(dir.string());
    first.reset();  // releases the lock
    Trainer third(config, *device, {1, 0, 1}, {});
    third.load(dir.string());
    EXPECT_TRUE(third.open_checkpoint_dir(dir.string(), {}).empty()) << "a released lock is not stale";
    fs::remove_all(dir);
}

// A lock file left by a process that ended without releasing it (killed: its flock went with it)
// is taken over, with a note naming the old holder.
TEST(Checkpoint, StaleLockIsTakenOverWithANote) {
    const TrainConfig config = small_training(8);
    const fs::path dir = fresh_dir("ckpt_stale_lock");
    spit(dir / "lock", "host=gone-host pid=999999 run=0123456789abcdef since=2026-01-01T00:00:00Z\n");
    auto device = make_device("cpu");
    Trainer t(config, *device, {1, 0, 1}, {});
    const std::vector<std::string> notes = t.open_checkpoint_dir(dir.string(), {});
    ASSERT_EQ(notes.size(), 1u);
    EXPECT_TRUE(has(notes[0], "took over the lock of " + dir.string() +
                                  " left by host gone-host, pid 999999, run 0123456789abcdef (since "
                                  "2026-01-01T00:00:00Z), which ended without releasing it"))
        << notes[0];
    EXPECT_TRUE(has(slurp(dir / "lock"), "pid=" + std::to_string(getpid()) + " run=" + t.run_id()))
        << slurp(dir / "lock");
    fs::remove_all(dir);
}

// Before: a fresh run in an old checkpoint directory repointed `latest` and overwrote the old
// checkpoints. Now it is refused at start, naming them, unless overwrite (which deletes them); a
// resumed run goes on.
TEST(Checkpoint, FreshRunOverCheckpointsIsRefusedUnlessOverwrite) {
    const TrainConfig config = small_training(8);
    const fs::path dir = fresh_dir("ckpt_fresh");
    train_and_save(config, 1, dir, {2});
    const std::string run =
        nlohmann::json::parse(slurp(dir / "step-00000002" / "manifest.json"))["run_id"].get<std::string>();
    auto device = make_device("cpu");
    {
        Trainer t(config, *device, {1, 0, 1}, {});
        try {
            t.open_checkpoint_dir(dir.string(), {});
            ADD_FAILURE() << "a fresh run took a directory with checkpoints";
        } catch (const Error& e) {
            EXPECT_TRUE(has(e.what(), dir.string() +
                                          ": the checkpoint directory holds checkpoints (step-00000002 of run " + run +
                                          "): a fresh run would overwrite them"))
                << e.what();
        }
        EXPECT_TRUE(fs::exists(dir / "step-00000002" / "manifest.json"));
    }
    {
        Trainer t(config, *device, {1, 0, 1}, {});
        t.load(dir.string());
        EXPECT_TRUE(t.open_checkpoint_dir(dir.string(), {}).empty());
    }
    {
        Trainer t(config, *device, {1, 0, 1}, {});
        CheckpointDirOptions o;
        o.overwrite = true;
        const std::vector<std::string> notes = t.open_checkpoint_dir(dir.string(), o);
        ASSERT_EQ(notes.size(), 1u);
        EXPECT_TRUE(
            has(notes[0], "--overwrite: deleted the checkpoints in " + dir.string() + " (step-00000002 of run " + run))
            << notes[0];
        EXPECT_FALSE(fs::exists(dir / "step-00000002"));
        EXPECT_FALSE(fs::exists(dir / "latest"));
    }
    fs::remove_all(dir);
}

// Before: an unusable checkpoint directory was found only at the first save, a whole
// --checkpoint-every interval later. Now at start: one that cannot be created, and one without
// room for the checkpoints `keep` implies (both numbers named).
TEST(Checkpoint, UnusableDirectoryIsFoundAtStart) {
    const TrainConfig config = small_training(8);
    const fs::path dir = fresh_dir("ckpt_unusable");
    spit(dir / "a-file", "x");
    auto device = make_device("cpu");
    Trainer t(config, *device, {1, 0, 1}, {});
    try {
        t.open_checkpoint_dir((dir / "a-file" / "ck").string(), {});
        ADD_FAILURE() << "a checkpoint directory under a file";
    } catch (const Error& e) {
        EXPECT_TRUE(has(e.what(), "a-file/ck: cannot create the checkpoint directory: ")) << e.what();
    }
    CheckpointDirOptions huge;
    huge.keep = 2000000000;
    try {
        t.open_checkpoint_dir((dir / "ck").string(), huge);
        ADD_FAILURE() << "room for 2e9 checkpoints";
    } catch (const Error& e) {
        EXPECT_TRUE(has(e.what(), " MiB free; the checkpoints --keep 2000000000 implies need about ")) << e.what();
        EXPECT_TRUE(has(e.what(), " MiB more (2000000001 of about ")) << e.what();
        EXPECT_TRUE(has(e.what(), std::to_string(t.model().num_global_params()) + " parameters)")) << e.what();
    }
    fs::remove_all(dir);
}

// Before: a rank whose peer failed said only "failed on another rank (see its error)", and in
// about a quarter of the failures the cause was never printed. Now every rank names the rank that
// failed and its cause (gathered): here a save refused on rank 1 for a non-finite moment.
TEST(Checkpoint, OtherRanksNameTheFailingRankAndItsCause) {
    const TrainConfig config = small_training(8);
    const fs::path dir = fresh_dir("ckpt_cause");
    std::vector<std::string> errors(2);
    run_train_ranks(2, 2, [&](int rank, const TrainComms& comms) {
        auto device = make_device("cpu");
        Trainer t(config, *device, {2, rank, 2}, comms);
        t.step();
        if (rank == 1) t.optimizers().back()->v()[3] = std::numeric_limits<float>::infinity();
        try {
            t.save(dir.string());
        } catch (const Error& e) {
            errors[static_cast<std::size_t>(rank)] = e.what();
        }
    });
    EXPECT_TRUE(has(errors[1], ".adam_v[3] = inf: the state is not finite")) << errors[1];
    EXPECT_TRUE(has(errors[0], "save_checkpoint " + (dir / "step-00000001").string() + ": failed on rank 1: "))
        << errors[0];
    EXPECT_TRUE(has(errors[0], ".adam_v[3] = inf: the state is not finite")) << errors[0];
    EXPECT_FALSE(has(errors[0], "see its error")) << errors[0];
    fs::remove_all(dir);
}

// The manifest parser (also the fuzz target's): a file entry needs a plain name, bytes >= 0 and
// an 8-digit hex CRC.
TEST(Checkpoint, ManifestParserRefusesBadEntries) {
    const std::string head = R"({"format": "scmoe-checkpoint-manifest-v1", "run_id": "r", "save_id": "s", "step": 2,
                                 "settings": {}, "data": null, "files": )";
    const CheckpointManifest ok = parse_checkpoint_manifest(head + R"({"a": {"bytes": 3, "crc32": "0000abcd"}}})", "d");
    EXPECT_EQ(ok.files.at("a").crc32, 0xabcdu);
    for (const char* files :
         {R"({"../a": {"bytes": 3, "crc32": "0000abcd"}}})", R"({"a": {"bytes": -1, "crc32": "0000abcd"}}})",
          R"({"a": {"bytes": 3, "crc32": "abcd"}}})", R"({"a": {"bytes": 3, "crc32": "0000abcg"}}})", R"({}})"}) {
        try {
            parse_checkpoint_manifest(head + files, "d");
            ADD_FAILURE() << "accepted " << files;
        } catch (const Error& e) {
            EXPECT_TRUE(has(e.what(), "d/manifest.json: corrupted checkpoint manifest: ")) << e.what();
        }
    }
}

}  // namespace
}  // namespace scmoe::models
