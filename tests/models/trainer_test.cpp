// The trainer on in-process ranks: loss falls, resume is bitwise, checkpoints of another config or
// world are refused, a corrupted checkpoint is refused with the previous one intact, bad data fails
// with a clear error. The gradient all-reduce runs during the backward (a rendezvous, no timing).
// Evaluation: the held-out loss is the LM's mean CE over the defined windows, the same on any
// number of ranks, free of gate noise, leaves training bitwise unchanged, and falls as the model
// trains; the default corpus's held-out split is never trained on.
#include "scmoe/models/trainer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <mutex>
#include <span>
#include <thread>

#include "scmoe/comm/local_communicator.h"
#include "scmoe/kernels/adamw.h"
#include "scmoe/kernels/math.h"
#include "scmoe/models/checkpoint.h"
#include "scmoe/models/optimizer.h"
#include "scmoe/moe/moe_layer.h"
#include "scmoe/moe/trace.h"
#include "rendezvous_util.h"
#include "train_test_util.h"

namespace scmoe::models {
namespace {

namespace fs = std::filesystem;
using testing::all_params;
using testing::expect_bitwise_same_runs;
using testing::fresh_dir;
using testing::RankRun;
using testing::Rendezvous;
using testing::run_train_ranks;
using testing::small_training;

TEST(Trainer, LossFallsOnTwoRanks) {
    const TrainConfig config = small_training(40);
    std::vector<double> losses;
    run_train_ranks(2, 2, [&](int rank, const TrainComms& comms) {
        auto device = make_device("cpu");
        Trainer t(config, *device, {2, rank, 2}, comms);
        for (int s = 0; s < 40; ++s) {
            const StepMetrics m = t.step();
            EXPECT_TRUE(std::isfinite(m.loss));
            EXPECT_GT(m.tokens_per_s, 0);
            if (rank == 0) losses.push_back(m.loss);
        }
    });
    ASSERT_EQ(losses.size(), 40u);
    EXPECT_NEAR(losses.front(), std::log(256.0), 0.5);
    EXPECT_LT(losses.back(), losses.front() - 1.5) << "first " << losses.front() << " last " << losses.back();
}

// Issue 28, first bug: what AdamW receives is the mean gradient over the world's tokens times the clip
// scale. The ranks hold the summed gradients after a step (the reducer leaves them in place); with
// AdamW's eps = 1, far above the gradients, the first update lr * g / (|g| + eps) grows with g's scale,
// so a constant factor on the averaged gradient (the planted `clip / dp()`, the sum instead of the mean
// where ep = world) moves every parameter. Each parameter's first update is recomputed from the rank's
// summed gradient / world and the clip scale of the reported norm, with math::adamw_update (the
// backends' own rounding): world 2 with ep 2 (dp 1) and with ep 1 (dp 2), clipping off and on.
TEST(Trainer, TheOptimizerReceivesTheMeanGradientTimesTheClipScale) {
    constexpr int kWorld = 2;
    for (const auto& [ep, max_norm] : {std::pair{2, 0.0f}, {1, 0.0f}, {2, 0.05f}, {1, 0.05f}}) {
        SCOPED_TRACE("ep " + std::to_string(ep) + ", max_grad_norm " + std::to_string(max_norm));
        TrainConfig config = small_training(4);
        config.adamw.eps = 1.0f;
        config.max_grad_norm = max_norm;
        run_train_ranks(kWorld, ep, [&](int rank, const TrainComms& comms) {
            auto device = make_device("cpu");
            Trainer t(config, *device, {kWorld, rank, ep}, comms);
            const std::vector<float> before = all_params(t);
            const StepMetrics m = t.step();
            const std::vector<float> after = all_params(t);
            std::vector<float> grads;
            for (const ParamGroup& g : t.model().param_groups()) grads.insert(grads.end(), g.grads, g.grads + g.numel);
            ASSERT_EQ(grads.size(), before.size());
            if (max_norm > 0) {
                ASSERT_GT(m.grad_norm, max_norm) << "the clipping case must clip";
            }
            const float scale = clip_scale(m.grad_norm, max_norm) / static_cast<float>(kWorld);
            const float bc1 = adamw_bias_correction(config.adamw.beta1, 1);
            const float bc2 = adamw_bias_correction(config.adamw.beta2, 1);
            std::size_t moved = 0, wrong = 0;
            double worst = 0;
            for (std::size_t i = 0; i < before.size(); ++i) {
                float master = before[i], mom = 0, var = 0;
                math::adamw_update(grads[i], scale, m.lr, config.adamw.beta1, config.adamw.beta2, config.adamw.eps,
                                   config.adamw.weight_decay, bc1, bc2, master, mom, var);
                const double want = static_cast<double>(master) - before[i];
                const double got = static_cast<double>(after[i]) - before[i];
                if (std::fabs(want) > 1e-8) ++moved;
                const double err = std::fabs(got - want);
                if (err > 1e-9 + 1e-5 * std::fabs(want)) ++wrong;
                worst = std::max(worst, err / (1e-9 + std::fabs(want)));
            }
            EXPECT_GT(moved, before.size() / 2) << "rank " << rank << ": too few parameters moved to tell a scale";
            EXPECT_EQ(wrong, 0u) << "rank " << rank << ": " << wrong << " of " << before.size()
                                 << " parameters took another update than the mean gradient's (worst relative error "
                                 << worst << ")";
        });
    }
}

TEST(Trainer, ResumeContinuesBitwise) {
    const int world = 2, ep = 2, steps = 6, cut = 3;
    const TrainConfig config = small_training(steps);
    const fs::path dir = fresh_dir("resume");
    std::vector<RankRun> straight(world), resumed(world);
    run_train_ranks(world, ep, [&](int rank, const TrainComms& comms) {
        auto device = make_device("cpu");
        Trainer t(config, *device, {world, rank, ep}, comms);
        for (int s = 0; s < steps; ++s) straight[static_cast<std::size_t>(rank)].losses.push_back(t.step().loss);
        straight[static_cast<std::size_t>(rank)].params = all_params(t);
    });
    run_train_ranks(world, ep, [&](int rank, const TrainComms& comms) {
        auto device = make_device("cpu");
        Trainer t(config, *device, {world, rank, ep}, comms);
        for (int s = 0; s < cut; ++s) t.step();
        t.save(dir.string());
    });
    run_train_ranks(world, ep, [&](int rank, const TrainComms& comms) {
        auto device = make_device("cpu");
        TrainConfig other_seed = config;
        other_seed.seed = 99;  // parameters and data order come from the checkpoint, not the seed
        Trainer t(other_seed, *device, {world, rank, ep}, comms);
        t.load(dir.string());
        EXPECT_EQ(t.steps_done(), cut);
        for (int s = cut; s < steps; ++s) resumed[static_cast<std::size_t>(rank)].losses.push_back(t.step().loss);
        resumed[static_cast<std::size_t>(rank)].params = all_params(t);
    });
    expect_bitwise_same_runs(straight, resumed, cut);
    fs::remove_all(dir);
}

// The gradient all-reduce overlapped with the backward changes nothing: the losses and the final
// parameters of dp 2 x ep 2 training are bitwise those of the all-reduce after the backward, with
// gradients summed in f32 and in bf16 (grad_reduce_dtype), which does change the training.
TEST(Trainer, GradReduceOverlapKeepsTrainingBitwise) {
    const int world = 4, ep = 2, steps = 3;
    std::vector<RankRun> finals;
    for (DType wire : {DType::kF32, DType::kBF16}) {
        std::vector<RankRun> runs[2];
        for (int overlapped = 0; overlapped < 2; ++overlapped) {
            TrainConfig config = small_training(steps);
            config.overlap_grad_reduce = overlapped == 1;
            config.grad_reduce_dtype = wire;
            runs[overlapped].resize(world);
            run_train_ranks(world, ep, [&](int rank, const TrainComms& comms) {
                auto device = make_device("cpu");
                Trainer t(config, *device, {world, rank, ep}, comms);
                RankRun& run = runs[overlapped][static_cast<std::size_t>(rank)];
                for (int s = 0; s < steps; ++s) run.losses.push_back(t.step().loss);
                run.params = all_params(t);
            });
        }
        SCOPED_TRACE(dtype_name(wire));
        expect_bitwise_same_runs(runs[0], runs[1]);
        finals.push_back(runs[0][0]);
    }
    EXPECT_NE(finals[0].params, finals[1].params) << "bf16 gradient sums left the parameters as f32 sums do";
    for (std::size_t s = 0; s < finals[0].losses.size(); ++s)
        EXPECT_NEAR(finals[1].losses[s], finals[0].losses[s], 0.02 * std::abs(finals[0].losses[s])) << "step " << s;
}

// ---- the overlap of the gradient all-reduce, proven without timing anything ----
//
// The all-reduce of the last block's gradients (the first block to finish its backward) must run
// while the backward of block 0 (attn_bwd0, the last backward op of the blocks) runs. A
// RendezvousCommunicator makes that all-reduce wait, on the stream it is issued on, for attn_bwd0
// to start, and a TraceProbe under the step's Tracer makes attn_bwd0 wait for the all-reduce to
// start. Overlapped (the reducer's own stream), both arrive and the step completes, on any machine
// and under any load; after the backward (the model's stream, behind attn_bwd0) they cannot meet,
// and the step fails naming the timeout.

// Long where the all-reduce must meet attn_bwd0; short where it cannot (a serialized schedule
// fails after the timeout whatever the machine's speed).
constexpr double kMeetTimeoutS = 60.0;
constexpr double kSerializedTimeoutS = 1.0;

// The ops of an entry list on `lane` in the order their stream ran them (one stream per lane).
std::vector<TraceEntry> on_lane(std::span<const TraceEntry> entries, const std::string& lane) {
    std::vector<TraceEntry> out;
    for (const TraceEntry& e : entries)
        if (e.lane == lane) out.push_back(e);
    std::stable_sort(out.begin(), out.end(),
                     [](const TraceEntry& a, const TraceEntry& b) { return a.start_us < b.start_us; });
    return out;
}

std::ptrdiff_t index_of(const std::vector<TraceEntry>& ops, const std::string& name) {
    const auto it = std::find_if(ops.begin(), ops.end(), [&](const TraceEntry& e) { return e.name == name; });
    return it == ops.end() ? -1 : it - ops.begin();
}

// One rank's probed step: its error ("" when it completed), its trace, whether both sides arrived,
// and attn_bwd0's place among the backbone ops of the reference step and of the probed one.
struct ReduceMeetResult {
    std::string error;
    std::vector<TraceEntry> trace;
    bool met = false;
    std::ptrdiff_t reference_index = -1, probed_index = -1;
};

// dp 1 x ep 2 on two in-process ranks (the dense gradients are summed over the world, the only
// gradient all-reduce). Per rank: a warm-up step, a traced reference step that places attn_bwd0
// among the model stream's ops, then a traced step in which the last block's first dense
// all-reduce meets attn_bwd0.
std::vector<ReduceMeetResult> meet_block0_backward(bool overlap_grad_reduce, double timeout_s) {
    const int world = 2, ep = 2;
    TrainConfig config = small_training(3);
    config.overlap_grad_reduce = overlap_grad_reduce;
    const int stage = static_cast<int>(config.model.layers);  // 1 + the last block
    const std::string reduce_name = "grad_allreduce[stage" + std::to_string(stage) + "]";
    // A rank that fails leaves its peer in a collective at most this long.
    const double comm_timeout_s = std::max(10.0, 4 * timeout_s);
    auto world_group = LocalGroup::create(world, comm_timeout_s);
    auto ep_group = LocalGroup::create(ep, comm_timeout_s);
    std::vector<ReduceMeetResult> results(world);
    std::vector<std::thread> threads;
    for (int rank = 0; rank < world; ++rank)
        threads.emplace_back([&, rank] {
            ReduceMeetResult& out = results[static_cast<std::size_t>(rank)];
            // Outlive the trainer's stream workers: this thread frees a failed step's error
            // (ThreadSanitizer does not see libstdc++'s reference count), and the streams' work
            // holds the rendezvous.
            std::exception_ptr failure;
            Rendezvous rendezvous(reduce_name, "attn_bwd0", timeout_s);
            try {
                auto world_comm = world_group->communicator(rank);
                auto ep_comm = ep_group->communicator(rank);
                testing::RendezvousCommunicator world_meets(*world_comm);
                auto device = make_device("cpu");
                testing::TraceProbe probe(*device);
                Tracer tracer(probe, rank);
                Trainer t(config, *device, {world, rank, ep}, {&world_meets, ep_comm.get(), nullptr});
                t.step();
                t.set_trace(&tracer);
                t.step();
                out.reference_index = index_of(on_lane(tracer.entries(), "backbone"), "attn_bwd0");
                SCMOE_CHECK(out.reference_index >= 0, "no attn_bwd0 on the backbone lane of the reference step");
                const std::size_t first_entry = tracer.entries().size();
                // The last block's dense gradients: the all-reduce of the first of them meets.
                std::vector<std::pair<const float*, const float*>> last_block;
                for (const ParamGroup& g : t.model().param_groups())
                    for (const NamedTensor& n : g.tensors)
                        if (n.grads_stage == stage && !n.expert)
                            last_block.emplace_back(g.grads + n.offset, g.grads + n.offset + n.numel());
                world_meets.meet_at_all_reduce(
                    [&](const void* buf, std::int64_t) {
                        const auto* p = static_cast<const float*>(buf);
                        return std::any_of(last_block.begin(), last_block.end(),
                                           [&](const auto& r) { return p >= r.first && p < r.second; });
                    },
                    rendezvous, Rendezvous::kFirst);
                probe.meet_at_op(t.model().stream(), static_cast<int>(out.reference_index), rendezvous,
                                 Rendezvous::kSecond);
                try {
                    t.step();
                    out.trace.assign(tracer.entries().begin() + static_cast<std::ptrdiff_t>(first_entry),
                                     tracer.entries().end());
                    out.probed_index = index_of(on_lane(out.trace, "backbone"), "attn_bwd0");
                } catch (const Error& e) {
                    failure = std::current_exception();
                    out.error = e.what();
                }
                t.set_trace(nullptr);
            } catch (const std::exception& e) {
                out.error = "rank " + std::to_string(rank) + ": " + e.what();
            }
            out.met = rendezvous.met();
        });
    for (auto& th : threads) th.join();
    return results;
}

// Overlapped: the last block's all-reduce runs on the reducer's stream while attn_bwd0 runs, so the
// two meet and the step completes; in the trace their entries intersect (each was still running
// when the other arrived).
TEST(Trainer, GradAllReduceRunsDuringTheBackward) {
    const std::string reduce_name = "grad_allreduce[stage" + std::to_string(small_training(1).model.layers) + "]";
    const std::vector<ReduceMeetResult> results = meet_block0_backward(true, kMeetTimeoutS);
    for (int r = 0; r < 2; ++r) {
        const ReduceMeetResult& res = results[static_cast<std::size_t>(r)];
        ASSERT_EQ(res.error, "") << "rank " << r;
        EXPECT_TRUE(res.met) << "rank " << r;
        // The probe counted ops: the probed step enqueued the same ones before attn_bwd0.
        EXPECT_EQ(res.probed_index, res.reference_index) << "rank " << r;
        const auto reduce = std::find_if(res.trace.begin(), res.trace.end(),
                                         [&](const TraceEntry& e) { return e.name == reduce_name; });
        const auto attn = std::find_if(res.trace.begin(), res.trace.end(),
                                       [](const TraceEntry& e) { return e.name == "attn_bwd0"; });
        ASSERT_NE(reduce, res.trace.end()) << "rank " << r << ": no " << reduce_name << " in the trace";
        ASSERT_NE(attn, res.trace.end()) << "rank " << r << ": no attn_bwd0 in the trace";
        EXPECT_EQ(reduce->lane, "grad_reduce");
        EXPECT_TRUE(reduce->comm);
        const double start = std::max(reduce->start_us, attn->start_us);
        const double end = std::min(reduce->start_us + reduce->duration_us, attn->start_us + attn->duration_us);
        EXPECT_LE(start, end) << "rank " << r << ": " << reduce_name << " and attn_bwd0 do not intersect";
    }
}

// After the backward (overlap_grad_reduce off), the all-reduce is on the model's stream behind
// attn_bwd0: attn_bwd0 waits for an op that cannot start before it ends, and the step fails naming
// both. The proof above tells an overlapped schedule from a serialized one.
TEST(Trainer, GradAllReduceAfterTheBackwardCannotMeetIt) {
    const std::string reduce_name = "grad_allreduce[stage" + std::to_string(small_training(1).model.layers) + "]";
    for (const ReduceMeetResult& res : meet_block0_backward(false, kSerializedTimeoutS)) {
        std::printf("%s\n", res.error.c_str());
        EXPECT_FALSE(res.met);
        EXPECT_NE(res.error.find("attn_bwd0 waited 1 s for " + reduce_name +
                                 " to start: the schedule serialized them"),
                  std::string::npos)
            << res.error;
    }
}

// exposed_comm_pct is the step's traced communication with no compute beside it: exactly none on
// one rank (no communication at all); with the gradient all-reduce after the backward behind a link
// that holds every call 20 ms, at least one call's 20 ms per step (nothing computes while the
// all-reduces run, one stage after another on the model's stream).
TEST(Trainer, ExposedCommIsTracedCommunicationWithNothingComputing) {
    TrainConfig config = small_training(3);
    {
        auto device = make_device("cpu");
        Trainer t(config, *device, {1, 0, 1}, {});
        for (int i = 0; i < 2; ++i) EXPECT_EQ(t.step().exposed_comm_pct, 0.0) << "step " << i + 1;
    }
    config.overlap_grad_reduce = false;
    const double latency_ms = 20;
    std::vector<double> exposed_ms(2), step_ms(2);
    launch::LocalTrainGroups groups(2, 1, LinkModel{"test", 1000.0, 1000.0 * latency_ms}, launch::LinkScope::kAll);
    launch::run_local_ranks(groups, 2, [&](int rank, const launch::RankComms& comms) {
        auto device = make_device("cpu");
        Trainer t(config, *device, {2, rank, 1}, comms.comms());
        t.step();
        const StepMetrics m = t.step();
        exposed_ms[static_cast<std::size_t>(rank)] = m.exposed_comm_pct / 100.0 * m.step_ms;
        step_ms[static_cast<std::size_t>(rank)] = m.step_ms;
    });
    for (std::size_t r = 0; r < 2; ++r) {
        EXPECT_GE(exposed_ms[r], latency_ms) << "rank " << r << ": step " << step_ms[r] << " ms";
        EXPECT_LT(exposed_ms[r], step_ms[r]) << "rank " << r;
    }
}

TEST(Trainer, RefusesACheckpointOfAnotherConfigOrWorld) {
    const TrainConfig config = small_training(4);
    const fs::path dir = fresh_dir("refuse");
    run_train_ranks(2, 2, [&](int rank, const TrainComms& comms) {
        auto device = make_device("cpu");
        Trainer t(config, *device, {2, rank, 2}, comms);
        t.step();
        t.save(dir.string());
    });
    // Another world size: one rank.
    {
        auto device = make_device("cpu");
        TrainConfig c = config;
        c.model.moe.num_experts = 4;
        Trainer t(c, *device, {1, 0, 1}, {});
        try {
            t.load(dir.string());
            FAIL() << "loaded a world-2 checkpoint into world 1";
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find("world 2 x ep 2"), std::string::npos) << e.what();
        }
        EXPECT_EQ(t.steps_done(), 0);
    }
    // Another config on the same world: every rank refuses, naming the field.
    run_train_ranks(2, 2, [&](int rank, const TrainComms& comms) {
        auto device = make_device("cpu");
        TrainConfig c = config;
        c.model.moe.ffn = 24;
        Trainer t(c, *device, {2, rank, 2}, comms);
        try {
            t.load(dir.string());
            ADD_FAILURE() << "loaded a checkpoint of another config";
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find("expert_ffn"), std::string::npos) << e.what();
        }
    });
    fs::remove_all(dir);
}

