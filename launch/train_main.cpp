// scmoe-train: trains the ScMoE language model (models/) with dp x ep parallelism — on in-process
// ranks (--ranks N, threads, the CPU quickstart) or one rank per process under mpirun / srun —
// with metrics, progress lines, checkpoints and exact resume. --variants a,b trains each variant
// in turn on the same data and seed and prints them side by side (the quickstart: top-2 vs ScMoE).
// --eval-data reports the held-out loss every --eval-every steps and after the last; --eval-only
// evaluates a checkpoint without training. Lines, metrics and the summary: launch/train_report.h.
//
// Exit status: 0 ok, 2 bad command line, 3 runtime error (a rank's error is printed with its rank),
// 4 stopped by a stop signal (--stop-signals, launch/stop_signals.h): every rank finished the
// step, agreed, saved a checkpoint (with --checkpoint-dir) and exited; --resume auto continues.
// Under mpirun a rank's error ends the job with MPI_Abort. SCMOE_FAULT_GRAD injects a non-finite
// gradient, SCMOE_FAULT_THROW a host-side error mid-step (testing; fault_from_env below).
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cxxopts.hpp>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "scmoe/comm/communicator.h"
#include "scmoe/comm/emulated_link.h"
#include "scmoe/comm/topology.h"
#include "scmoe/kernels/device.h"
#include "scmoe/kernels/emu/emu_device.h"
#include "scmoe/kernels/error.h"
#include "launch/cli_options.h"
#include "launch/emu_choice.h"
#include "launch/emu_stack.h"
#include "launch/local_rank.h"
#include "launch/plan.h"
#include "launch/startup_watchdog.h"
#include "launch/stop_signals.h"
#include "launch/train_args.h"
#include "launch/train_comms.h"
#include "launch/train_report.h"
#include "scmoe/models/trainer.h"
#include "scmoe/moe/trace.h"
#if SCMOE_WITH_MPI
#include <mpi.h>
#endif

