// scmoe-train: trains the ScMoE language model (models/) with dp x ep parallelism — on in-process
// ranks (--ranks N, threads, the CPU quickstart) or one rank per process under mpirun / srun —
// with metrics, progress lines, checkpoints and exact resume. --variants a,b trains each variant
// in turn on the same data and seed and prints them side by side (the quickstart: top-2 vs ScMoE).
// --eval-data reports the held-out loss every --eval-every steps and after the last; --eval-only
// evaluates a checkpoint without training. Lines, metrics and the summary: launch/train_report.h.
//
// Exit status: 0 ok, 2 bad command line, 3 runtime error (a rank's error is printed with its rank).
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cxxopts.hpp>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "comm/emulated_link.h"
#include "comm/topology.h"
#include "kernels/device.h"
#include "kernels/emu/emu_device.h"
#include "kernels/error.h"
#include "launch/cli_options.h"
#include "launch/emu_choice.h"
#include "launch/local_rank.h"
#include "launch/train_comms.h"
#include "launch/train_report.h"
#include "models/trainer.h"
#include "moe/trace.h"
#if SCMOE_WITH_MPI
#include <mpi.h>
#endif

namespace scmoe::launch {
namespace {

constexpr int kExitUsage = 2, kExitError = 3;

struct UsageError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

struct Args {
    models::TrainConfig train;
    std::vector<std::string> variants;
    int ranks = 1, ep = 0;  // ep 0: = world
    bool mpi = false;
    std::string backend = "auto";
    EmuChoice emu;  // --backend emu only
    std::optional<int> device;
    std::optional<LinkModel> link;
    LinkScope link_scope = LinkScope::kExpertParallel;
    std::string metrics, trace, checkpoint_dir, resume;
    std::int64_t checkpoint_every = 0, stop_at = 0, log_every = 0;
    int keep = 2;
    std::int64_t eval_every = 0;  // 0: only after the last step
    bool eval_only = false;
    int infer_passes = 0;  // 0: no inference timing
    int chunks = 0;        // the a2a / expert pipeline's pieces: 0 = auto
    bool quiet = false;
    double peak_tflops = 0;
};


Args parse(int argc, char** argv) {
    cxxopts::Options o("scmoe-train",
                       "scmoe-train: train the ScMoE byte-level language model (dp x ep).\n"
                       "In-process ranks: scmoe-train --ranks 4 --ep 4 ...   Processes: mpirun -np 8 "
                       "scmoe-train --ep 4 ...");
    o.set_width(110);
    // clang-format off
    add_model_shape_options(o, "tiny", "256");
    o.add_options("model")
        ("variants", "Block variants to train in turn, compared side by side (top2, top1, shared, scmoe-pos1, "
                     "scmoe-pos2, scmoe-pos3, scmoe2, every-block-pos1)",
         cxxopts::value<std::string>()->default_value("scmoe-pos2"))
        ("dispatch", "capacity or dropless", cxxopts::value<std::string>())
        ("capacity-factor", "Capacity factor (capacity dispatch)", cxxopts::value<float>())
        ("aux-loss", "Load-balancing loss weight", cxxopts::value<float>())
        ("no-cg", "Direct add instead of the CG-1 coefficient gate");
    o.add_options("training")
        ("steps", "Training steps (the LR schedule's length)", cxxopts::value<std::int64_t>()->default_value("200"))
        ("batch", "Sequences per rank per step", cxxopts::value<std::int64_t>()->default_value("8"))
        ("lr", "Peak learning rate", cxxopts::value<float>()->default_value("3e-3"))
        ("min-lr", "Final learning rate of the cosine", cxxopts::value<float>()->default_value("3e-4"))
        ("warmup", "Warmup steps", cxxopts::value<std::int64_t>()->default_value("20"))
        ("weight-decay", "AdamW decoupled weight decay", cxxopts::value<float>()->default_value("0.0"))
        ("clip", "Gradient clipping max norm (<= 0: off)", cxxopts::value<float>()->default_value("1.0"))
        ("seed", "Parameter and data-order seed", cxxopts::value<std::uint64_t>()->default_value("1234"))
        ("data", "Training text files, comma separated (default: the Debian license texts)",
         cxxopts::value<std::string>())
        ("no-overlap", "Run every op on one stream (same numerics, no overlap)")
        ("no-grad-overlap", "Run the gradient all-reduce after the backward instead of overlapping each block's "
                            "with the rest of it (same numerics)")
        ("no-calibrate", "Keep every expert FFN at its earliest slot instead of Eq. 11's")
        ("chunks", "Pieces of the chunked all-to-all / expert-FFN pipeline: auto (chosen per branch from the "
                   "calibrated times) or N (1 = off, at most the local experts)",
         cxxopts::value<std::string>()->default_value("auto"));
    o.add_options("evaluation")
        ("eval-data", "Held-out text files, comma separated, for the eval loss (mean CE in nats per byte, forward "
                      "only, no gate noise); 'default': the default corpus's last tenth, which training never reads",
         cxxopts::value<std::string>())
        ("eval-every", "Evaluate every N steps and after the last (0: only after the last)",
         cxxopts::value<std::int64_t>()->default_value("0"))
        ("eval-batches", "Evaluate at most the first K x batch x world windows of the eval data (0: all)",
         cxxopts::value<std::int64_t>()->default_value("64"))
        ("eval-only", "Evaluate the --resume checkpoint (or the initial parameters) and exit without training")
        ("infer-passes", "After training, time N forward-only passes (inference) of a training batch; the summary "
                         "gets their mean and its speedup (0: off)", cxxopts::value<int>()->default_value("0"));
    o.add_options("parallel")
        ("ranks", "In-process ranks (threads) when not under mpirun", cxxopts::value<int>()->default_value("1"))
        ("ep", "Expert-parallel size (divides the world; default: the world)", cxxopts::value<int>())
        ("backend", "cpu, cuda, emu (emulated GPUs: modeled times, nothing computed, losses meaningless) or auto",
         cxxopts::value<std::string>()->default_value("auto"))
        ("gpu", "emu: the emulated GPU, a30, a800, h100, h200 (default h100) or a profile JSON (docs/emu.md)",
         cxxopts::value<std::string>())
        ("cluster", "emu: the emulated cluster (a30-pcie-8, a800-nvlink-8, a800-2x8, h100-nvlink-8, h100-ib-2x8, "
                    "h200-nvlink-8; default: the --gpu's 8-GPU node)", cxxopts::value<std::string>())
        ("routing", "emu: how the emulated router picks experts: balanced, zipf:S or counts:c0,c1,...",
         cxxopts::value<std::string>()->default_value("balanced"))
        ("device", "GPU index (default: the local rank from OMPI_COMM_WORLD_LOCAL_RANK / SLURM_LOCALID / LOCAL_RANK)",
         cxxopts::value<int>())
        ("link", "Emulated link under the expert-parallel all-to-all: pcie4, nvlink4, ib-ndr, 100gbe or gbps=X,latency_us=Y",
         cxxopts::value<std::string>())
        ("link-all", "Put the emulated link under every collective, the gradient all-reduce too (default: only the "
                     "expert-parallel all-to-all)");
    o.add_options("output")
        ("metrics", "JSON lines, one per step: step, loss, lr, tokens_per_s, step_ms, exposed_comm_pct, "
                    "dropped_tokens, ...", cxxopts::value<std::string>())
        ("log-every", "Progress line every N steps (default: steps / 20)", cxxopts::value<std::int64_t>())
        ("trace", "Chrome/Perfetto trace of the last step, FILE.rank<r>.json per rank", cxxopts::value<std::string>())
        ("checkpoint-dir", "Checkpoint root directory", cxxopts::value<std::string>())
        ("checkpoint-every", "Save every N steps (0: only at the end)", cxxopts::value<std::int64_t>()->default_value("0"))
        ("keep", "Checkpoints to keep", cxxopts::value<int>()->default_value("2"))
        ("resume", "Resume from a checkpoint root (its 'latest') or step directory; 'auto': --checkpoint-dir "
                   "if it holds one", cxxopts::value<std::string>())
        ("stop-at", "Stop after this step (as if interrupted; the schedule still spans --steps)",
         cxxopts::value<std::int64_t>()->default_value("0"))
        ("peak-tflops", "Peak dense TFLOP/s of one device, for the MFU in the summary (e.g. 989 for H100 SXM bf16)",
         cxxopts::value<double>()->default_value("0"))
        ("quiet", "Only the summary")
        ("h,help", "Print this help");
    // clang-format on
    cxxopts::ParseResult r;
    try {
        r = o.parse(argc, argv);
    } catch (const cxxopts::exceptions::exception& e) {
        throw UsageError(e.what());
    }
    if (r.count("help")) {
        std::cout
            << o.help() << "\nExamples:\n"
            << "  scmoe-train --ranks 4 --variants top2,scmoe-pos2 --link pcie4      # CPU quickstart\n"
            << "  scmoe-train --ranks 2 --eval-data default --eval-every 50 --checkpoint-dir ck  # held-out loss\n"
            << "  scmoe-train --ranks 2 --resume ck --eval-only --eval-data default            # evaluate ck\n"
            << "  mpirun -np 8 scmoe-train --preset gpt2-moe-small --ep 8 --backend cuda --checkpoint-dir ck\n";
        std::exit(0);
    }
    if (!r.unmatched().empty()) throw UsageError("unexpected argument '" + r.unmatched()[0] + "'");
    Args a;
    try {
        models::LmConfig& m = a.train.model;
        m = read_model_shape_options(r);
        if (r.count("dispatch")) m.moe.dispatch = parse_dispatch_mode(r["dispatch"].as<std::string>());
        if (r.count("capacity-factor")) m.moe.capacity_factor = r["capacity-factor"].as<float>();
        if (r.count("aux-loss")) m.moe.aux_loss_coef = r["aux-loss"].as<float>();
        m.coefficient_gate = !r.count("no-cg");
        a.variants = split_comma_list(r["variants"].as<std::string>());
        if (a.variants.empty()) throw UsageError("--variants is empty");
        for (const std::string& v : a.variants) {
            models::LmConfig c = m;
            c.variant = v;
            c.validate();
        }
        m.variant = a.variants[0];
    } catch (const Error& e) {
        throw UsageError(e.what());
    }
    models::TrainConfig& t = a.train;
    t.steps = r["steps"].as<std::int64_t>();
    t.batch = r["batch"].as<std::int64_t>();
    t.adamw.schedule.peak_lr = r["lr"].as<float>();
    t.adamw.schedule.min_lr = std::min(r["min-lr"].as<float>(), t.adamw.schedule.peak_lr);
    t.adamw.schedule.warmup_steps = r["warmup"].as<std::int64_t>();
    t.adamw.weight_decay = r["weight-decay"].as<float>();
    t.max_grad_norm = r["clip"].as<float>();
    t.seed = r["seed"].as<std::uint64_t>();
    if (r.count("data")) t.data = split_comma_list(r["data"].as<std::string>());
    t.overlap = !r.count("no-overlap");
    t.overlap_grad_reduce = !r.count("no-grad-overlap");
    t.calibrate = !r.count("no-calibrate");
    if (t.steps <= 0) throw UsageError("--steps must be > 0");
    if (t.batch <= 0) throw UsageError("--batch must be > 0");
    if (t.adamw.schedule.warmup_steps < 0) throw UsageError("--warmup must be >= 0");
    if (r.count("eval-data")) t.eval_data = split_comma_list(r["eval-data"].as<std::string>());
    for (const char* flag : {"eval-every", "eval-batches", "eval-only"})
        if (r.count(flag) && t.eval_data.empty()) throw UsageError(std::string("--") + flag + " needs --eval-data");
    if (r.count("eval-data") && t.eval_data.empty()) throw UsageError("--eval-data is empty");
    if (t.eval_data == std::vector<std::string>{models::kDefaultHeldOut} && !t.data.empty())
        throw UsageError(
            "--eval-data default is the default corpus's held-out tenth; with --data, name held-out files");
    a.eval_every = r["eval-every"].as<std::int64_t>();
    t.eval_batches = r["eval-batches"].as<std::int64_t>();
    a.eval_only = r.count("eval-only") > 0;
    a.infer_passes = r["infer-passes"].as<int>();
    if (const std::string chunks = r["chunks"].as<std::string>(); chunks != "auto") {
        char* end = nullptr;
        const long n = std::strtol(chunks.c_str(), &end, 10);
        if (chunks.empty() || *end != 0 || n < 1) throw UsageError("--chunks must be auto or a positive integer");
        a.chunks = static_cast<int>(n);
    }
    if (a.infer_passes < 0) throw UsageError("--infer-passes must be >= 0");
    if (a.eval_every < 0 || t.eval_batches < 0) throw UsageError("--eval-every and --eval-batches must be >= 0");
    a.ranks = r["ranks"].as<int>();
    if (a.ranks <= 0) throw UsageError("--ranks must be > 0");
    a.mpi = launched_by_mpirun();
#if !SCMOE_WITH_MPI
    if (a.mpi) throw UsageError("launched under mpirun, but this build has no MPI");
#endif
    if (a.mpi && r.count("ranks")) throw UsageError("--ranks is for in-process ranks; under mpirun use -np");
    a.ep = r.count("ep") ? r["ep"].as<int>() : 0;
    a.backend = r["backend"].as<std::string>();
    if (a.backend != "auto" && a.backend != "cpu" && a.backend != "cuda" && a.backend != "emu")
        throw UsageError("--backend " + a.backend + ": expected auto, cpu, cuda or emu");
    if (a.backend != "emu" && (r.count("gpu") || r.count("cluster") || r["routing"].count()))
        throw UsageError("--gpu, --cluster and --routing describe emulated GPUs: they need --backend emu");
    if (a.backend == "emu") {
        if (a.mpi) throw UsageError("--backend emu runs its ranks in-process (--ranks N), not under mpirun");
        try {
            a.emu = resolve_emu_choice(r.count("gpu") ? r["gpu"].as<std::string>() : "",
                                       r.count("cluster") ? r["cluster"].as<std::string>() : "",
                                       r["routing"].as<std::string>(), a.ranks);
        } catch (const Error& e) {
            throw UsageError(e.what());
        }
    }
    if (r.count("device")) a.device = r["device"].as<int>();
    if (r.count("link")) {
        try {
            a.link = parse_link_model(r["link"].as<std::string>());
        } catch (const Error& e) {
            throw UsageError(std::string("--link: ") + e.what());
        }
    }
    if (a.link && a.backend == "emu")
        throw UsageError("--backend emu models the interconnect itself (--cluster): drop --link");
    if (r.count("link-all")) {
        if (!a.link) throw UsageError("--link-all needs --link");
        a.link_scope = LinkScope::kAll;
    }
    if (r.count("metrics")) a.metrics = r["metrics"].as<std::string>();
    if (r.count("trace")) a.trace = r["trace"].as<std::string>();
    if (r.count("checkpoint-dir")) a.checkpoint_dir = r["checkpoint-dir"].as<std::string>();
    if (r.count("resume")) a.resume = r["resume"].as<std::string>();
    a.checkpoint_every = r["checkpoint-every"].as<std::int64_t>();
    a.keep = r["keep"].as<int>();
    a.stop_at = r["stop-at"].as<std::int64_t>();
    a.log_every = r.count("log-every") ? r["log-every"].as<std::int64_t>() : std::max<std::int64_t>(1, t.steps / 20);
    a.quiet = r.count("quiet") > 0;
    a.peak_tflops = r["peak-tflops"].as<double>();
    if (a.checkpoint_every < 0 || a.stop_at < 0 || a.log_every <= 0) throw UsageError("negative step counts");
    if ((a.checkpoint_every > 0 || a.stop_at > 0) && a.checkpoint_dir.empty() && a.checkpoint_every > 0)
        throw UsageError("--checkpoint-every needs --checkpoint-dir");
    if (a.resume == "auto" && a.checkpoint_dir.empty()) throw UsageError("--resume auto needs --checkpoint-dir");
    if (a.variants.size() > 1 && (!a.checkpoint_dir.empty() || !a.resume.empty()))
        throw UsageError("checkpoints are per run: give one variant with --checkpoint-dir / --resume");
    return a;
}

// Trains one variant on this rank; rank 0 prints and writes the metrics.
// first_variant: whether this is the run's first variant (the metrics file starts empty then,
// unless resuming; later variants append their lines).
RunSummary run_variant(const Args& args, const std::string& variant, bool first_variant, Device& device,
                       const models::ParallelLayout& layout, models::TrainComms comms, std::mutex& print_mutex) {
    models::TrainConfig config = args.train;
    config.model.variant = variant;
    const bool lead = layout.rank == 0;
    auto say = [&](const std::string& line) {
        if (!lead || args.quiet) return;
        std::lock_guard<std::mutex> lock(print_mutex);
        std::cout << line << std::endl;
    };
    models::Trainer trainer(config, device, layout, comms);
    trainer.model().blocks().set_expert_chunks(args.chunks);
    say("# variant " + variant + ": " + trainer.model().config().describe());
    say("# data: " + trainer.data_description() + "; " + std::to_string(trainer.batcher().num_windows()) +
        " windows on rank 0");
    say("# params: " + std::to_string(trainer.model().num_global_params()) + " in the model, " +
        std::to_string(trainer.model().num_params()) + " on each rank");
    if (config.adamw.schedule.warmup_steps > config.steps)
        say("# note: --warmup " + std::to_string(config.adamw.schedule.warmup_steps) + " is longer than the run (" +
            std::to_string(config.steps) + " steps): the lr rises all the way and ends at " +
            std::to_string(100 * config.steps / config.adamw.schedule.warmup_steps) + "% of its peak");
    say(std::string("# overlap: ") + (config.overlap ? "ScMoE branches on their own stream" : "off (one stream)") +
        "; gradient all-reduce " +
        (config.overlap && config.overlap_grad_reduce ? "per block, overlapped with the backward"
                                                      : "after the backward"));
    if (trainer.has_eval_data()) say("# eval data: " + trainer.eval_description());
    if (!args.resume.empty()) {
        std::string path = args.resume == "auto" ? args.checkpoint_dir : args.resume;
        const bool has = std::ifstream(path + "/latest").good() || std::ifstream(path + "/trainer_state.json").good();
        if (args.resume != "auto" || has) {
            trainer.load(path);
            say("# resumed from " + path + " at step " + std::to_string(trainer.steps_done()));
        } else {
            say("# --resume auto: no checkpoint in " + path + " yet; starting fresh");
        }
    }
    std::ofstream metrics;
    if (lead && !args.metrics.empty()) {
        metrics.open(args.metrics, first_variant && trainer.steps_done() == 0 ? std::ios::trunc : std::ios::app);
        SCMOE_CHECK(metrics, "--metrics " << args.metrics << ": cannot open for writing");
    }
    RunSummary sum;
    sum.variant = variant;
    auto evaluate = [&] {
        const models::EvalMetrics e = trainer.evaluate();
        sum.eval = e;
        if (metrics) metrics << eval_json(variant, e) << "\n" << std::flush;
        if (lead && (!args.quiet || args.eval_only)) {  // --eval-only's line is its result
            std::lock_guard<std::mutex> lock(print_mutex);
            std::cout << eval_line(e) << std::endl;
        }
    };
    if (args.eval_only) {
        evaluate();
        sum.steps = trainer.steps_done();
        return sum;
    }
    std::unique_ptr<Tracer> tracer;
    const std::int64_t last = args.stop_at > 0 ? std::min(args.stop_at, config.steps) : config.steps;
    std::vector<double> losses;
    double ms_total = 0, tps_total = 0, exposed_total = 0;
    std::int64_t timed = 0;
    const auto started = std::chrono::steady_clock::now();
    const std::int64_t first_step = trainer.steps_done();
    while (trainer.steps_done() < last) {
        const bool trace_this = !args.trace.empty() && trainer.steps_done() + 1 == last;
        if (trace_this) {
            tracer = std::make_unique<Tracer>(device, layout.rank);
            trainer.set_trace(tracer.get());
        }
        const models::StepMetrics m = trainer.step();
        trainer.set_trace(nullptr);
        losses.push_back(m.loss);
        if (m.step == first_step + 1) sum.first_loss = m.loss;
        if (m.step > first_step + 1) {
            ms_total += m.step_ms;
            tps_total += m.tokens_per_s;
            exposed_total += m.exposed_comm_pct;
            ++timed;
        }
        sum.dropped += m.dropped_tokens;
        if (metrics) metrics << step_json(variant, m) << "\n" << std::flush;
        if (m.step == first_step + 1 && !trainer.schedule_description().empty()) {
            std::istringstream lines(trainer.schedule_description());
            for (std::string line; std::getline(lines, line);) say("# slot: " + line);
        }
        if (m.step % args.log_every == 0 || m.step == last) {
            const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
            const double per_step = elapsed / static_cast<double>(m.step - first_step);
            say(step_line(m, config.steps, per_step * static_cast<double>(last - m.step)));
        }
        if (trainer.has_eval_data() && ((args.eval_every > 0 && m.step % args.eval_every == 0) || m.step == last))
            evaluate();
        if (!args.checkpoint_dir.empty() &&
            ((args.checkpoint_every > 0 && m.step % args.checkpoint_every == 0) || m.step == last)) {
            const std::string dir = trainer.save(args.checkpoint_dir, args.keep);
            say("# checkpoint " + dir);
        }
    }
    if (tracer) tracer->write(args.trace + ".rank" + std::to_string(layout.rank) + ".json");
    if (args.infer_passes > 0) sum.forward_ms = trainer.time_forward(args.infer_passes);
    sum.steps = trainer.steps_done();
    if (!losses.empty()) {
        const std::size_t tail = std::max<std::size_t>(1, losses.size() / 10);
        double s = 0;
        for (std::size_t i = losses.size() - tail; i < losses.size(); ++i) s += losses[i];
        sum.final_loss = s / static_cast<double>(tail);
    }
    if (timed > 0) {
        sum.step_ms = ms_total / static_cast<double>(timed);
        sum.tokens_per_s = tps_total / static_cast<double>(timed);
        sum.exposed_comm_pct = exposed_total / static_cast<double>(timed);
        sum.tflops_per_device = sum.tokens_per_s * trainer.model().train_flops_per_token() / layout.world / 1e12;
    }
    return sum;
}

std::string device_choice(const Args& args) {
    if (args.backend == "auto") return cuda_device_available() ? "cuda" : "cpu";
    return args.backend;
}

std::unique_ptr<Device> make_train_device(const Args& args, int index) {
    if (args.backend != "emu") return make_device(device_choice(args), index);
    return make_emu_device(args.emu);
}

int run_in_process(const Args& args) {
    const int world = args.ranks, ep = args.ep > 0 ? args.ep : world;
    models::ParallelLayout{world, 0, ep}.validate();
    const std::string backend = device_choice(args);
    std::cout << "# scmoe-train: " << world << " in-process rank(s), dp " << world / ep << " x ep " << ep
              << ", backend " << backend
              << (args.link ? ", link " + describe_link_model(*args.link) +
                                  (args.link_scope == LinkScope::kAll ? " under every collective"
                                                                      : " under the expert-parallel a2a")
                            : std::string())
              << std::endl;
    const bool emulated = backend == "emu";
    if (emulated)
        std::cout << "# " << make_train_device(args, 0)->description() << "; cluster "
                  << describe(cluster_topology(args.emu.cluster))
                  << "\n# emu: step times are the emulator's predictions, not measurements; nothing is computed, so "
                     "the losses are meaningless (zero)"
                  << std::endl;
    std::vector<RunSummary> runs;
    std::mutex print_mutex;
    for (const std::string& variant : args.variants) {
        std::unique_ptr<LocalTrainGroups> groups =
            emulated ? std::make_unique<LocalTrainGroups>(world, ep, cluster_topology(args.emu.cluster))
                     : std::make_unique<LocalTrainGroups>(world, ep, args.link, args.link_scope);
        std::vector<RunSummary> results(static_cast<std::size_t>(world));
        std::vector<emu::MemoryStats> memory(static_cast<std::size_t>(world));
        run_local_ranks(*groups, world, [&](int r, const RankComms& comms) {
            const LocalRank local = local_rank(args.device);
            std::unique_ptr<Device> device = make_train_device(args, local.value);
            results[static_cast<std::size_t>(r)] = run_variant(args, variant, variant == args.variants.front(), *device,
                                                               {world, r, ep}, comms.comms(), print_mutex);
            if (emulated) memory[static_cast<std::size_t>(r)] = emu::as_emu(*device).memory();
        });
        if (emulated && !args.quiet) {
            std::uint64_t peak = 0;
            for (const emu::MemoryStats& m : memory) peak = std::max(peak, m.peak);
            std::cout << "# emu: peak device memory per GPU " << std::fixed << std::setprecision(2)
                      << static_cast<double>(peak) / (1ull << 30) << " GiB of "
                      << static_cast<double>(memory[0].capacity) / (1ull << 30) << " GiB (" << variant << ")"
                      << std::defaultfloat << std::endl;
        }
        runs.push_back(results[0]);
    }
    if (!args.eval_only) print_summary(runs, args.peak_tflops);
    return 0;
}

#if SCMOE_WITH_MPI
int run_mpi(const Args& launch_args) {
    const bool mpi_multiple = init_mpi_multiple();
    int rank = 0, world = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    int status = 0;
    Args args = launch_args;
    try {
        if (device_choice(args) == "cpu" && !mpi_multiple && args.train.overlap_grad_reduce && args.train.overlap) {
            // On CPU the collectives are MPI calls from the streams' threads; without
            // MPI_THREAD_MULTIPLE only one stream may be inside MPI at a time.
            args.train.overlap_grad_reduce = false;
            if (rank == 0)
                std::cout << "# the MPI library does not provide MPI_THREAD_MULTIPLE: the gradient all-reduce runs "
                             "after the backward (--no-grad-overlap)"
                          << std::endl;
        }
        const int ep = args.ep > 0 ? args.ep : world;
        const models::ParallelLayout layout{world, rank, ep};
        layout.validate();
        const std::string backend = device_choice(args);
        const LocalRank local = local_rank(args.device);
        std::unique_ptr<Device> device = make_train_device(args, local.value);
        char host[64] = {};
        gethostname(host, sizeof host - 1);
        std::ostringstream hello;
        hello << "# " << layout.describe() << " on " << host << ", " << device->description() << " (local rank "
              << local.value << " from " << local.source << ")";
        for (int r = 0; r < world; ++r) {
            if (r == rank) std::cout << hello.str() << std::endl;
            MPI_Barrier(MPI_COMM_WORLD);
        }
        std::vector<RunSummary> runs;
        std::mutex print_mutex;
        for (const std::string& variant : args.variants) {
            RankComms comms = mpi_rank_comms(layout, *device, local.value, args.link, args.link_scope);
            runs.push_back(run_variant(args, variant, variant == args.variants.front(), *device, layout, comms.comms(),
                                       print_mutex));
        }
        if (rank == 0 && !args.eval_only) print_summary(runs, args.peak_tflops);
    } catch (const std::exception& e) {
        std::cerr << "scmoe-train: rank " << rank << ": " << e.what() << std::endl;
        MPI_Abort(MPI_COMM_WORLD, kExitError);  // peers may be blocked in a collective
        status = kExitError;
    }
    MPI_Finalize();
    return status;
}
#endif

}  // namespace
}  // namespace scmoe::launch

int main(int argc, char** argv) {
    using namespace scmoe::launch;
    Args args;
    try {
        args = parse(argc, argv);
    } catch (const UsageError& e) {
        std::cerr << "scmoe-train: " << e.what() << "\n(scmoe-train --help lists the options)" << std::endl;
        return kExitUsage;
    }
    try {
#if SCMOE_WITH_MPI
        if (args.mpi) return run_mpi(args);
#endif
        return run_in_process(args);
    } catch (const std::exception& e) {
        std::cerr << "scmoe-train: " << e.what() << std::endl;
        return kExitError;
    }
}
