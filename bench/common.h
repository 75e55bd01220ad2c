// What every scmoe-bench subcommand shares: the common flags (--backend -n -w -c -J), size lists,
// deterministic inputs, event timing and host read-back for the checks.
#pragma once

#include <cstdint>
#include <cxxopts.hpp>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "scmoe/kernels/device.h"
#include "scmoe/kernels/dtype.h"

namespace scmoe::bench {

// Exit codes: 0 all rows correct, 1 some element wrong, 2 bad command line, 3 runtime error.
inline constexpr int kExitOk = 0;
inline constexpr int kExitWrong = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitError = 3;

// Thrown for a bad command line (unknown value, impossible combination): exit kExitUsage.
struct UsageError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

struct CommonArgs {
    std::string backend = "auto";  // auto | cpu | cuda | emu
    std::string gpu;               // emu: the emulated GPU (a30, a800, h100, h200; default h100)
    std::string routing = "balanced";  // emu: the synthetic router's model (scmoe/kernels/emu/routing.h)
    std::string stack = "scmoe";   // emu: the software stack (launch/emu_stack.h)
    int iters = 0;                 // timed iterations; 0 until resolved for the backend
    int warmup = 2;                // untimed iterations before the timed loop
    bool check = true;             // correctness check after the timed loop
    std::string json_path;         // -J: JSON report file, empty = none
};

inline constexpr int kDefaultItersCuda = 20;
inline constexpr int kDefaultItersCpu = 5;
inline constexpr int kDefaultItersEmu = 3;  // emulated time is deterministic: a few steps show it

// Adds -h --backend --gpu --routing --stack -n -w -c -J to `options` (group "common").
void add_common_options(cxxopts::Options& options);
// Adds, after a subcommand's own options, the nccl-tests short flags that scmoe-bench lacks (-t -g -i
// -m -N -p -o -d -r -z -y -T -G -C -S -a -R -x -D -V -M -u -I -K; any the subcommand gives a meaning
// of its own is left to it), unlisted in --help, so that read_common_options can refuse them by their
// nccl-tests meaning instead of taking them for something else.
void add_nccl_tests_guards(cxxopts::Options& options);
// Reads them back; iters stays 0 when -n was not given (resolve_iters picks the backend default).
// On emu the check is off (an emulated GPU computes nothing to check). Throws UsageError on a
// guarded nccl-tests flag, naming what it means there and what to use here.
CommonArgs read_common_options(const cxxopts::ParseResult& result);
// The device the arguments name (an emulated GPU with its routing model for emu).
std::unique_ptr<Device> make_bench_device(const CommonArgs& args);
void resolve_iters(CommonArgs& args, Backend backend);
nlohmann::ordered_json common_args_json(const CommonArgs& args);

// "4096", "4K" (= 4096), "1M"; throws UsageError naming `flag`.
std::int64_t parse_size(const std::string& text, const char* flag);
// Comma list of sizes: "1K,2K,4096".
std::vector<std::int64_t> parse_size_list(const std::string& text, const char* flag);
// Comma list of words, empty items dropped.
std::vector<std::string> split_list(const std::string& text);
// nccl-tests style sweep: begin, begin*factor, ... while <= end. Throws UsageError unless
// end >= begin and factor >= 2 (the messages name -b, -e and -f).
std::vector<std::int64_t> size_sweep(std::int64_t begin, std::int64_t end, std::int64_t factor);

// Adds the token-count flags: -s/--tokens (comma list, K/M suffixes) and the nccl-tests sweep
// -b/--min-tokens, -e/--max-tokens, -f/--step-factor (used instead of --tokens when -b is given).
// Not -t: nccl-tests' -t is its thread count (add_nccl_tests_guards refuses it).
// `what` starts the --tokens help text.
void add_token_options(cxxopts::Options& options, const std::string& group, const std::string& default_tokens,
                       const std::string& what = "Tokens per case");
std::vector<std::int64_t> read_token_options(const cxxopts::ParseResult& result);
// Throws UsageError on positional arguments nobody asked for.
void reject_unmatched(const cxxopts::ParseResult& result);

// Deterministic uniform values in [-scale, scale): splitmix64, identical on every platform.
void fill_uniform(float* dst, std::int64_t n, float scale, std::uint64_t seed);
// Fills n elements of `dtype` at `dst` (stream memory) with fill_uniform values, converted on the
// device when dtype is bf16. Synchronizes `stream`.
void upload_uniform(Device& device, Stream& stream, void* dst, DType dtype, std::int64_t n, float scale,
                    std::uint64_t seed);

// Copies `bytes` of stream memory to the host; synchronizes `stream`.
std::vector<std::uint8_t> download_bytes(Stream& stream, const void* src, std::size_t bytes);
// Copies n elements of `dtype` to the host as f32 (bf16 widened exactly); synchronizes `stream`.
std::vector<float> download_f32(Stream& stream, const void* src, DType dtype, std::int64_t n);
// NaN/Inf count of n elements in stream memory (count_nonfinite on the device); synchronizes.
std::int64_t count_nonfinite_elements(Device& device, Stream& stream, const void* x, DType dtype, std::int64_t n);

// Runs `enqueue` `warmup` times, then `iters` times between two events on `stream`; returns the mean
// microseconds per timed iteration. `enqueue` only enqueues work on `stream`.
double time_us(Device& device, Stream& stream, int warmup, int iters, const std::function<void()>& enqueue);
// TFLOP/s of `flops` done in `us` microseconds (0 for a zero time).
inline double tflops(double flops, double us) { return us > 0.0 ? flops / (us * 1e-6) / 1e12 : 0.0; }

// -d/--dtype auto | f32 | bf16 (also nccl-tests' names float and bfloat16): auto is the device's compute
// dtype; bf16 is refused on the CPU backend.
DType resolve_dtype(const std::string& name, const Device& device);
// Elements of `got` farther than max(tol * max(|ref|, rms(ref)), abs_floor) from `ref` (NaN counts
// as wrong). The rms floor keeps outputs that cancel to near zero from failing on rounding alone;
// abs_floor (default none) is for results whose elements carry the rounding of larger terms.
std::int64_t count_wrong(const std::vector<float>& got, const std::vector<float>& ref, double tol,
                         double abs_floor = 0.0);

// How far `got` is from `ref`, for the record beside a wrong-element count: the largest |got - ref|
// (and where), relative to max |ref| and to rms(ref), and ||got - ref||_2 / ||ref||_2.
struct ErrorStats {
    double max_diff = 0, max_ref = 0, rms_ref = 0, rel_l2 = 0;
    std::size_t worst = 0;  // index of the largest |got - ref|
    float worst_got = 0, worst_ref = 0;
};
ErrorStats error_stats(const std::vector<float>& got, const std::vector<float>& ref);
// "max|diff| 0.0123 at 4711 (got 1.02, ref 1.03) = 0.35% of max|ref| 3.5, 12% of rms(ref) 0.1; rel L2 0.21%"
std::string describe_error(const ErrorStats& e);

}  // namespace scmoe::bench