TEST(Trainer, CorruptedCheckpointIsRefusedAndAutoResumeFallsBackToThePreviousOne) {
    const TrainConfig config = small_training(4);
    const fs::path dir = fresh_dir("corrupt");
    std::vector<double> loss_after_2(2);
    run_train_ranks(2, 2, [&](int rank, const TrainComms& comms) {
        auto device = make_device("cpu");
        Trainer t(config, *device, {2, rank, 2}, comms);
        t.step();
        t.step();
        t.save(dir.string());
        loss_after_2[static_cast<std::size_t>(rank)] = t.step().loss;
        t.step();
        t.save(dir.string());
    });
    ASSERT_TRUE(fs::exists(dir / "step-00000002"));
    ASSERT_TRUE(fs::exists(dir / "step-00000004" / "dense.safetensors"));
    {
        // Flip one byte in the middle of the newest dense shard (its tensor data).
        const fs::path f = dir / "step-00000004" / "dense.safetensors";
        std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
        const auto size = static_cast<std::streamoff>(fs::file_size(f));
        io.seekg(size / 2);
        char c = 0;
        io.read(&c, 1);
        c = static_cast<char>(c ^ 0x10);
        io.seekp(size / 2);
        io.write(&c, 1);
    }
    run_train_ranks(2, 2, [&](int rank, const TrainComms& comms) {
        auto device = make_device("cpu");
        Trainer t(config, *device, {2, rank, 2}, comms);
        try {
            t.load((dir / "step-00000004").string());  // the corrupted step itself
            ADD_FAILURE() << "loaded a corrupted checkpoint";
        } catch (const Error& e) {
            // Every rank reads the bad dense shard, so all name its checksum.
            EXPECT_NE(std::string(e.what()).find("checksum mismatch"), std::string::npos) << e.what();
        }
        EXPECT_EQ(t.steps_done(), 0);
        // The root (--resume auto): latest names step 4, which fails verification, so step 2 loads,
        // with a note saying why; training continues as it did from step 2.
        const CheckpointLoad l = t.load(dir.string());
        EXPECT_EQ(l.dir, (dir / "step-00000002").string());
        if (rank == 0) {  // rank 0 chooses the step and holds the notes
            EXPECT_FALSE(l.notes.empty());
            if (!l.notes.empty()) {
                EXPECT_NE(l.notes[0].find("step-00000004, which fails verification"), std::string::npos)
                    << l.notes[0];
            }
        }
        EXPECT_EQ(t.steps_done(), 2);
        EXPECT_EQ(t.step().loss, loss_after_2[static_cast<std::size_t>(rank)]);
    });
    fs::remove_all(dir);
}

