// scmoe-generate: text from a trained checkpoint (scmoe/models/decoder.h, generator.h). The byte-level
// LM's tokens are bytes: a prompt's bytes go in, new bytes come out, streamed as they are chosen.
//
//   scmoe-generate --resume CKPT --prompt TEXT [--max-new-tokens N] [--seed S] [--temperature T]
//                  [--top-k K] [--experts resident|blocking|prefetch] [--expert-cache-mib N]
//                  [--backend cpu|cuda|emu|auto] [--device I] [--ranks N]
//   scmoe-generate --resume CKPT --prompts FILE ...   (a batch: one prompt per line)
//   scmoe-generate --preset NAME [--variant V] --backend emu ...   (an untrained model: the emulator
//                  computes nothing, so its predictions need no weights)
//
// --experts (scmoe/models/decoder.h): resident keeps every expert on the device; blocking and prefetch
// keep the routed experts in pinned host memory and copy the chosen ones in per pass (blocking: right
// before each expert's FFN, on the compute stream; prefetch: from the block's gate, on a copy stream,
// into an LRU cache of --expert-cache-mib). Single rank only. On CUDA the host copies are the CUDA
// device's pinned memory (Device::allocate_host: cudaMallocHost).
//
// --backend cuda (auto: cuda when a CUDA device answers, else cpu) decodes in bf16 on the GPU of
// --device I, by default the local rank (launch/local_rank.h) as scmoe-train does: in-process ranks
// share that one GPU; under mpirun each process takes its local rank's GPU. Not yet run on a GPU
// (issue 27): tests/gpu/gpu_decoder_test.cpp checks it where a GPU is present.
//
// With --ranks N (or under mpirun, one rank per process) the experts are split over N
// expert-parallel ranks, each decoding the whole batch; rank 0 prints. At the end: tokens/s, time to
// first token and the per-token latency (mean, p50, p90 of the steps). On --backend emu nothing is
// computed: the times are the emulator's predictions and the text is meaningless.
#include <algorithm>
#include <cstdio>
#include <cxxopts.hpp>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "launch/emu_choice.h"
#include "launch/local_rank.h"
#include "launch/train_comms.h"
#include "scmoe/comm/topology.h"
#include "scmoe/kernels/device.h"
#include "scmoe/kernels/error.h"
#include "scmoe/models/checkpoint.h"
#include "scmoe/kernels/emu/emu_device.h"
#include "scmoe/models/decoder.h"
#include "scmoe/models/expert_cache.h"
#include "scmoe/models/generator.h"
#include "scmoe/models/lm.h"
#include "scmoe/models/lm_config.h"
#if SCMOE_WITH_MPI
#include <mpi.h>
#endif