namespace scmoe::launch {
namespace {

constexpr int kExitUsage = 2, kExitError = 3;

// The stop signal every rank agreed on (0: none): set by train_variant, read by the launchers.
std::atomic<int> g_stopped_by{0};

// SCMOE_FAULT_GRAD=STEP:RANK and SCMOE_FAULT_THROW=STEP:RANK (testing, models::StepFault): rank
// RANK's gradients at step STEP overflow to non-finite values (every rank must then stop at STEP
// with the same error, and no checkpoint of that step is written), or rank RANK throws on the host
// mid-step (every rank must end, none hang). Unset: no fault; both set: a usage error.
std::optional<models::StepFault> fault_from_env() {
    std::optional<models::StepFault> fault;
    for (const auto& [name, kind] : {std::pair{"SCMOE_FAULT_GRAD", models::StepFault::Kind::kGradient},
                                     std::pair{"SCMOE_FAULT_THROW", models::StepFault::Kind::kHostError}}) {
        const char* text = std::getenv(name);
        if (text == nullptr || *text == 0) continue;
        long long step = 0;
        int rank = -1, used = 0;
        if (std::sscanf(text, "%lld:%d%n", &step, &rank, &used) != 2 || text[used] != 0 || step < 1 || rank < 0)
            throw UsageError(std::string(name) + "='" + text + "': expected STEP:RANK (step >= 1, rank >= 0)");
        if (fault) throw UsageError("SCMOE_FAULT_GRAD and SCMOE_FAULT_THROW are both set: inject one fault at a time");
        fault = models::StepFault{kind, step, rank};
    }
    return fault;
}

#if SCMOE_WITH_MPI
// SCMOE_FAULT_STALL_START=RANK (testing): under mpirun, rank RANK hangs before the hello barrier,
// as a rank on a host that stopped responding would; the startup watchdog must end the job. Unset:
// -1 (no rank).
int stall_start_from_env() {
    const char* text = std::getenv("SCMOE_FAULT_STALL_START");
    if (text == nullptr || *text == 0) return -1;
    int rank = -1, used = 0;
    if (std::sscanf(text, "%d%n", &rank, &used) != 1 || text[used] != 0 || rank < 0)
        throw UsageError(std::string("SCMOE_FAULT_STALL_START='") + text + "': expected a rank >= 0");
    return rank;
}
#endif

// What a rank does with the error that ends its run, called while its trainer, and the streams
// that may still be inside a collective, are alive (unwinding first would wait for those streams,
// up to another comm timeout): under mpirun it reports the error and aborts the job at once; an
// in-process rank abandons its groups, so that the collectives nobody will complete fail at once.
using FatalHandler = std::function<void(const std::exception&)>;

// Trains one variant on this rank with `trainer`; rank 0 prints and writes the metrics.
// first_variant: whether this is the run's first variant (the metrics file starts empty then,
// unless resuming; later variants append their lines).
RunSummary train_variant(models::Trainer& trainer, const Args& args, const std::string& variant, bool first_variant,
                         Device& device, const models::ParallelLayout& layout, std::mutex& print_mutex) {
    const models::TrainConfig& config = trainer.config();
    const bool lead = layout.rank == 0;
    auto say = [&](const std::string& line) {
        if (!lead || args.quiet) return;
        std::lock_guard<std::mutex> lock(print_mutex);
        std::cout << line << std::endl;
    };
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
                                                      : "after the backward") +
        " in " + dtype_name(config.grad_reduce_dtype));
    if (trainer.has_eval_data()) say("# eval data: " + trainer.eval_description());
    if (!args.resume.empty()) {
        std::string path = args.resume == "auto" ? args.checkpoint_dir : args.resume;
        // A root whose `latest` is gone but whose step directories are there still resumes (never
        // a silent fresh start over them).
        if (args.resume != "auto" || models::has_checkpoint(path)) {
            // --eval-only trains nothing: the training settings (lr, steps, batch, ...) may differ.
            const models::CheckpointLoad loaded =
                trainer.load(path, args.eval_only ? models::checkpoint_setting_names() : args.allow_change);
            for (const std::string& note : loaded.notes)
                if (!args.eval_only || note.rfind("allowed change", 0) != 0) say("# resume: " + note);
            say("# resumed from " + loaded.dir + " at step " + std::to_string(trainer.steps_done()) + " (run " +
                loaded.run_id + ")");
        } else {
            say("# --resume auto: no checkpoint in " + path + " yet; starting fresh");
        }
    }
    if (!args.checkpoint_dir.empty() && !args.eval_only) {
        // The lock, a fresh run over old checkpoints, writability and room: found before any step.
        models::CheckpointDirOptions dir_options;
        dir_options.keep = args.keep;
        dir_options.overwrite = args.overwrite;
        const std::int64_t to_run = config.steps - trainer.steps_done();
        dir_options.saves = (args.checkpoint_every > 0 ? to_run / args.checkpoint_every : 0) + 1;
        for (const std::string& note : trainer.open_checkpoint_dir(args.checkpoint_dir, dir_options))
            say("# checkpoint dir: " + note);
    }
    std::ofstream metrics;
    if (lead && !args.metrics.empty()) {
        // A resumed run logs the steps after its checkpoint again: their old lines go first.
        if (trainer.steps_done() > 0 && !args.eval_only) drop_metrics_after(args.metrics, trainer.steps_done());
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
    double ms_total = 0, tps_total = 0, exposed_total = 0;
    std::int64_t timed = 0;
    const auto started = std::chrono::steady_clock::now();
    const std::int64_t first_step = trainer.steps_done();
    // The final loss: the mean over the last tenth of the steps run here (at least one), summed as
    // they come (a long run keeps no per-step history).
    const std::int64_t tail = std::max<std::int64_t>(1, (last - first_step) / 10);
    std::int64_t saved_step = -1;  // the step of the last checkpoint this loop wrote, and its directory
    std::string saved_dir;
    double tail_loss_sum = 0;
    std::int64_t tail_steps = 0;
    while (trainer.steps_done() < last) {
        const bool trace_this = !args.trace.empty() && trainer.steps_done() + 1 == last;
        if (trace_this) {
            tracer = std::make_unique<Tracer>(device, layout.rank);
            trainer.set_trace(tracer.get());
        }
        const models::StepMetrics m = trainer.step();
        trainer.set_trace(nullptr);
        if (m.step > last - tail) {
            tail_loss_sum += m.loss;
            ++tail_steps;
        }
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
            saved_step = m.step;
            saved_dir = dir;
        }
        // A stop signal, seen by any rank by now (during the step, an evaluation or a save), stops
        // every rank here, after the same step: save it (unless just saved) and end the run.
        if (m.step < last) {
            if (const int signal = trainer.agree_stop(requested_stop_signal())) {
                if (!args.checkpoint_dir.empty() && saved_step != m.step)
                    saved_dir = trainer.save(args.checkpoint_dir, args.keep);
                if (lead) {
                    std::lock_guard<std::mutex> lock(print_mutex);
                    std::cerr << "scmoe-train: " << stop_signal_name(signal) << ": finished step " << m.step << ", "
                              << (args.checkpoint_dir.empty() ? "nothing saved (no --checkpoint-dir)"
                                                              : "saved " + saved_dir)
                              << ", exiting with status " << kExitStopped
                              << (args.checkpoint_dir.empty() ? "" : " (resume: the same command with --resume auto)")
                              << std::endl;
                }
                g_stopped_by = signal;
                break;
            }
        }
    }
    if (tracer) {  // FILE.rank<r>.json; FILE.<variant>.rank<r>.json when the run trains several variants
        const std::string stem = args.variants.size() > 1 ? args.trace + "." + variant : args.trace;
        tracer->write(stem + ".rank" + std::to_string(layout.rank) + ".json");
    }
    if (args.infer_passes > 0 && !g_stopped_by) sum.forward_ms = trainer.time_forward(args.infer_passes);
    sum.steps = trainer.steps_done();
    if (tail_steps > 0) sum.final_loss = tail_loss_sum / static_cast<double>(tail_steps);
    if (timed > 0) {
        sum.step_ms = ms_total / static_cast<double>(timed);
        sum.tokens_per_s = tps_total / static_cast<double>(timed);
        sum.exposed_comm_pct = exposed_total / static_cast<double>(timed);
        sum.tflops_per_device = sum.tokens_per_s * trainer.model().train_flops_per_token() / layout.world / 1e12;
    }
    return sum;
}