// A checkpoint never holds non-finite state (issue 15): with an Inf in rank 1's Adam second moment,
// save() fails on every rank naming the tensor, and no step directory appears; the earlier
// checkpoint stays the latest.
TEST(Trainer, NonFiniteStateIsNeverCheckpointed) {
    const TrainConfig config = small_training(4);
    const fs::path dir = fresh_dir("nonfinite");
    std::vector<std::string> errors(2);
    run_train_ranks(2, 2, [&](int rank, const TrainComms& comms) {
        auto device = make_device("cpu");
        Trainer t(config, *device, {2, rank, 2}, comms);
        t.step();
        t.save(dir.string());
        t.step();
        if (rank == 1) t.optimizers().back()->v()[3] = std::numeric_limits<float>::infinity();
        try {
            t.save(dir.string());
        } catch (const Error& e) {
            errors[static_cast<std::size_t>(rank)] = e.what();
        }
    });
    EXPECT_NE(errors[1].find(".adam_v[3] = inf: the state is not finite; no checkpoint is written"), std::string::npos)
        << errors[1];
    EXPECT_NE(errors[0], "") << "rank 0 saved while rank 1 could not";
    EXPECT_TRUE(fs::exists(dir / "step-00000001"));
    EXPECT_FALSE(fs::exists(dir / "step-00000002"));
    fs::remove_all(dir);
}

