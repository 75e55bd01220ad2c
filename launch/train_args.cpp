#include "launch/train_args.h"

#include "launch/emu_stack.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cxxopts.hpp>
#include <fstream>
#include <iostream>
#include <iterator>
#include <limits>
#include <sstream>
#include <tuple>

#include "launch/cli_options.h"
#include "launch/local_rank.h"
#include "launch/stop_signals.h"
#include "scmoe/comm/comm_sms.h"
#include "scmoe/comm/communicator.h"
#include "scmoe/kernels/cuda/cudnn_attention_plan.h"
#include "scmoe/kernels/env.h"
#include "scmoe/kernels/error.h"
#include "scmoe/kernels/grouped_gemm.h"
#include "scmoe/models/memory_estimate.h"
#include "scmoe/moe/block_stack.h"

namespace scmoe::launch {
namespace {

// cxxopts says "Argument 'x' failed to parse" without the flag: find the flag whose value x is and
// say what it takes. `what`: cxxopts' message.
std::string unparsable_value_error(int argc, const char* const* argv, const std::string& what) {
    auto quoted_in_what = [&](const std::string& value) {
        return what.find("\u2018" + value + "\u2019") != std::string::npos ||
               what.find("'" + value + "'") != std::string::npos;
    };
    std::string flag, value;
    for (int i = 1; i < argc && flag.empty(); ++i) {
        const std::string token = argv[i];
        if (token.rfind("--", 0) == 0 && token.find('=') != std::string::npos) {
            const std::size_t eq = token.find('=');
            if (quoted_in_what(token.substr(eq + 1))) flag = token.substr(0, eq), value = token.substr(eq + 1);
        } else if (token.size() > 1 && token[0] == '-' && i + 1 < argc && quoted_in_what(argv[i + 1])) {
            flag = token, value = argv[i + 1];
        }
    }
    if (flag.empty()) return what;
    static const char* const kDecimal[] = {
        "--lr", "--min-lr", "--weight-decay", "--clip", "--capacity-factor", "--aux-loss", "--peak-tflops"};
    const bool decimal = std::find(std::begin(kDecimal), std::end(kDecimal), flag) != std::end(kDecimal);
    return flag + " '" + value + "': " +
           (decimal ? "expected a finite decimal number (e.g. 3e-4 or 0.1)"
                    : "expected a whole number, written out (e.g. 1000000, not 1e6 or 1M), within the flag's range" +
                          std::string(flag == "--seed" ? " (0 to 18446744073709551615)" : ""));
}

// The most in-process ranks (threads of one process, several each): more belong under mpirun.
constexpr int kMaxInProcessRanks = 1024;

}  // namespace

void check_environment() {
    // The readers run deep in the library (on stream threads, at the first collective, on the GPU
    // only): read each here first, so that a bad value ends the run before it starts, naming it.
    try {
        cpu_blas_threads_setting();
        emu_stall_seconds_setting();
        comm_timeout_seconds();
        resolve_comm_sms([](const char* name) { return std::getenv(name); }, -1);
        if (const char* v = std::getenv("SCMOE_GROUPED_GEMM_PROVIDER"); v && *v) {
            try {
                parse_grouped_gemm_provider(v);
            } catch (const Error& e) {
                throw Error(std::string("SCMOE_GROUPED_GEMM_PROVIDER: ") + e.what());
            }
        }
        cuda::effective_attention_provider(AttentionProvider::kAuto, std::getenv("SCMOE_ATTENTION_PROVIDER"));
        cuda::attention_deterministic_from_env(std::getenv("SCMOE_ATTENTION_DETERMINISTIC"), 90);
        if (const char* v = std::getenv("SCMOE_CUTLASS_ARCH"); v && *v) {
            const std::string arch = v;
            if (arch != "auto" && arch != "sm80" && arch != "sm90")
                throw Error("SCMOE_CUTLASS_ARCH='" + arch + "': expected auto, sm80 or sm90");
        }
        // The kernel reads any value but 0 as on: "no" or "false" would turn the trace on.
        if (const char* v = std::getenv("SCMOE_CUTLASS_TRACE");
            v && *v && std::string(v) != "0" && std::string(v) != "1")
            throw Error(std::string("SCMOE_CUTLASS_TRACE='") + v + "': expected 1 (trace every call) or 0");
    } catch (const Error& e) {
        throw UsageError(e.what());
    }
}

void check_host_memory(const Args& a, bool cpu_backend) {
    double available = -1;  // MemAvailable, bytes
    {
        std::ifstream meminfo("/proc/meminfo");
        for (std::string key; meminfo >> key;) {
            double kib = 0;
            meminfo >> kib;
            if (key == "MemAvailable:") {
                available = kib * 1024;
                break;
            }
            meminfo.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
        }
    }
    if (available < 0) return;  // not Linux: nothing to compare with
    // The ranks sharing this host's memory: in-process ranks, or the processes mpirun put here.
    int ranks_here = a.ranks;
    if (a.mpi) {
        const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
        ranks_here = local != nullptr && std::atoi(local) > 0 ? std::atoi(local) : 1;
    }
    const int world = a.mpi ? launcher_world_size() : a.ranks;
    const int ep = a.ep > 0 ? a.ep : std::max(world, 1);
    for (const std::string& variant : a.variants) {
        models::TrainConfig config = a.train;
        config.model.variant = variant;
        const models::TrainMemoryEstimate e = models::estimate_train_memory(config, ep, !a.eval_only);
        // GPUs (and emulated ones) hold the model in device memory: the host keeps the token batches.
        const double per_rank = cpu_backend ? e.total_bytes() : e.batch_bytes;
        const double need = per_rank * ranks_here;
        if (need <= available) continue;
        const models::LmConfig& m = config.model;
        std::ostringstream why;
        why << "this configuration needs at least " << models::format_bytes(need) << " of host memory";
        if (ranks_here > 1) why << " (" << ranks_here << " ranks here x " << models::format_bytes(per_rank) << ")";
        why << ", this machine has " << models::format_bytes(available)
            << " available (MemAvailable, /proc/meminfo). Per rank: "
            << (cpu_backend ? e.describe() : "token batches " + models::format_bytes(e.batch_bytes))
            << ". Shape: --layers " << m.layers << " --hidden " << m.backbone.hidden << " --ffn " << m.backbone.ffn
            << " --experts " << m.moe.num_experts << " --expert-ffn " << m.moe.ffn << " --vocab " << m.vocab
            << " --seq " << m.backbone.seq_len << " --batch " << config.batch << " (" << variant
            << "); make it smaller, or use more ranks (--ep) or machines";
        throw UsageError(why.str());
    }
}

Args parse(int argc, const char* const* argv) {
    cxxopts::Options o("scmoe-train",
                       "scmoe-train: train the ScMoE byte-level language model (dp x ep).\n"
                       "In-process ranks: scmoe-train --ranks 4 --ep 4 ...   Processes: mpirun -np 8 "
                       "scmoe-train --ep 4 ...");
    o.set_width(110);
    // clang-format off
    add_model_shape_options(o, "tiny", "256");
    o.add_options("model")
        ("variants", "Block variants to train in turn, compared side by side (" + block_variant_list() +
                     "; default: the preset's, scmoe-pos2 or llama2-moe's every-block-pos1)",
         cxxopts::value<std::string>())
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
                            "with the rest of it (same numerics; default with --backend emu under a stack whose "
                            "grad_reduce is after_backward, e.g. paper)")
        ("grad-overlap", "Overlap the gradient all-reduce with the backward even where the --stack would not "
                         "(the default without --backend emu)")
        ("grad-reduce-dtype", "What gradients travel in through the data-parallel all-reduce: f32 (exact sums) or "
                              "bf16 (half the bytes; each rank's gradient and the sum rounded to bf16). Default: f32, "
                              "or with --backend emu the --stack's (paper: bf16, the bytes of fairseq's fp16 "
                              "gradients)", cxxopts::value<std::string>())
        ("no-calibrate", "Keep every expert FFN at its earliest slot instead of Eq. 11's")
        ("chunks", "Pieces of the chunked all-to-all / expert-FFN pipeline: auto (chosen per branch from the "
                   "calibrated times) or N (1 = off, at most the local experts; with one expert per rank up to 4 "
                   "slices of its rows, as Tutel's a2a_ffn_overlap_degree)",
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
        ("routing", "emu: how the emulated router picks experts: balanced, zipf:S or counts:c0,c1,...",
         cxxopts::value<std::string>()->default_value("balanced"))
        ("stack", "emu: the software stack around the kernels: scmoe (default), paper (fairseq + Tutel on "
                  "PyTorch), paper-swin (Swin-MoE + Tutel under amp) or a stack JSON (docs/emu.md)", cxxopts::value<std::string>())
        ("device", "GPU index (default: the local rank from OMPI_COMM_WORLD_LOCAL_RANK / SLURM_LOCALID / LOCAL_RANK)",
         cxxopts::value<int>())
        ("link", "Emulated link under the expert-parallel all-to-all: pcie4, nvlink4, ib-ndr, 100gbe or "
                 "gbps=X,latency_us=Y (X in GB/s, gigabytes per second, per direction; Y in us)",
         cxxopts::value<std::string>())
        ("link-all", "Put the emulated link under every collective, the gradient all-reduce too (default: only the "
                     "expert-parallel all-to-all)");
    add_cluster_options(o, "parallel");
    o.add_options("output")
        ("metrics", "JSON lines, one per step: step, loss, lr, tokens_per_s, step_ms, exposed_comm_pct, "
                    "dropped_tokens, ...", cxxopts::value<std::string>())
        ("log-every", "Progress line every N steps (default: steps / 20)", cxxopts::value<std::int64_t>())
        ("trace", "Chrome/Perfetto trace of the last step, FILE.rank<r>.json per rank (FILE.<variant>.rank<r>.json with several --variants)", cxxopts::value<std::string>())
        ("checkpoint-dir", "Checkpoint root directory", cxxopts::value<std::string>())
        ("checkpoint-every", "Save every N steps (0: only at the end)", cxxopts::value<std::int64_t>()->default_value("0"))
        ("keep", "Checkpoints to keep (0: every one)", cxxopts::value<int>()->default_value("2"))
        ("resume", "Resume from a checkpoint root (its 'latest') or step directory; 'auto': --checkpoint-dir "
                   "if it holds one", cxxopts::value<std::string>())
        ("stop-at", "Stop after this step (as if interrupted; the schedule still spans --steps)",
         cxxopts::value<std::int64_t>()->default_value("0"))
        ("allow-change", "Settings a resume may change on purpose, comma separated (lr, min-lr, warmup, steps, "
                         "weight-decay, beta1, beta2, eps, clip, batch, data); any other difference from the "
                         "checkpoint is refused", cxxopts::value<std::string>())
        ("overwrite", "Let a fresh run (no checkpoint resumed) delete the checkpoints already in --checkpoint-dir "
                      "(without it such a run is refused)")
        ("peak-tflops", "Peak dense TFLOP/s of one device, for the MFU in the summary (e.g. 989 for H100 SXM bf16)",
         cxxopts::value<double>()->default_value("0"))
        ("stop-signals", "Signals that stop the run cleanly, comma separated (SIGTERM, SIGINT, SIGHUP, SIGQUIT, "
                         "SIGUSR1, SIGUSR2, SIGXCPU; 'none'): every rank finishes the current step, the run saves "
                         "a checkpoint (with --checkpoint-dir) and exits with status 4, naming the signal; a second "
                         "one exits at once, keeping the last complete checkpoint",
         cxxopts::value<std::string>()->default_value(kDefaultStopSignals))
        ("quiet", "Only the summary")
        ("h,help", "Print this help");
    // clang-format on
    cxxopts::ParseResult r;
    try {
        r = o.parse(argc, argv);
    } catch (const cxxopts::exceptions::incorrect_argument_type& e) {
        throw UsageError(unparsable_value_error(argc, argv, e.what()));
    } catch (const cxxopts::exceptions::exception& e) {
        throw UsageError(e.what());
    }
    if (r.count("help")) {
        std::cout
            << o.help(help_groups(o)) << "\nExamples:\n"
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
        a.variants = r.count("variants") ? split_comma_list(r["variants"].as<std::string>())
                                         : std::vector<std::string>{m.variant};
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
    if (r.count("data")) {
        t.data = split_comma_list(r["data"].as<std::string>());
        if (t.data.empty())
            throw UsageError("--data '" + r["data"].as<std::string>() +
                             "': no file names (expected one or more files, comma separated; leave --data out for "
                             "the default corpus)");
    }
    t.overlap = !r.count("no-overlap");
    t.overlap_grad_reduce = !r.count("no-grad-overlap");
    t.calibrate = !r.count("no-calibrate");
    if (t.steps <= 0) throw UsageError("--steps must be > 0");
    if (t.batch <= 0) throw UsageError("--batch must be > 0");
    if (t.adamw.schedule.warmup_steps < 0) throw UsageError("--warmup must be >= 0");
    if (r.count("eval-data")) t.eval_data = split_comma_list(r["eval-data"].as<std::string>());
    for (const char* flag : {"eval-every", "eval-batches", "eval-only"})
        if (r.count(flag) && t.eval_data.empty()) throw UsageError(std::string("--") + flag + " needs --eval-data");
    if (r.count("eval-data") && t.eval_data.empty())
        throw UsageError("--eval-data '" + r["eval-data"].as<std::string>() +
                         "': no file names (expected one or more files, comma separated, or 'default')");
    if (t.eval_data == std::vector<std::string>{models::kDefaultHeldOut} && !t.data.empty())
        throw UsageError(
            "--eval-data default is the default corpus's held-out tenth; with --data, name held-out files");
    // The files now, before any rank starts: a FIFO would block the open, and a missing file is a bad
    // command line (exit 2), not a failed run.
    for (const auto& [flag, role, files] :
         {std::tuple{"--data", "data", &t.data}, std::tuple{"--eval-data", "eval data", &t.eval_data}})
        for (const std::string& f : *files)
            if (f != models::kDefaultHeldOut)
                if (const std::string why = models::data_file_problem(f); !why.empty())
                    throw UsageError(std::string(flag) + ": " + role + " file '" + f + "' " + why +
                                     ": expected a non-empty regular file");
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
    if (a.eval_every < 0)
        throw UsageError("--eval-every " + std::to_string(a.eval_every) + ": expected 0 or more steps");
    if (t.eval_batches < 0)
        throw UsageError("--eval-batches " + std::to_string(t.eval_batches) + ": expected 0 (all) or more batches");
    a.ranks = r["ranks"].as<int>();
    if (a.ranks <= 0 || a.ranks > kMaxInProcessRanks)
        throw UsageError("--ranks " + std::to_string(a.ranks) + ": expected 1 to " +
                         std::to_string(kMaxInProcessRanks) +
                         " in-process ranks (threads of this process); for more, run one process per rank under "
                         "mpirun");
    a.mpi = launched_by_mpirun();
#if !SCMOE_WITH_MPI
    if (a.mpi) throw UsageError("launched under mpirun, but this build has no MPI");
#endif
    if (a.mpi && r.count("ranks")) throw UsageError("--ranks is for in-process ranks; under mpirun use -np");
    a.ep = r.count("ep") ? r["ep"].as<int>() : 0;
    if (r.count("ep") && a.ep <= 0)
        throw UsageError("--ep " + std::to_string(a.ep) +
                         ": expected a positive expert-parallel size dividing the world");
    {
        // The layout now, not on every rank later: ep divides the world and the experts.
        const int world = a.mpi ? launcher_world_size() : a.ranks, ep = a.ep > 0 ? a.ep : world;
        const int experts = t.model.moe.num_experts;
        const std::string ep_text = a.ep > 0 ? "--ep " + std::to_string(ep)
                                             : (a.mpi ? "the world of " + std::to_string(world) + " processes"
                                                      : "--ranks " + std::to_string(world)) +
                                                   " (the expert-parallel size without --ep)";
        if (world > 0 && world % ep != 0)
            throw UsageError(ep_text + ": the world of " + std::to_string(world) +
                             " ranks is not divisible by the expert-parallel size");
        if (experts % ep != 0)
            throw UsageError(ep_text + ": does not divide the " + std::to_string(experts) +
                             " experts (--experts); expected an ep dividing both the world and the experts");
    }
    a.backend = r["backend"].as<std::string>();
    if (a.backend != "auto" && a.backend != "cpu" && a.backend != "cuda" && a.backend != "emu")
        throw UsageError("--backend " + a.backend + ": expected auto, cpu, cuda or emu");
    ClusterFlags cluster;
    try {
        cluster = read_cluster_options(r);
    } catch (const Error& e) {
        throw UsageError(e.what());
    }
    if (a.backend != "emu" && (r.count("gpu") || any_cluster_option(r) || r["routing"].count() || r.count("stack")))
        throw UsageError("--gpu, --routing, --stack and the cluster flags (--cluster, --nodes, --gpus-per-node, "
                         "--fabric, --gpu-link-gbyte-s, --nic-gbit-s) describe emulated GPUs: they need --backend emu");
    if (a.backend == "emu") {
        if (a.mpi) throw UsageError("--backend emu runs its ranks in-process (--ranks N), not under mpirun");
        try {
            a.emu = resolve_emu_choice(r.count("gpu") ? r["gpu"].as<std::string>() : "",
                                       r["routing"].as<std::string>(), cluster, a.ranks);
            if (r.count("stack")) a.emu.stack = r["stack"].as<std::string>();
            // checked here: a bad stack is a usage error; its gradient all-reduce is the default
            apply_grad_reduce(load_stack(a.emu.stack), t);
        } catch (const Error& e) {
            throw UsageError(e.what());
        }
    }
    if (r.count("grad-overlap") && r.count("no-grad-overlap"))
        throw UsageError("--grad-overlap and --no-grad-overlap contradict each other: give one");
    if (r.count("grad-overlap")) t.overlap_grad_reduce = true;
    if (r.count("no-grad-overlap")) t.overlap_grad_reduce = false;
    if (r.count("grad-reduce-dtype")) {
        const std::string w = r["grad-reduce-dtype"].as<std::string>();
        if (w != "f32" && w != "bf16") throw UsageError("--grad-reduce-dtype " + w + ": expected f32 or bf16");
        t.grad_reduce_dtype = w == "f32" ? DType::kF32 : DType::kBF16;
    }
    if (r.count("device")) a.device = r["device"].as<int>();
    if (a.device && *a.device < 0)
        throw UsageError("--device " + std::to_string(*a.device) + ": expected a GPU index >= 0");
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
    try {
        a.stop_signals = parse_stop_signals(r["stop-signals"].as<std::string>());
    } catch (const std::invalid_argument& e) {
        throw UsageError(e.what());
    }
    a.peak_tflops = r["peak-tflops"].as<double>();
    for (const auto& [flag, value, least] :
         {std::tuple{"--checkpoint-every", a.checkpoint_every, 0}, std::tuple{"--stop-at", a.stop_at, 0},
          std::tuple{"--log-every", a.log_every, 1}, std::tuple{"--keep", std::int64_t{a.keep}, 0}})
        if (value < least)
            throw UsageError(std::string(flag) + " " + std::to_string(value) + ": expected " +
                             (least == 0 ? "0 or more" : "1 or more") +
                             (std::string(flag) == "--keep" ? " (0 keeps every checkpoint)" : ""));
    for (const auto& [flag, value, least] :
         {std::tuple{"--lr", double{t.adamw.schedule.peak_lr}, 0.0},
          std::tuple{"--min-lr", double{r["min-lr"].as<float>()}, 0.0},
          std::tuple{"--weight-decay", double{t.adamw.weight_decay}, 0.0},
          std::tuple{"--peak-tflops", a.peak_tflops, 0.0},
          std::tuple{"--clip", double{t.max_grad_norm}, -std::numeric_limits<double>::infinity()}})
        if (!std::isfinite(value) || value < least)
            throw UsageError(std::string(flag) + " " + (std::ostringstream() << value).str() +
                             ": expected a finite number" + (least == 0.0 ? " >= 0" : ""));
    if ((a.checkpoint_every > 0 || a.stop_at > 0) && a.checkpoint_dir.empty() && a.checkpoint_every > 0)
        throw UsageError("--checkpoint-every needs --checkpoint-dir");
    if (a.resume == "auto" && a.checkpoint_dir.empty()) throw UsageError("--resume auto needs --checkpoint-dir");
    a.overwrite = r.count("overwrite") > 0;
    if (a.overwrite && a.checkpoint_dir.empty()) throw UsageError("--overwrite needs --checkpoint-dir");
    if (r.count("allow-change")) {
        a.allow_change = split_comma_list(r["allow-change"].as<std::string>());
        const auto& names = models::checkpoint_setting_names();
        for (const std::string& n : a.allow_change)
            if (std::find(names.begin(), names.end(), n) == names.end())
                throw UsageError("--allow-change " + n + ": not a setting a checkpoint records (" +
                                 r["allow-change"].as<std::string>() +
                                 "); expected lr, min-lr, warmup, steps, "
                                 "weight-decay, beta1, beta2, eps, clip, batch or data");
        if (a.allow_change.empty()) throw UsageError("--allow-change is empty");
        if (a.resume.empty()) throw UsageError("--allow-change needs --resume");
    }
    if (a.variants.size() > 1 && (!a.checkpoint_dir.empty() || !a.resume.empty()))
        throw UsageError("checkpoints are per run: give one variant with --checkpoint-dir / --resume");
    return a;
}

}  // namespace scmoe::launch