RunSummary run_variant(const Args& args, const std::string& variant, bool first_variant, Device& device,
                       const models::ParallelLayout& layout, models::TrainComms comms, std::mutex& print_mutex,
                       const FatalHandler& on_fatal = {}) {
    models::TrainConfig config = args.train;
    config.model.variant = variant;
    models::Trainer trainer(config, device, layout, comms);
    try {
        return train_variant(trainer, args, variant, first_variant, device, layout, print_mutex);
    } catch (const std::exception& e) {
        if (on_fatal) on_fatal(e);
        throw;
    }
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
    // Process-wide: whichever thread takes the signal, every rank reads the request.
    install_stop_signals(args.stop_signals, "scmoe-train");
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
    if (emulated) {
        std::cout << "# " << make_train_device(args, 0)->description() << "; cluster " << describe(args.emu.topology);
        for (const std::string& note : cluster_notes(args.emu)) std::cout << "\n# " << note;
        std::cout << "\n# emu: step times are the emulator's predictions, not measurements; nothing is computed, so "
                     "the losses are meaningless (zero); error band "
                  << std::showpos << 100 * kPredictionErrorBand.low << "%.." << 100 * kPredictionErrorBand.high
                  << std::noshowpos << "% (" << kPredictionErrorBand.source << ")" << std::endl;
    }
    std::vector<RunSummary> runs;
    std::mutex print_mutex;
    for (const std::string& variant : args.variants) {
        std::unique_ptr<LocalTrainGroups> groups =
            emulated
                ? std::make_unique<LocalTrainGroups>(world, ep, emulated_topology(args.emu.topology, args.emu.stack))
                : std::make_unique<LocalTrainGroups>(world, ep, args.link, args.link_scope);
        std::vector<RunSummary> results(static_cast<std::size_t>(world));
        std::vector<emu::MemoryStats> memory(static_cast<std::size_t>(world));
        run_local_ranks(*groups, world, [&](int r, const RankComms& comms) {
            const LocalRank local = local_rank(args.device);
            std::unique_ptr<Device> device = make_train_device(args, local.value);
            // A rank that fails abandons its groups before its trainer unwinds: the peers' collectives
            // fail at once, and so do its own streams' collectives that the peers will never join.
            const FatalHandler leave = [&groups, r](const std::exception& e) { groups->abandon(r, e.what()); };
            results[static_cast<std::size_t>(r)] = run_variant(args, variant, variant == args.variants.front(), *device,
                                                               {world, r, ep}, comms.comms(), print_mutex, leave);
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
        if (g_stopped_by) return kExitStopped;  // its line is printed; the summary would be of a part
    }
    if (!args.eval_only) print_summary(runs, args.peak_tflops);
    if (const int late = requested_stop_signal())
        std::cerr << "scmoe-train: " << stop_signal_name(late) << " came after the last step: the run is complete"
                  << std::endl;
    return 0;
}

#if SCMOE_WITH_MPI
int run_mpi(const Args& launch_args) {
    const bool mpi_multiple = init_mpi_multiple();
    int rank = 0, world = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    Args args = launch_args;
    // mpirun forwards SIGUSR1 and SIGUSR2 to every rank; SIGTERM and SIGINT to mpirun end the job
    // (TERM, then KILL after its odls_base_sigkill_timeout): send those to the ranks themselves, as
    // Slurm does. A rank that alone is signalled still stops every rank (Trainer::agree_stop).
    // (Not "scmoe-train: rank R: ...": launch/mpirun.sh reads that as the rank's fatal error.)
    install_stop_signals(args.stop_signals, "scmoe-train", " on rank " + std::to_string(rank));
    // Reports the error on stderr, one line starting "scmoe-train: rank R:", and ends the job the
    // way the launcher expects: MPI_Abort, which makes mpirun kill every rank, also those blocked
    // in a collective or stopped, and return kExitError. Does not return.
    const FatalHandler abort_job = [rank](const std::exception& e) {
        // std::bad_alloc says only "std::bad_alloc": say what ran out. One write() for the whole
        // line: std::cerr is unbuffered, and mpirun interleaves the ranks' stderr chunk by chunk
        // ("scmoe-train: rank scmoe-train: rank 0: ..." hid the line from launch/mpirun.sh once).
        std::ostringstream line;
        line << "scmoe-train: rank " << rank << ": "
             << (dynamic_cast<const std::bad_alloc*>(&e) != nullptr
                     ? "out of host memory: an allocation failed (std::bad_alloc); make the model, --batch or "
                       "the processes per host smaller"
                     : e.what())
             << "\n";
        std::cerr << line.str() << std::flush;
        MPI_Abort(MPI_COMM_WORLD, kExitError);
        std::_Exit(kExitError);  // MPI_Abort should not return; if it does, still end now
    };
    // The startup's MPI calls (the hello barrier, the communicator splits) have no timeout of their
    // own: a rank that never arrives would hold the others forever. The watchdog ends the job then.
    StartupWatchdog watchdog(comm_timeout_seconds(), [rank, mpi_multiple](const std::string& why) {
        std::cerr << "scmoe-train: rank " + std::to_string(rank) + ": " + why + "\n" << std::flush;  // one write()
        if (mpi_multiple) MPI_Abort(MPI_COMM_WORLD, kExitError);  // from this thread only when MPI allows it
        std::_Exit(kExitError);  // mpirun ends the job when a rank exits without MPI_Finalize
    });
    try {
        watchdog.phase("setting up the device");
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
        if (const int stalled = stall_start_from_env(); stalled == rank) {
            watchdog.phase("a stall injected by SCMOE_FAULT_STALL_START");
            for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
        }
        watchdog.phase("the hello barrier, where a rank has not arrived");
        for (int r = 0; r < world; ++r) {
            if (r == rank) std::cout << hello.str() << std::endl;
            MPI_Barrier(MPI_COMM_WORLD);
        }
        std::vector<RunSummary> runs;
        std::mutex print_mutex;
        for (const std::string& variant : args.variants) {
            watchdog.phase("creating the communicators");
            RankComms comms = mpi_rank_comms(layout, *device, local.value, args.link, args.link_scope);
            watchdog.disarm();  // from here every collective has its own timeout
            runs.push_back(run_variant(args, variant, variant == args.variants.front(), *device, layout, comms.comms(),
                                       print_mutex, abort_job));
            if (g_stopped_by) break;
        }
        if (rank == 0 && !args.eval_only && !g_stopped_by) print_summary(runs, args.peak_tflops);
        if (const int late = requested_stop_signal(); late && !g_stopped_by)
            std::cerr << "scmoe-train: " << stop_signal_name(late) << " on rank " << rank
                      << " came after the last step: the run is complete" << std::endl;
    } catch (const std::exception& e) {
        abort_job(e);
    }
    MPI_Finalize();
    return g_stopped_by ? kExitStopped : 0;
}
#endif

}  // namespace
}  // namespace scmoe::launch

int main(int argc, char** argv) {
    using namespace scmoe::launch;
    Args args;
    try {
        args = parse(argc, argv);
        check_environment();
        args.train.fault = fault_from_env();
        check_host_memory(args, device_choice(args) == "cpu");
    } catch (const UsageError& e) {
        std::cerr << "scmoe-train: " << e.what() << "\n(scmoe-train --help lists the options)" << std::endl;
        return kExitUsage;
    }
    try {
#if SCMOE_WITH_MPI
        if (args.mpi) return run_mpi(args);
#endif
        return run_in_process(args);
    } catch (const std::bad_alloc&) {
        std::cerr << "scmoe-train: out of host memory: an allocation failed (std::bad_alloc); make the model, "
                     "--batch or --ranks smaller"
                  << std::endl;
        return kExitError;
    } catch (const std::exception& e) {
        std::cerr << "scmoe-train: " << e.what() << std::endl;
        return kExitError;
    }
}