// Found by tests/fuzz/checkpoint_fuzz (corpus/checkpoint/regression-*.json): trainer_state.json and
// rank-NNNNN.json integers were read with nlohmann's get<T>(), which converts a float beyond T's range
// with undefined behaviour (UBSan: "1e+300 is outside the range of representable values of type
// 'long'") and wraps an integer beyond it ("world": 4294967298 read as 2, matching a world of 2).
TEST(Checkpoint, StateAndRankFilesNeedIntegersInRange) {
    const std::string state_head = R"({"format": "scmoe-checkpoint-v1", )";
    const std::string config = R"("config": {"vocab": 256})";
    auto state_error = [&](const std::string& fields) {
        try {
            parse_checkpoint_state(state_head + fields + ", " + config + "}", "ck/step-00000002");
        } catch (const Error& e) {
            return std::string(e.what());
        }
        return std::string("(no error)");
    };
    const CheckpointState ok = parse_checkpoint_state(state_head + R"("step": 2, "world": 2, "ep": 2, )" + config + "}",
                                                      "ck/step-00000002");
    EXPECT_EQ(ok.step, 2);
    EXPECT_EQ(ok.world, 2);
    EXPECT_EQ(ok.config, R"({"vocab":256})");
    for (const char* fields : {R"("step": 1e300, "world": 2, "ep": 2)", R"("step": 2.5, "world": 2, "ep": 2)",
                               R"("step": 2, "world": 4294967298, "ep": 2)", R"("step": 2, "world": 2, "ep": -1e19)"}) {
        const std::string e = state_error(fields);
        EXPECT_NE(e.find("ck/step-00000002/trainer_state.json: corrupted checkpoint state"), std::string::npos)
            << fields << ": " << e;
    }
    const std::string rank_head = R"({"rank": 0, "step": 2, "data": {"seed": 1234, "epoch": 0, )";
    const ByteBatcherState data =
        parse_checkpoint_rank_state(rank_head + R"("position": 4, "num_windows": 8613}})", "ck/rank-00000.json");
    EXPECT_EQ(data.seed, 1234u);
    EXPECT_EQ(data.position, 4);
    EXPECT_EQ(data.num_windows, 8613);
    for (const char* fields : {R"("position": 1e300, "num_windows": 8613}})", R"("position": 4, "num_windows": -9e18}})",
                               R"("position": 4, "num_windows": 9223372036854775808}})"}) {
        EXPECT_THROW(parse_checkpoint_rank_state(rank_head + fields, "ck/rank-00000.json"), Error) << fields;
    }
    EXPECT_THROW(parse_checkpoint_rank_state(R"({"data": {"seed": -1, "epoch": 0, "position": 4, "num_windows": 8}})",
                                             "ck/rank-00000.json"),
                 Error);
}