namespace scmoe::launch {
namespace {

constexpr int kExitError = 1, kExitUsage = 2;

struct UsageError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

struct Args {
    std::string resume, preset, variant, prompt, prompts_file, backend = "cpu", gpu = "h100", experts = "resident";
    double expert_cache_mib = 0;  // prefetch: 0 = the decoder's default
    std::string stack = "scmoe";  // --backend emu: the software stack around the kernels
    bool have_prompt = false;
    std::int64_t max_new_tokens = 64;
    models::GenerateOptions gen;
    int ranks = 1;
    std::optional<int> device;  // --device: the CUDA device index (default: the local rank)
    bool mpi = false;
};

// The bytes of a prompt as tokens, each checked against the model's vocabulary.
std::vector<std::int32_t> byte_tokens(const std::string& text, std::size_t index, std::int64_t vocab) {
    SCMOE_CHECK(!text.empty(), "prompt " << index << " is empty: the model needs at least one byte to continue");
    std::vector<std::int32_t> t;
    for (std::size_t i = 0; i < text.size(); ++i) {
        const int byte = static_cast<unsigned char>(text[i]);
        SCMOE_CHECK(byte < vocab, "prompt " << index << ", byte " << i << " is " << byte
                                            << ": outside the model's vocabulary of " << vocab
                                            << " tokens (scmoe-generate reads text as bytes, 0..255)");
        t.push_back(byte);
    }
    return t;
}

// A byte for the terminal: printable ASCII, newline and tab as they are, anything else as \xNN.
std::string show(std::int32_t token) {
    if ((token >= 32 && token < 127) || token == '\n' || token == '\t') return std::string(1, static_cast<char>(token));
    char buf[8];
    std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned>(token) & 0xffu);
    return buf;
}

std::string describe_sampling(const models::SamplingOptions& s) {
    if (s.temperature == 0.0f) return "greedy";
    std::ostringstream o;
    o << "temperature " << s.temperature;
    if (s.top_k > 0) o << ", top-k " << s.top_k;
    return o.str();
}

Args parse(int argc, char** argv) {
    cxxopts::Options o("scmoe-generate", "Text from a scmoe checkpoint (byte tokens), streamed as it is generated.");
    o.add_options()
        ("resume", "checkpoint: a step directory or a root (its latest, or its newest verified step)", cxxopts::value<std::string>())
        ("prompt", "the prompt text", cxxopts::value<std::string>())
        ("prompts", "a file of prompts, one per line: generated as one batch", cxxopts::value<std::string>())
        ("max-new-tokens", "new tokens (bytes) per prompt", cxxopts::value<std::int64_t>()->default_value("64"))
        ("seed", "sampling seed: the same seed gives the same tokens", cxxopts::value<std::uint64_t>()->default_value("0"))
        ("temperature", "0: greedy; > 0: sample from softmax(logits / T)", cxxopts::value<float>()->default_value("0"))
        ("top-k", "sample among the K most likely tokens (0: all)", cxxopts::value<std::int64_t>()->default_value("0"))
        ("preset", "--backend emu only: an untrained model of this preset (tiny, gpt2-moe-small, gpt2-moe-medium, gpt3-moe-xl, llama2-moe) instead of --resume", cxxopts::value<std::string>())
        ("variant", "with --preset: the block variant (default: the preset's)", cxxopts::value<std::string>())
        ("experts", "expert residency: resident (on the device), blocking (host memory, copied before each expert) or prefetch (host memory, copied from the gate on a copy stream into a cache)", cxxopts::value<std::string>()->default_value("resident"))
        ("expert-cache-mib", "--experts prefetch: the device cache of experts in MiB (default: 2 x min(experts, batch x top_k) + 1 experts)", cxxopts::value<double>())
        ("backend", "cpu, cuda (bf16 on a GPU; not yet run on a GPU), emu (an emulated GPU: predicted times, meaningless text) or auto (cuda when a CUDA device answers, else cpu)", cxxopts::value<std::string>()->default_value("cpu"))
        ("device", "--backend cuda: the GPU index (default: the local rank from OMPI_COMM_WORLD_LOCAL_RANK / SLURM_LOCALID / LOCAL_RANK, else 0; in-process ranks share it)", cxxopts::value<int>())
        ("gpu", "the emulated GPU of --backend emu: a30, a800, h100, h200 or a profile JSON", cxxopts::value<std::string>()->default_value("h100"))
        ("stack", "--backend emu: the software stack around the kernels: scmoe (default), paper (fairseq + Tutel on PyTorch eager), paper-swin (Swin-MoE + Tutel under amp) or a stack JSON (docs/emu.md)", cxxopts::value<std::string>()->default_value("scmoe"))
        ("ranks", "in-process expert-parallel ranks", cxxopts::value<int>()->default_value("1"))
        ("h,help", "this help");
    cxxopts::ParseResult r;
    try {
        r = o.parse(argc, argv);
    } catch (const std::exception& e) {
        throw UsageError(e.what());
    }
    if (r.count("help")) {
        std::cout << o.help() << std::endl;
        std::exit(0);
    }
    if (!r.unmatched().empty()) throw UsageError("unexpected argument '" + r.unmatched()[0] + "'");
    Args a;
    if (r.count("resume") == r.count("preset"))
        throw UsageError("give exactly one of --resume CKPT (a checkpoint scmoe-train wrote) and --preset NAME (--backend emu)");
    if (r.count("resume")) a.resume = r["resume"].as<std::string>();
    else a.preset = r["preset"].as<std::string>();
    if (r.count("variant")) {
        if (a.preset.empty()) throw UsageError("--variant goes with --preset (a checkpoint has its own)");
        a.variant = r["variant"].as<std::string>();
    }
    if (r.count("prompt") == r.count("prompts")) throw UsageError("give exactly one of --prompt TEXT and --prompts FILE");
    a.have_prompt = r.count("prompt") > 0;
    if (a.have_prompt) a.prompt = r["prompt"].as<std::string>();
    else a.prompts_file = r["prompts"].as<std::string>();
    a.max_new_tokens = r["max-new-tokens"].as<std::int64_t>();
    if (a.max_new_tokens < 1) throw UsageError("--max-new-tokens " + std::to_string(a.max_new_tokens) + ": must be >= 1");
    a.gen.max_new_tokens = a.max_new_tokens;
    a.gen.seed = r["seed"].as<std::uint64_t>();
    a.gen.sampling.temperature = r["temperature"].as<float>();
    a.gen.sampling.top_k = r["top-k"].as<std::int64_t>();
    try {
        a.gen.sampling.validate();
        const models::ExpertResidency mode = models::parse_expert_residency(r["experts"].as<std::string>());
        if (r.count("expert-cache-mib")) {
            a.expert_cache_mib = r["expert-cache-mib"].as<double>();
            SCMOE_CHECK(mode == models::ExpertResidency::kPrefetch,
                        "--expert-cache-mib " << a.expert_cache_mib << ": the expert cache is for --experts prefetch, not "
                                              << models::expert_residency_name(mode));
            SCMOE_CHECK(a.expert_cache_mib > 0, "--expert-cache-mib " << a.expert_cache_mib << ": must be > 0");
        }
    } catch (const Error& e) {
        throw UsageError(e.what());
    }
    a.experts = r["experts"].as<std::string>();
    a.backend = r["backend"].as<std::string>();
    if (a.backend != "cpu" && a.backend != "cuda" && a.backend != "emu" && a.backend != "auto")
        throw UsageError("--backend " + a.backend + ": expected cpu, cuda, emu or auto");
    if (a.backend == "auto") a.backend = cuda_device_available() ? "cuda" : "cpu";
    if (r.count("device")) {
        if (a.backend != "cuda")
            throw UsageError("--device is the GPU of --backend cuda (the backend is " + a.backend + ")");
        a.device = r["device"].as<int>();
        if (*a.device < 0) throw UsageError("--device " + std::to_string(*a.device) + ": must be >= 0");
    }
    if (!a.preset.empty() && a.backend != "emu")
        throw UsageError("--preset " + a.preset + ": an untrained model is for --backend emu (predicted times); on " +
                         a.backend + " generate from a trained checkpoint with --resume");
    a.gpu = r["gpu"].as<std::string>();
    a.stack = r["stack"].as<std::string>();
    if (a.backend != "emu" && r.count("stack")) throw UsageError("--stack is for --backend emu");
    a.ranks = r["ranks"].as<int>();
    if (a.ranks < 1) throw UsageError("--ranks " + std::to_string(a.ranks) + ": must be >= 1");
    a.mpi = launched_by_mpirun();
    if (a.mpi && a.ranks != 1) throw UsageError("--ranks is for in-process ranks; under mpirun each process is a rank");
    return a;
}

std::vector<std::string> read_prompts(const Args& a) {
    if (a.have_prompt) return {a.prompt};
    std::ifstream in(a.prompts_file, std::ios::binary);
    SCMOE_CHECK(in, "--prompts " << a.prompts_file << ": cannot open");
    std::vector<std::string> out;
    for (std::string line; std::getline(in, line);) {
        if (!line.empty() && line.back() == '\r') line.pop_back();
        out.push_back(line);
    }
    SCMOE_CHECK(!out.empty(), "--prompts " << a.prompts_file << ": no prompts (the file is empty)");
    return out;
}

// cpu; cuda on GPU `index` (make_device names why when CUDA cannot be used); or the emulated GPU.
std::unique_ptr<Device> make_generate_device(const Args& a, int index) {
    if (a.backend == "emu") {
        EmuChoice choice = resolve_emu_choice(a.gpu, "", "balanced", a.ranks);
        choice.stack = a.stack;
        return make_emu_device(choice);
    }
    return make_device(a.backend, a.backend == "cuda" ? index : 0);
}

struct Plan {
    models::CheckpointWeights checkpoint;  // --resume
    models::LmConfig config;              // the model (the checkpoint's, or --preset's)
    std::vector<std::vector<std::int32_t>> prompts;
    std::int64_t max_length = 0;
};

// Checks everything that does not need a device: the checkpoint, the prompts, the lengths.
Plan plan(const Args& a) {
    Plan p;
    if (a.preset.empty()) {
        p.checkpoint = models::open_checkpoint_weights(a.resume);
        p.config = p.checkpoint.config;
    } else {
        p.config = models::lm_preset(a.preset);
        if (!a.variant.empty()) p.config.variant = a.variant;
        p.config.validate();
    }
    const models::LmConfig& c = p.config;
    const std::vector<std::string> texts = read_prompts(a);
    for (std::size_t i = 0; i < texts.size(); ++i) {
        p.prompts.push_back(byte_tokens(texts[i], i, c.vocab));
        SCMOE_CHECK(static_cast<std::int64_t>(texts[i].size()) <= c.backbone.seq_len,
                    "prompt " << i << " is " << texts[i].size() << " bytes, longer than the model's seq_len "
                              << c.backbone.seq_len);
    }
    const int world = a.mpi ? launcher_world_size() : a.ranks;
    SCMOE_CHECK(c.moe.num_experts % world == 0, (a.mpi ? "mpirun -np " : "--ranks ")
                                                    << world << ": the model's " << c.moe.num_experts
                                                    << " experts do not split evenly over the ranks");
    p.max_length = models::generation_length(p.prompts, a.max_new_tokens);
    SCMOE_CHECK(p.max_length <= c.backbone.seq_len,
                "--max-new-tokens " << a.max_new_tokens << " after the longest prompt ("
                                    << p.max_length - a.max_new_tokens + 1 << " bytes) needs " << p.max_length
                                    << " cached positions, beyond the model's seq_len " << c.backbone.seq_len
                                    << " (its learned positions): at most "
                                    << c.backbone.seq_len - (p.max_length - a.max_new_tokens + 1) + 1
                                    << " new tokens for this prompt");
    return p;
}

// One rank's generation; rank 0 streams and reports.
void run_rank(const Args& a, const Plan& p, int rank, int world, Communicator* ep, std::unique_ptr<Device> device) {
    models::LmConfig config = p.config;
    config.backbone.dtype = config.moe.dtype = device->compute_dtype();
    SCMOE_CHECK(config.moe.num_experts % world == 0,
                "--ranks " << world << ": the model's " << config.moe.num_experts << " experts do not split evenly");
    const models::ExpertResidency mode = models::parse_expert_residency(a.experts);
    const bool offload = mode != models::ExpertResidency::kResident;
    SCMOE_CHECK(!offload || world == 1, "--experts " << a.experts << ": single rank only (" << world
                                                     << " expert-parallel ranks); use --experts resident");
    // Offloaded experts: the MoE layers' parameters in pinned host memory (the decoder copies their
    // router and shared expert to the device).
    const std::unique_ptr<Device> host_memory = offload ? models::pinned_host_memory(*device) : nullptr;
    models::LanguageModel lm(config, *device, 0, ep, nullptr, host_memory.get());  // inference only
    const bool emulated = a.backend == "emu";
    if (!emulated) models::load_checkpoint_weights(p.checkpoint, lm);  // an emulated GPU holds no payload
    models::DecoderOptions d;
    d.batch = static_cast<std::int64_t>(p.prompts.size());
    d.max_length = p.max_length;
    d.experts = mode;
    if (a.expert_cache_mib > 0) {
        const MoeConfig& moe = lm.blocks().config().moe;
        const double expert_mib = static_cast<double>((moe.hidden * moe.expert_inner_width() + moe.ffn * moe.hidden) *
                                                      static_cast<std::int64_t>(dtype_size(moe.dtype))) /
                                  (1024.0 * 1024.0);
        d.expert_cache_slots = static_cast<std::int64_t>(a.expert_cache_mib / expert_mib);
        SCMOE_CHECK(d.expert_cache_slots >= 1, "--expert-cache-mib " << a.expert_cache_mib
                                                   << ": smaller than one expert (" << expert_mib << " MiB: w1 ["
                                                   << moe.hidden << ", " << moe.expert_inner_width() << "] + w2 ["
                                                   << moe.ffn << ", " << moe.hidden << "] " << dtype_name(moe.dtype)
                                                   << ")");
    }
    models::Decoder decoder(lm, d, ep);
    decoder.set_moe_block_timing(true);
    const bool lead = rank == 0;
    const bool one = p.prompts.size() == 1;
    if (lead) {
        std::cout << "# scmoe-generate: "
                  << (a.preset.empty() ? p.checkpoint.dir + " (step " + std::to_string(p.checkpoint.state.step) + ")"
                                       : "untrained --preset " + a.preset)
                  << ", " << config.describe() << "\n# " << device->description() << ", " << world
                  << " expert-parallel rank(s), experts " << a.experts << ", "
                  << describe_sampling(a.gen.sampling)
                  << ", seed " << a.gen.seed << ", KV cache " << decoder.cache().shape().describe() << "\n";
        for (const std::string& note : p.checkpoint.notes) std::cout << "# " << note << "\n";
        std::cout << "# " << decoder.describe_experts() << "\n";
        if (emulated)
            std::cout << "# emu: nothing is computed: the times are the emulator's predictions and the text is "
                         "meaningless\n";
        if (one) {
            for (std::int32_t t : p.prompts[0]) std::cout << show(t);
        }
        std::cout << std::flush;
    }
    std::int64_t last_sequence = -1;
    const models::TokenFn stream = [&](std::int64_t b, std::int32_t t) {
        if (!lead) return;
        if (one) {
            std::cout << show(t) << std::flush;
            return;
        }
        // A batch: each step is one line, the sequences' new tokens separated by " | ".
        std::cout << (b == 0 ? (last_sequence >= 0 ? "\n" : "") : " | ") << show(t);
        last_sequence = b;
        if (b + 1 == static_cast<std::int64_t>(p.prompts.size())) std::cout << std::flush;
    };
    if (lead && !one) std::cout << "# streaming: one line per step, the prompts' new bytes separated by ' | '\n";
    const models::GenerateResult r = models::generate(decoder, p.prompts, a.gen, stream);
    if (!lead) return;
    std::cout << "\n";
    if (!one) {
        for (std::size_t b = 0; b < p.prompts.size(); ++b) {
            std::cout << "[" << b << "] ";
            for (std::int32_t t : p.prompts[b]) std::cout << show(t);
            std::cout << "|";
            for (std::int32_t t : r.tokens[b]) std::cout << show(t);
            std::cout << "\n";
        }
    }
    const models::GenerateTimes& t = r.times;
    std::cout << std::fixed << std::setprecision(2) << "# " << (emulated ? "predicted (emu): " : "") << t.tokens
              << " new tokens (" << p.prompts.size() << " prompt(s) x " << a.max_new_tokens << ") in " << t.total_s
              << " s: " << t.tokens_per_s() << " tokens/s; time to first token " << t.first_token_s * 1e3
              << " ms; per-token latency (a step, one token per prompt) mean " << t.step_mean() * 1e3 << " ms, p50 "
              << t.step_quantile(0.5) * 1e3 << " ms, p90 " << t.step_quantile(0.9) * 1e3 << " ms over "
              << t.step_s.size() << " steps" << std::defaultfloat << std::endl;
    const models::BlockTimes& mb = decoder.moe_block_times();
    std::cout << std::fixed << std::setprecision(3) << "# " << (emulated ? "predicted (emu): " : "");
    if (mb.count == 0)  // a model without MoE blocks (variant dense): no latency to report
        std::cout << "MoE block latency: none (the model has no MoE block)";
    else
        std::cout << "MoE block latency (its attention, experts and combine; decode steps) mean " << mb.mean_ms()
                  << " ms over " << mb.count << " block passes";
    if (models::ExpertCache* cache = decoder.expert_cache()) {
        const models::ExpertCacheStats& st = cache->stats();
        std::cout << "; expert copies " << st.copies << " (" << static_cast<double>(st.bytes_copied) / (1024.0 * 1024.0)
                  << " MiB), cache hits " << st.hits << ", copies at the FFN " << st.late;
    }
    std::cout << std::defaultfloat << "\n";
    if (emulated) {
        const emu::MemoryStats m = emu::as_emu(decoder.device()).memory();
        std::cout << std::fixed << std::setprecision(1) << "# device memory (emu): peak "
                  << static_cast<double>(m.peak) / (1024.0 * 1024.0) << " MiB of "
                  << static_cast<double>(m.capacity) / (1024.0 * 1024.0) << " MiB" << std::defaultfloat << std::endl;
    }
}

int run_in_process(const Args& a, const Plan& p) {
    // In-process ranks share one GPU on cuda (as scmoe-train's do): --device, else the local rank.
    const int gpu = a.backend == "cuda" ? local_rank(a.device).value : 0;
    if (a.ranks == 1) {
        run_rank(a, p, 0, 1, nullptr, make_generate_device(a, gpu));
        return 0;
    }
    std::unique_ptr<LocalTrainGroups> groups =
        a.backend == "emu" ? std::make_unique<LocalTrainGroups>(a.ranks, a.ranks, cluster_topology(resolve_emu_choice(a.gpu, "", "balanced", a.ranks).cluster))
                           : std::make_unique<LocalTrainGroups>(a.ranks, a.ranks, std::nullopt);
    run_local_ranks(*groups, a.ranks, [&](int r, const RankComms& comms) {
        try {
            run_rank(a, p, r, a.ranks, comms.comms().ep, make_generate_device(a, gpu));
        } catch (const std::exception& e) {
            groups->abandon(r, e.what());
            throw;
        }
    });
    return 0;
}

#if SCMOE_WITH_MPI
int run_mpi(const Args& a, const Plan& p) {
    init_mpi_multiple();
    int rank = 0, world = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    try {
        SCMOE_CHECK(a.backend != "emu", "under mpirun --backend emu is not supported: the emulated ranks are "
                                        "in-process (use --ranks N)");
        const models::ParallelLayout layout{world, rank, world};
        layout.validate();
        // One GPU per process on cuda: --device, else the local rank (as scmoe-train).
        const LocalRank local = local_rank(a.device);
        std::unique_ptr<Device> device = make_generate_device(a, local.value);
        RankComms comms = mpi_rank_comms(layout, *device, a.backend == "cuda" ? local.value : 0, std::nullopt);
        run_rank(a, p, rank, world, comms.comms().ep, std::move(device));
    } catch (const std::exception& e) {
        // One write(): mpirun interleaves the ranks' stderr chunk by chunk (launch/mpirun.sh reads the line).
        std::cerr << ("scmoe-generate: rank " + std::to_string(rank) + ": " + e.what() + "\n") << std::flush;
        MPI_Abort(MPI_COMM_WORLD, kExitError);
        std::_Exit(kExitError);
    }
    MPI_Finalize();
    return 0;
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
        std::cerr << "scmoe-generate: " << e.what() << "\n(scmoe-generate --help lists the options)" << std::endl;
        return kExitUsage;
    }
    try {
        const Plan p = plan(args);
        if (args.mpi) {
#if SCMOE_WITH_MPI
            return run_mpi(args, p);
#else
            SCMOE_FAIL("launched by mpirun, but this build has no MPI (SCMOE_WITH_MPI=OFF): use --ranks N");
#endif
        }
        return run_in_process(args, p);
    } catch (const std::exception& e) {
        // One write(): under mpirun every process may report, and mpirun splices stderr chunk by chunk.
        std::cerr << (std::string("scmoe-generate: ") + e.what() + "\n") << std::flush;
        return kExitError;
    }
}
