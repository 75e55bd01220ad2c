#include "common.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <iomanip>
#include <sstream>

#include "scmoe/kernels/elementwise.h"
#include "launch/emu_choice.h"
#include "launch/emu_stack.h"
#include "scmoe/kernels/error.h"

namespace scmoe::bench {

void add_common_options(cxxopts::Options& options) {
    // clang-format off
    options.add_options("common")
        ("h,help", "Print this help and exit")
        ("backend", "Device backend: auto (CUDA when a GPU answers, else CPU), cpu, cuda or emu (an emulated GPU: "
                    "modeled times, nothing computed)",
         cxxopts::value<std::string>()->default_value("auto"))
        ("gpu", "emu: the emulated GPU, a30, a800, h100, h200 (default h100) or a profile JSON (docs/emu.md)",
         cxxopts::value<std::string>())
        ("routing", "emu: how the emulated router picks experts: balanced, zipf:S or counts:c0,c1,...",
         cxxopts::value<std::string>()->default_value("balanced"))
        ("stack", "emu: the software stack around the kernels: scmoe (default), paper (fairseq + Tutel on "
                  "PyTorch), paper-swin (Swin-MoE + Tutel under amp) or a stack JSON (docs/emu.md)", cxxopts::value<std::string>())
        ("n,iters", "Timed iterations (default: " + std::to_string(kDefaultItersCuda) + " on cuda, " +
                    std::to_string(kDefaultItersCpu) + " on cpu)", cxxopts::value<int>())
        ("w,warmup", "Untimed warmup iterations before the timed loop", cxxopts::value<int>()->default_value("2"))
        ("c,check", "Check results after the timed loop: 0 or 1", cxxopts::value<int>()->default_value("1"))
        ("J,json", "Also write the results as JSON to this file", cxxopts::value<std::string>());
    // clang-format on
}

namespace {

// nccl-tests' short flags (NVIDIA/nccl-tests src/common.cu, longopts) that scmoe-bench does not have:
// the letter, nccl-tests' long name and meaning, and what to use here instead (empty: nothing).
struct NcclTestsOnlyFlag {
    const char* letter;
    const char* nccl_name;
    const char* meaning;
    const char* instead;
};

constexpr NcclTestsOnlyFlag kNcclTestsOnlyFlags[] = {
    {"t", "nthreads", "threads per process",
     "scmoe-bench runs one rank per thread: --ranks N (a2a, block), --ep N (layer) or mpirun; token counts are "
     "-s/--tokens or the -b/-e/-f sweep"},
    {"g", "ngpus", "GPUs per thread", "every rank drives one device"},
    {"i", "stepbytes", "a linear size step", "sweeps here are geometric: -f"},
    {"m", "agg_iters", "operations aggregated per iteration", ""},
    {"N", "run_cycles", "repeats of the whole run", ""},
    {"p", "parallel_init", "initialising the threads in parallel", "the providers are --provider"},
    {"o", "op", "the reduction operation", "no subcommand reduces"},
    {"d", "datatype", "the element type", "--dtype where a subcommand has a choice (gemm, attention)"},
    {"r", "root", "the root rank", ""},
    {"z", "blocking", "blocking collectives", ""},
    {"y", "stream_null", "the NULL stream", ""},
    {"T", "timeout", "a timeout in seconds", "the SCMOE_COMM_TIMEOUT_S environment variable"},
    {"G", "cudagraph", "CUDA graph launches", ""},
    {"C", "report_cputime", "CPU time instead of GPU time", ""},
    {"S", "report_timestamps", "timestamps in the report", ""},
    {"a", "average", "whose time a row reports", "rows report the slowest rank's time (nccl-tests -a 3)"},
    {"R", "local_register", "buffer registration", ""},
    {"x", "cta_policy", "NCCL's CTA policy", ""},
    {"D", "device_implementation", "a device-side implementation", ""},
    {"V", "device_cta_count", "the device implementation's CTA count", ""},
    {"M", "memory", "a memory usage report", ""},
    {"u", "unalign", "misaligned buffers", ""},
    {"I", "per_iter_timing", "per-iteration timing", ""},
    {"K", "per_iter_skip", "samples left out of -I's statistics", ""},
};

// A guard's own long name: read_common_options asks for it, as asking for the letter would find a
// subcommand's own option of that letter.
std::string guard_name(const NcclTestsOnlyFlag& f) { return std::string("nccl-tests-") + f.nccl_name; }

}  // namespace

void add_nccl_tests_guards(cxxopts::Options& options) {
    for (const NcclTestsOnlyFlag& f : kNcclTestsOnlyFlags) {
        try {
            options.add_options("nccl-tests")(std::string(f.letter) + "," + guard_name(f),
                                              std::string("nccl-tests' --") + f.nccl_name,
                                              cxxopts::value<std::string>());
        } catch (const cxxopts::exceptions::option_already_exists&) {
            // The subcommand has this letter with nccl-tests' meaning (-d: --dtype); cxxopts adds the
            // short name first, so nothing of the guard was added.
        }
    }
}

CommonArgs read_common_options(const cxxopts::ParseResult& result) {
    for (const NcclTestsOnlyFlag& f : kNcclTestsOnlyFlags) {
        if (!result.count(guard_name(f))) continue;
        const std::string instead = *f.instead ? std::string("; ") + f.instead : std::string();
        throw UsageError(std::string("-") + f.letter + " is nccl-tests' --" + f.nccl_name + " (" + f.meaning +
                         "), which scmoe-bench does not have" + instead);
    }
    CommonArgs a;
    a.backend = result["backend"].as<std::string>();
    if (a.backend != "auto" && a.backend != "cpu" && a.backend != "cuda" && a.backend != "emu")
        throw UsageError("--backend " + a.backend + ": expected auto, cpu, cuda or emu");
    if (result.count("gpu")) a.gpu = result["gpu"].as<std::string>();
    a.routing = result["routing"].as<std::string>();
    if (result.count("stack")) a.stack = result["stack"].as<std::string>();
    if (a.backend != "emu" && (!a.gpu.empty() || result["routing"].count() || result.count("stack")))
        throw UsageError("--gpu, --routing and --stack describe an emulated GPU: they need --backend emu");
    if (a.backend == "emu") {
        try {
            launch::resolve_emu_device(a.gpu, a.routing);
            launch::load_stack(a.stack);
        } catch (const Error& e) {
            throw UsageError(e.what());
        }
    }
    if (result.count("iters")) {
        a.iters = result["iters"].as<int>();
        if (a.iters < 1) throw UsageError("--iters " + std::to_string(a.iters) + ": must be >= 1");
    }
    a.warmup = result["warmup"].as<int>();
    if (a.warmup < 0) throw UsageError("--warmup " + std::to_string(a.warmup) + ": must be >= 0");
    const int check = result["check"].as<int>();
    if (check != 0 && check != 1) throw UsageError("--check " + std::to_string(check) + ": expected 0 or 1");
    a.check = check == 1 && a.backend != "emu";
    if (result.count("json")) a.json_path = result["json"].as<std::string>();
    return a;
}

void resolve_iters(CommonArgs& args, Backend backend) {
    if (args.iters == 0)
        args.iters = backend == Backend::kCuda ? kDefaultItersCuda
                     : backend == Backend::kEmu ? kDefaultItersEmu
                                                : kDefaultItersCpu;
}

std::unique_ptr<Device> make_bench_device(const CommonArgs& args) {
    if (args.backend != "emu") return make_device(args.backend);
    launch::EmuChoice choice = launch::resolve_emu_device(args.gpu, args.routing);
    choice.stack = args.stack;
    return launch::make_emu_device(choice);
}

nlohmann::ordered_json common_args_json(const CommonArgs& args) {
    nlohmann::ordered_json j;
    j["backend"] = args.backend;
    if (args.backend == "emu") {
        j["gpu"] = args.gpu.empty() ? "h100" : args.gpu;
        j["routing"] = args.routing;
        if (args.stack != "scmoe") j["stack"] = args.stack;
    }
    j["iters"] = args.iters;
    j["warmup"] = args.warmup;
    j["check"] = args.check ? 1 : 0;
    j["json"] = args.json_path;
    return j;
}

std::int64_t parse_size(const std::string& text, const char* flag) {
    std::size_t pos = 0;
    long long value = 0;
    try {
        value = std::stoll(text, &pos);
    } catch (const std::exception&) {
        throw UsageError(std::string(flag) + " '" + text + "': expected a size such as 4096, 4K or 1M");
    }
    std::int64_t scale = 1;
    if (pos + 1 == text.size()) {
        switch (std::toupper(static_cast<unsigned char>(text[pos]))) {
            case 'K':
                scale = 1024;
                break;
            case 'M':
                scale = 1024 * 1024;
                break;
            case 'G':
                scale = 1024 * 1024 * 1024;
                break;
            default:
                pos = 0;
        }
        if (pos != 0) ++pos;
    }
    if (pos != text.size() || value <= 0)
        throw UsageError(std::string(flag) + " '" + text + "': expected a positive size such as 4096, 4K or 1M");
    return static_cast<std::int64_t>(value) * scale;
}

std::vector<std::string> split_list(const std::string& text) {
    std::vector<std::string> items;
    std::size_t start = 0;
    while (start <= text.size()) {
        std::size_t end = text.find(',', start);
        if (end == std::string::npos) end = text.size();
        if (end > start) items.push_back(text.substr(start, end - start));
        start = end + 1;
    }
    return items;
}

std::vector<std::int64_t> parse_size_list(const std::string& text, const char* flag) {
    std::vector<std::int64_t> sizes;
    for (const std::string& item : split_list(text)) sizes.push_back(parse_size(item, flag));
    if (sizes.empty()) throw UsageError(std::string(flag) + ": empty list");
    return sizes;
}

std::vector<std::int64_t> size_sweep(std::int64_t begin, std::int64_t end, std::int64_t factor) {
    if (end < begin)
        throw UsageError("-e " + std::to_string(end) + " is below -b " + std::to_string(begin) +
                         ": the sweep's last size must be >= its first");
    if (factor < 2) throw UsageError("-f " + std::to_string(factor) + ": the sweep's factor must be >= 2");
    std::vector<std::int64_t> sizes{begin};
    while (sizes.back() <= end / factor) sizes.push_back(sizes.back() * factor);
    return sizes;
}

void add_token_options(cxxopts::Options& options, const std::string& group, const std::string& default_tokens,
                       const std::string& what) {
    // clang-format off
    options.add_options(group)
        ("s,tokens", what + ": a comma list, K/M suffixes allowed (e.g. 1K,4K)",
         cxxopts::value<std::string>()->default_value(default_tokens))
        ("b,min-tokens", "Sweep instead of --tokens: first token count", cxxopts::value<std::string>())
        ("e,max-tokens", "Sweep: last token count (default: --min-tokens)", cxxopts::value<std::string>())
        ("f,step-factor", "Sweep: multiplication factor between token counts",
         cxxopts::value<std::int64_t>()->default_value("2"));
    // clang-format on
}

std::vector<std::int64_t> read_token_options(const cxxopts::ParseResult& result) {
    if (!result.count("min-tokens")) {
        if (result.count("max-tokens")) throw UsageError("-e/--max-tokens needs -b/--min-tokens");
        return parse_size_list(result["tokens"].as<std::string>(), "--tokens");
    }
    if (result.count("tokens")) throw UsageError("give either --tokens or the -b/-e/-f sweep, not both");
    const std::int64_t begin = parse_size(result["min-tokens"].as<std::string>(), "--min-tokens");
    const std::int64_t end =
        result.count("max-tokens") ? parse_size(result["max-tokens"].as<std::string>(), "--max-tokens") : begin;
    return size_sweep(begin, end, result["step-factor"].as<std::int64_t>());
}

void reject_unmatched(const cxxopts::ParseResult& result) {
    if (!result.unmatched().empty()) throw UsageError("unexpected argument '" + result.unmatched().front() + "'");
}

void fill_uniform(float* dst, std::int64_t n, float scale, std::uint64_t seed) {
    std::uint64_t state = seed;
    for (std::int64_t i = 0; i < n; ++i) {
        std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        // 24 random bits -> [0, 1) exactly representable in f32, then [-1, 1).
        const float unit = static_cast<float>(z >> 40) * (1.0f / 16777216.0f);
        dst[i] = (2.0f * unit - 1.0f) * scale;
    }
}

void upload_uniform(Device& device, Stream& stream, void* dst, DType dtype, std::int64_t n, float scale,
                    std::uint64_t seed) {
    if (n == 0 || device.backend() == Backend::kEmu) return;  // an emulated GPU holds no payload
    const std::size_t f32_bytes = static_cast<std::size_t>(n) * sizeof(float);
    auto* staging = static_cast<float*>(device.allocate_host(f32_bytes));
    fill_uniform(staging, n, scale, seed);
    if (dtype == DType::kF32) {
        stream.copy(dst, staging, f32_bytes);
    } else {
        DeviceBuffer f32(device, f32_bytes);
        stream.copy(f32.data(), staging, f32_bytes);
        convert(f32.data(), DType::kF32, dst, dtype, n, stream);
        stream.synchronize();
    }
    stream.synchronize();
    device.deallocate_host(staging);
}

std::vector<std::uint8_t> download_bytes(Stream& stream, const void* src, std::size_t bytes) {
    std::vector<std::uint8_t> host(bytes);
    if (bytes) stream.copy(host.data(), src, bytes);
    stream.synchronize();
    return host;
}

std::vector<float> download_f32(Stream& stream, const void* src, DType dtype, std::int64_t n) {
    const std::vector<std::uint8_t> raw = download_bytes(stream, src, static_cast<std::size_t>(n) * dtype_size(dtype));
    std::vector<float> out(static_cast<std::size_t>(n));
    if (dtype == DType::kF32) {
        std::memcpy(out.data(), raw.data(), raw.size());
    } else if (dtype == DType::kBF16) {
        for (std::size_t i = 0; i < out.size(); ++i) {
            std::uint16_t half;
            std::memcpy(&half, raw.data() + 2 * i, 2);
            const std::uint32_t bits = static_cast<std::uint32_t>(half) << 16;
            std::memcpy(&out[i], &bits, 4);
        }
    } else {
        throw std::invalid_argument("download_f32: only f32 and bf16 tensors");
    }
    return out;
}

std::int64_t count_nonfinite_elements(Device& device, Stream& stream, const void* x, DType dtype, std::int64_t n) {
    if (n == 0) return 0;
    DeviceBuffer result(device, 2 * sizeof(std::int64_t));
    count_nonfinite(x, n, dtype, result.as<std::int64_t>(), result.as<std::int64_t>() + 1, stream);
    std::int64_t host[2] = {0, 0};
    stream.copy(host, result.data(), sizeof(host));
    stream.synchronize();
    return host[0];
}

double time_us(Device& device, Stream& stream, int warmup, int iters, const std::function<void()>& enqueue) {
    for (int i = 0; i < warmup; ++i) enqueue();
    auto start = device.create_event();
    auto stop = device.create_event();
    start->record(stream);
    for (int i = 0; i < iters; ++i) enqueue();
    stop->record(stream);
    stop->synchronize();
    stream.synchronize();  // surfaces an error raised by the timed work
    return 1000.0 * static_cast<double>(stop->elapsed_ms_since(*start)) / iters;
}

DType resolve_dtype(const std::string& name, const Device& device) {
    if (name == "auto") return device.compute_dtype();
    if (name == "f32" || name == "float") return DType::kF32;
    if (name == "bf16" || name == "bfloat16") {
        if (device.backend() == Backend::kCpu) throw UsageError("--dtype bf16: the cpu backend computes in f32 only");
        return DType::kBF16;
    }
    throw UsageError("--dtype " + name + ": expected auto, f32 (float) or bf16 (bfloat16)");
}

std::int64_t count_wrong(const std::vector<float>& got, const std::vector<float>& ref, double tol, double abs_floor) {
    double sum_sq = 0.0;
    for (float r : ref) sum_sq += static_cast<double>(r) * r;
    const double rms = ref.empty() ? 0.0 : std::sqrt(sum_sq / static_cast<double>(ref.size()));
    std::int64_t wrong = 0;
    for (std::size_t i = 0; i < ref.size(); ++i) {
        const double r = ref[i];
        const double diff = std::fabs(static_cast<double>(got[i]) - r);
        if (!(diff <= std::max(tol * std::max(std::fabs(r), rms), abs_floor))) ++wrong;
    }
    return wrong;
}

ErrorStats error_stats(const std::vector<float>& got, const std::vector<float>& ref) {
    ErrorStats e;
    double sum_sq_ref = 0, sum_sq_diff = 0;
    for (std::size_t i = 0; i < ref.size(); ++i) {
        const double r = ref[i], d = std::fabs(static_cast<double>(got[i]) - r);
        sum_sq_ref += r * r;
        sum_sq_diff += d * d;
        e.max_ref = std::max(e.max_ref, std::fabs(r));
        if (!(d <= e.max_diff)) {  // NaN counts as the worst
            e.max_diff = d;
            e.worst = i;
        }
    }
    if (!ref.empty()) {
        e.rms_ref = std::sqrt(sum_sq_ref / static_cast<double>(ref.size()));
        e.rel_l2 = sum_sq_ref > 0 ? std::sqrt(sum_sq_diff / sum_sq_ref) : 0.0;
        e.worst_got = got[e.worst];
        e.worst_ref = ref[e.worst];
    }
    return e;
}

std::string describe_error(const ErrorStats& e) {
    std::ostringstream os;
    os << std::setprecision(3) << "max|diff| " << e.max_diff << " at " << e.worst << " (got " << e.worst_got << ", ref "
       << e.worst_ref << ") = " << (e.max_ref > 0 ? 100.0 * e.max_diff / e.max_ref : 0.0) << "% of max|ref| "
       << e.max_ref << ", " << (e.rms_ref > 0 ? 100.0 * e.max_diff / e.rms_ref : 0.0) << "% of rms(ref) " << e.rms_ref
       << "; rel L2 " << 100.0 * e.rel_l2 << "%";
    return os.str();
}

}  // namespace scmoe::bench