TEST(Trainer, BadDataIsAClearError) {
    auto device = make_device("cpu");
    TrainConfig c = small_training(2);
    c.data = {"/nonexistent/scmoe/corpus.txt"};
    try {
        Trainer t(c, *device, {1, 0, 1}, {});
        FAIL() << "a missing data file was accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("/nonexistent/scmoe/corpus.txt"), std::string::npos) << e.what();
    }
    const fs::path dir = fresh_dir("data");
    const fs::path empty = dir / "empty.txt";
    std::ofstream(empty).close();
    c.data = {empty.string()};
    try {
        Trainer t(c, *device, {1, 0, 1}, {});
        FAIL() << "an empty data file was accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("empty"), std::string::npos) << e.what();
    }
    fs::remove_all(dir);
}

TEST(Trainer, WorldNotDivisibleByEpIsRefused) {
    auto device = make_device("cpu");
    EXPECT_THROW(Trainer(small_training(2), *device, {3, 0, 2}, {}), Error);
}

// With a noisy gate (fresh noise every step and rank), a resumed run still continues bitwise: the
// trainer keys the noise by (step, rank), not by how many forwards this process has run.
TEST(Trainer, ResumeWithNoisyGateContinuesBitwise) {
    const int world = 2, ep = 2, steps = 4, cut = 2;
    TrainConfig config = small_training(steps);
    config.model.moe.noise_std = 1.0f;
    const fs::path dir = fresh_dir("resume_noisy");
    std::vector<RankRun> straight(world), resumed(world);
    auto run = [&](std::vector<RankRun>* out, int first, int end, bool load, bool save) {
        run_train_ranks(world, ep, [&](int rank, const TrainComms& comms) {
            auto device = make_device("cpu");
            Trainer t(config, *device, {world, rank, ep}, comms);
            if (load) t.load(dir.string());
            for (int s = first; s < end; ++s) {
                const double loss = t.step().loss;
                if (out) (*out)[static_cast<std::size_t>(rank)].losses.push_back(loss);
            }
            if (save) t.save(dir.string());
            if (out) (*out)[static_cast<std::size_t>(rank)].params = all_params(t);
        });
    };
    run(&straight, 0, steps, false, false);
    run(nullptr, 0, cut, false, true);
    run(&resumed, cut, steps, true, false);
    expect_bitwise_same_runs(straight, resumed, cut);
    fs::remove_all(dir);
}

}  // namespace
}  // namespace scmoe::models
