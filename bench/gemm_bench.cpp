// scmoe-bench gemm: the experts' first GEMM as one grouped GEMM over skewed expert loads, against
// one dense GEMM of the same FLOPs. ratio = dense time / grouped time (1.0 = grouped as fast).
#include <algorithm>
#include <cmath>
#include <iomanip>
#include <iostream>
#include <memory>
#include <sstream>

#include "benches.h"
#include "common.h"
#include "scmoe/kernels/gemm.h"
#include "scmoe/kernels/grouped_gemm.h"
#include "loads.h"
#include "report.h"

namespace scmoe::bench {
namespace {

struct GemmBenchArgs {
    std::vector<std::int64_t> tokens;
    std::int64_t hidden = 0, ffn = 0;
    int experts = 0, top_k = 0;
    std::vector<LoadKind> loads;
    double zipf = 1.2;
    std::vector<GroupedGemmProvider> providers;
    std::vector<std::string> provider_names;
    std::string dtype;
    std::uint64_t seed = 0;
};

cxxopts::Options gemm_options() {
    cxxopts::Options options("scmoe-bench gemm",
                             "Grouped GEMM (kForward: A [rows, hidden] x W [experts, hidden, ffn], rows = tokens * "
                             "top_k split over the experts by --loads) against one dense GEMM [rows, hidden] x "
                             "[hidden, ffn] of the same FLOPs.");
    options.set_width(110);
    add_common_options(options);
    add_token_options(options, "gemm", "4096");
    // clang-format off
    options.add_options("gemm")
        ("hidden", "Model width: the GEMM's inner dimension", cxxopts::value<std::int64_t>()->default_value("1024"))
        ("ffn", "Expert FFN width: the GEMM's output dimension", cxxopts::value<std::int64_t>()->default_value("4096"))
        ("E,experts", "Number of experts (groups)", cxxopts::value<int>()->default_value("8"))
        ("k,top-k", "Experts per token: rows = tokens * top_k", cxxopts::value<int>()->default_value("2"))
        ("loads", "Expert loads, comma list: balanced (rows/E each), zipf (share of expert e ~ 1/(e+1)^s)",
         cxxopts::value<std::string>()->default_value("balanced,zipf"))
        ("zipf", "Zipf exponent s of the zipf load", cxxopts::value<double>()->default_value("1.2"))
        ("provider", "Grouped GEMM providers, comma list: auto, loop, cublas-batched (CUDA, balanced loads only), "
                     "device-grouped (CUDA), cutlass-grouped (CUDA built with CUTLASS; bf16, hidden and ffn "
                     "multiples of 8)", cxxopts::value<std::string>()->default_value("auto"))
        ("d,dtype", "Element type: auto (the device's compute dtype: f32 on cpu, bf16 on cuda), f32 or bf16 "
                    "(nccl-tests' float and bfloat16 too)",
         cxxopts::value<std::string>()->default_value("auto"))
        ("seed", "Seed of the random inputs", cxxopts::value<std::uint64_t>()->default_value("1234"));
    // clang-format on
    add_nccl_tests_guards(options);
    return options;
}

GemmBenchArgs read_gemm_args(const cxxopts::ParseResult& r) {
    GemmBenchArgs a;
    a.tokens = read_token_options(r);
    a.hidden = r["hidden"].as<std::int64_t>();
    a.ffn = r["ffn"].as<std::int64_t>();
    a.experts = r["experts"].as<int>();
    a.top_k = r["top-k"].as<int>();
    if (a.hidden < 1 || a.ffn < 1) throw UsageError("--hidden and --ffn must be >= 1");
    if (a.experts < 1) throw UsageError("--experts must be >= 1");
    if (a.top_k < 1 || a.top_k > a.experts) throw UsageError("--top-k must be in [1, experts]");
    for (const std::string& name : split_list(r["loads"].as<std::string>())) a.loads.push_back(parse_load(name));
    if (a.loads.empty()) throw UsageError("--loads: empty list");
    a.zipf = r["zipf"].as<double>();
    if (!(a.zipf >= 0.0)) throw UsageError("--zipf must be >= 0");
    for (const std::string& name : split_list(r["provider"].as<std::string>())) {
        try {
            a.providers.push_back(parse_grouped_gemm_provider(name.c_str()));
        } catch (const std::exception& e) {
            throw UsageError(std::string("--provider: ") + e.what());
        }
        a.provider_names.push_back(name);
    }
    if (a.providers.empty()) throw UsageError("--provider: empty list");
    a.dtype = r["dtype"].as<std::string>();
    a.seed = r["seed"].as<std::uint64_t>();
    return a;
}

// The provider that actually runs, so the table names it: auto resolves as the library does for a
// ragged forward call of this shape (device buffers are 256-byte aligned, so null pointers stand in).
GroupedGemmProvider resolve_provider(GroupedGemmProvider p, const GemmBenchArgs& args, DType dtype, Stream& stream) {
    if (p != GroupedGemmProvider::kAuto) return p;
    if (stream.backend() == Backend::kEmu) return GroupedGemmProvider::kDeviceGrouped;  // what the emulator models
    GroupedGemmArgs g;
    g.kind = GroupedGemmKind::kForward;
    g.num_groups = args.experts;
    g.k = args.hidden;
    g.n = args.ffn;
    g.ab_dtype = g.c_dtype = dtype;
    return resolve_grouped_gemm_provider(g, p, grouped_gemm_target(stream));
}

}  // namespace

int run_gemm_bench(int argc, char** argv, const std::string& command) {
    cxxopts::Options options = gemm_options();
    const cxxopts::ParseResult result = options.parse(argc, argv);
    if (result.count("help")) {
        std::cout << options.help({"common", "gemm"});
        return kExitOk;
    }
    reject_unmatched(result);
    CommonArgs common = read_common_options(result);
    const GemmBenchArgs args = read_gemm_args(result);

    std::unique_ptr<Device> device = make_bench_device(common);
    const Backend backend = device->backend();
    resolve_iters(common, backend);
    const DType dtype = resolve_dtype(args.dtype, *device);
    std::unique_ptr<Stream> stream = device->create_stream();
    // The providers that run, resolved (auto named as what it picks) and without repeats.
    std::vector<GroupedGemmProvider> providers;
    for (std::size_t i = 0; i < args.providers.size(); ++i) {
        const GroupedGemmProvider p = resolve_provider(args.providers[i], args, dtype, *stream);
        if (backend == Backend::kCpu && p != GroupedGemmProvider::kLoop)
            throw UsageError("--provider " + args.provider_names[i] + " needs the cuda backend");
        if (std::find(providers.begin(), providers.end(), p) == providers.end()) providers.push_back(p);
    }

    nlohmann::ordered_json args_json = common_args_json(common);
    args_json["tokens"] = args.tokens;
    args_json["hidden"] = args.hidden;
    args_json["ffn"] = args.ffn;
    args_json["experts"] = args.experts;
    args_json["top_k"] = args.top_k;
    args_json["loads"] = nlohmann::ordered_json::array();
    for (LoadKind l : args.loads) args_json["loads"].push_back(load_name(l));
    args_json["zipf"] = args.zipf;
    args_json["provider"] = args.provider_names;
    args_json["dtype"] = dtype_name(dtype);
    args_json["seed"] = args.seed;

    Report report(std::cout, "gemm", command, *device, common, args_json);
    report.print_preamble();
    const double tol = dtype == DType::kBF16 ? 2e-2 : 1e-3;
    std::ostringstream what;
    what << "grouped: kForward A [rows, " << args.hidden << "] x W [" << args.experts << ", " << args.hidden << ", "
         << args.ffn << "] " << dtype_name(dtype) << ", fp32 accumulation; dense: [rows, " << args.hidden << "] x ["
         << args.hidden << ", " << args.ffn << "]; rows = tokens * " << args.top_k;
    report.note(what.str());
    if (common.check) {
        std::ostringstream check;
        check << "check: grouped result vs the dense gemm on each group's slice, wrong = |diff| > " << tol
              << " * max(|ref|, rms(ref))";
        report.note(check.str());
    }
    report.note("ratio = dense time / grouped time (1.0 = grouped as fast as dense for the same FLOPs)");
    report.begin_table({
        {"load", "load", "", 8, 0},
        {"provider", "provider", "", 14, 0},
        {"tokens", "tokens", "", 7, 0},
        {"rows", "rows", "", 7, 0},
        {"hidden", "hidden", "", 6, 0},
        {"ffn", "ffn", "", 6, 0},
        {"experts", "experts", "", 7, 0},
        {"max_rows_per_expert", "max_rows", "", 8, 0},
        {"grouped_us", "grp_time", "(us)", 10, 1},
        {"grouped_tflops", "grp_tflops", "(TFLOP/s)", 9, 3},
        {"dense_us", "dense_time", "(us)", 10, 1},
        {"dense_tflops", "dense_tflops", "(TFLOP/s)", 9, 3},
        {"ratio", "ratio", "", 6, 3},
        {"wrong", "#wrong", "", 6, 0},
    });

    const std::int64_t max_tokens = *std::max_element(args.tokens.begin(), args.tokens.end());
    const std::int64_t max_rows = max_tokens * args.top_k;
    const std::size_t esize = dtype_size(dtype);
    const auto H = args.hidden, F = args.ffn;
    const int E = args.experts;

    DeviceBuffer a_buf(*device, static_cast<std::size_t>(max_rows * H) * esize);
    DeviceBuffer w_buf(*device, static_cast<std::size_t>(E * H * F) * esize);
    DeviceBuffer c_buf(*device, static_cast<std::size_t>(max_rows * F) * esize);
    DeviceBuffer d_buf(*device, static_cast<std::size_t>(max_rows * F) * esize);  // dense out, then reference
    DeviceBuffer offsets_buf(*device, static_cast<std::size_t>(E + 1) * sizeof(std::int32_t));
    upload_uniform(*device, *stream, a_buf.data(), dtype, max_rows * H, 1.0f, args.seed);
    upload_uniform(*device, *stream, w_buf.data(), dtype, E * H * F, 1.0f / std::sqrt(static_cast<float>(H)),
                   args.seed + 1);

    double ratio_sum = 0.0;
    int ratio_count = 0;
    for (const std::int64_t tokens : args.tokens) {
        const std::int64_t rows = tokens * args.top_k;
        const double flops = 2.0 * static_cast<double>(rows) * static_cast<double>(H) * static_cast<double>(F);
        GemmArgs dense;  // [rows, H] x W[0] [H, F] -> [rows, F]
        dense.m = rows;
        dense.n = F;
        dense.k = H;
        dense.a = a_buf.data();
        dense.b = w_buf.data();
        dense.c = d_buf.data();
        dense.ab_dtype = dense.c_dtype = dtype;
        const double dense_us = time_us(*device, *stream, common.warmup, common.iters, [&] { gemm(dense, *stream); });

        for (const LoadKind load : args.loads) {
            const std::vector<std::int64_t> counts = expert_loads(load, rows, E, args.zipf);
            const std::vector<std::int32_t> offsets = group_offsets(counts);
            const std::int64_t max_per_expert = *std::max_element(counts.begin(), counts.end());
            // `offsets` is pageable host memory: wait for the copy before it goes out of scope.
            stream->copy(offsets_buf.data(), offsets.data(), offsets_buf.bytes());
            stream->synchronize();
            // The per-group dense GEMMs, computed once per load and only when checking.
            std::vector<float> reference;

            for (const GroupedGemmProvider provider : providers) {
                const std::string provider_name = grouped_gemm_provider_name(provider, backend);
                std::int64_t rows_per_group = 0;
                if (provider == GroupedGemmProvider::kCublasStridedBatched) {
                    if (load != LoadKind::kBalanced || rows % E != 0) {
                        report.note("skipped: " + provider_name + " needs equal rows per expert (load " +
                                    load_name(load) + ", rows " + std::to_string(rows) + ", experts " +
                                    std::to_string(E) + ")");
                        continue;
                    }
                    rows_per_group = rows / E;
                }
                GroupedGemmArgs g;
                g.kind = GroupedGemmKind::kForward;
                g.num_groups = E;
                g.k = H;
                g.n = F;
                g.max_rows = rows;
                g.rows_per_group = rows_per_group;
                g.group_offsets = offsets_buf.as<std::int32_t>();
                g.a = a_buf.data();
                g.b = w_buf.data();
                g.c = c_buf.data();
                g.ab_dtype = g.c_dtype = dtype;
                // A provider that silently writes nothing must not pass on the previous row's output.
                stream->fill_zero(c_buf.data(), static_cast<std::size_t>(rows * F) * esize);
                const double grouped_us =
                    time_us(*device, *stream, common.warmup, common.iters, [&] { grouped_gemm(g, *stream, provider); });

                Cell wrong;
                if (common.check) {
                    if (reference.empty()) {
                        for (int e = 0; e < E; ++e) {
                            const std::int64_t row0 = offsets[static_cast<std::size_t>(e)];
                            const std::int64_t n_rows = offsets[static_cast<std::size_t>(e) + 1] - row0;
                            if (n_rows == 0) continue;
                            gemm({false, false, n_rows, F, H, 1.0f, 0.0f, a_buf.as<char>() + row0 * H * esize,
                                  w_buf.as<char>() + e * H * F * esize, d_buf.as<char>() + row0 * F * esize, dtype,
                                  dtype},
                                 *stream);
                        }
                        reference = download_f32(*stream, d_buf.data(), dtype, rows * F);
                    }
                    wrong = count_wrong(download_f32(*stream, c_buf.data(), dtype, rows * F), reference, tol);
                }
                const double ratio = dense_us / grouped_us;
                ratio_sum += ratio;
                ++ratio_count;
                report.add_row({std::string(load_name(load)), provider_name, tokens, rows, H, F,
                                static_cast<std::int64_t>(E), max_per_expert, grouped_us, tflops(flops, grouped_us),
                                dense_us, tflops(flops, dense_us), ratio, wrong});
            }
        }
    }

    std::ostringstream avg;
    avg << std::fixed << std::setprecision(3) << (ratio_count ? ratio_sum / ratio_count : 0.0);
    return report.finish({{"Avg ratio (dense/grouped)", avg.str()}});
}

}  // namespace scmoe::bench
