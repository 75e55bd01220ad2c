// scmoe-bench attention: the causal attention core (scmoe/kernels/attention.h) forward, backward and
// forward+backward per provider (cuDNN's fused flash attention, the own kernel, auto), time and
// TFLOP/s from op_cost. launch/attention_torch.py writes rows with the same fields for PyTorch's
// scaled_dot_product_attention on the same shapes.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <sstream>

#include "benches.h"
#include "common.h"
#include "scmoe/kernels/attention.h"
#include "report.h"

namespace scmoe::bench {
namespace {

struct AttentionBenchArgs {
    std::int64_t batch = 0, heads = 0, kv_heads = 0;  // kv_heads 0: = heads
    std::vector<std::int64_t> seqs, head_dims;
    std::vector<AttentionProvider> providers;
    std::string dtype;
    std::uint64_t seed = 0;
};

cxxopts::Options attention_options() {
    cxxopts::Options options(
        "scmoe-bench attention",
        "Causal multi-head attention softmax(q k^T / sqrt(head_dim)) v on qkv "
        "[batch*seq, (heads + 2*kv_heads)*head_dim]: "
        "forward (with lse, as in training), backward and forward+backward per provider. TFLOP/s from op_cost "
        "(causal: half the square; backward 2.5x the forward).");
    options.set_width(110);
    add_common_options(options);
    // clang-format off
    options.add_options("attention")
        ("batch", "Sequences per batch", cxxopts::value<std::int64_t>()->default_value("8"))
        ("seq", "Sequence lengths, comma list (K suffix)", cxxopts::value<std::string>()->default_value("1024"))
        ("heads", "Attention heads", cxxopts::value<std::int64_t>()->default_value("12"))
        ("kv-heads", "K/V heads (grouped-query attention; must divide --heads; default: --heads)",
         cxxopts::value<std::int64_t>())
        ("head-dim", "Head dimensions, comma list", cxxopts::value<std::string>()->default_value("64"))
        ("provider", "Providers, comma list: auto (cuDNN for bf16 where it runs, else own; "
                     "SCMOE_ATTENTION_PROVIDER), own (scmoe's kernel), cudnn (CUDA, bf16)",
         cxxopts::value<std::string>()->default_value("auto"))
        ("d,dtype", "Element type: auto (the device's compute dtype: f32 on cpu, bf16 on cuda), f32 or bf16 "
                    "(nccl-tests' float and bfloat16 too)",
         cxxopts::value<std::string>()->default_value("auto"))
        ("seed", "Seed of the random inputs", cxxopts::value<std::uint64_t>()->default_value("1234"));
    // clang-format on
    add_nccl_tests_guards(options);
    return options;
}

AttentionBenchArgs read_attention_args(const cxxopts::ParseResult& r) {
    AttentionBenchArgs a;
    a.batch = r["batch"].as<std::int64_t>();
    a.heads = r["heads"].as<std::int64_t>();
    if (a.batch < 1 || a.heads < 1) throw UsageError("--batch and --heads must be >= 1");
    a.kv_heads = r.count("kv-heads") ? r["kv-heads"].as<std::int64_t>() : a.heads;
    if (a.kv_heads < 1 || a.heads % a.kv_heads != 0)
        throw UsageError("--kv-heads " + std::to_string(a.kv_heads) + " must divide --heads " +
                         std::to_string(a.heads));
    a.seqs = parse_size_list(r["seq"].as<std::string>(), "--seq");
    a.head_dims = parse_size_list(r["head-dim"].as<std::string>(), "--head-dim");
    for (const std::string& name : split_list(r["provider"].as<std::string>())) {
        try {
            const AttentionProvider p = parse_attention_provider(name.c_str());
            if (std::find(a.providers.begin(), a.providers.end(), p) == a.providers.end()) a.providers.push_back(p);
        } catch (const std::exception& e) {
            throw UsageError(std::string("--provider: ") + e.what());
        }
    }
    if (a.providers.empty()) throw UsageError("--provider: empty list");
    a.dtype = r["dtype"].as<std::string>();
    a.seed = r["seed"].as<std::uint64_t>();
    return a;
}

}  // namespace

int run_attention_bench(int argc, char** argv, const std::string& command) {
    cxxopts::Options options = attention_options();
    const cxxopts::ParseResult result = options.parse(argc, argv);
    if (result.count("help")) {
        std::cout << options.help({"common", "attention"});
        return kExitOk;
    }
    reject_unmatched(result);
    CommonArgs common = read_common_options(result);
    const AttentionBenchArgs args = read_attention_args(result);

    std::unique_ptr<Device> device = make_bench_device(common);
    const Backend backend = device->backend();
    resolve_iters(common, backend);
    const DType dtype = resolve_dtype(args.dtype, *device);
    for (AttentionProvider p : args.providers) {
        if (p == AttentionProvider::kCudnn && backend != Backend::kCuda)
            throw UsageError("--provider cudnn needs the cuda backend");
        if (p == AttentionProvider::kCudnn && !attention_cudnn_built())
            throw UsageError("--provider cudnn: this scmoe was built without cuDNN (SCMOE_WITH_CUDNN)");
        if (p == AttentionProvider::kCudnn && dtype != DType::kBF16)
            throw UsageError("--provider cudnn needs --dtype bf16 (cuDNN's fused attention has no f32)");
    }

    nlohmann::ordered_json args_json = common_args_json(common);
    args_json["batch"] = args.batch;
    args_json["seq"] = args.seqs;
    args_json["heads"] = args.heads;
    args_json["kv_heads"] = args.kv_heads;
    args_json["head_dim"] = args.head_dims;
    args_json["provider"] = nlohmann::ordered_json::array();
    for (AttentionProvider p : args.providers) args_json["provider"].push_back(attention_provider_name(p));
    args_json["dtype"] = dtype_name(dtype);
    args_json["seed"] = args.seed;

    Report report(std::cout, "attention", command, *device, common, args_json);
    report.print_preamble();
    const double out_tol = dtype == DType::kBF16 ? 2e-2 : 1e-3;
    const double grad_tol = dtype == DType::kBF16 ? 5e-2 : 1e-3;
    // bf16: every element of out (a probability-weighted sum of V rows) and of grad_qkv (sums over
    // the sequence) carries the rounding of the terms summed into it, whose scale is the tensor's
    // largest values, not the element's own: at least 2 bf16 unit roundoffs (2 * 2^-8) of max|ref|
    // pass. (An H100/H200 run flagged 18-64 of 6-19 M elements of cuDNN's result under the rms
    // floor alone, with max|diff| 0.30-0.37% of max|ref| and rel L2 0.21-0.23%; the own kernel's
    // 0.20-0.32%, 0.16-0.17%.)
    const double bf16_floor = dtype == DType::kBF16 ? 2.0 / 256.0 : 0.0;
    {
        std::ostringstream what;
        what << "causal attention, qkv [batch*seq, (heads + 2*kv_heads)*head_dim] " << dtype_name(dtype)
             << ", fp32 accumulation; fwd writes out and lse; bwd reads qkv, out, lse, grad_out, writes grad_qkv";
        report.note(what.str());
        const char* env = std::getenv("SCMOE_ATTENTION_PROVIDER");
        report.note(std::string("auto: ") +
                    (backend != Backend::kCuda ? "the backend's only kernel"
                     : env && *env             ? std::string("SCMOE_ATTENTION_PROVIDER=") + env
                     : attention_cudnn_built()
                         ? "cuDNN for bf16 with head_dim % 8 == 0 where cuDNN supports it, else own"
                         : "own (this build has no cuDNN)"));
    }
    if (common.check) {
        std::ostringstream check;
        check << "check: out and grad_qkv against the CPU f32 op on the same inputs, wrong = |diff| > " << out_tol
              << " (out) / " << grad_tol << " (grad) * max(|ref|, rms(ref))";
        if (bf16_floor > 0) check << ", and > " << bf16_floor << " * max|ref| (2 bf16 unit roundoffs)";
        if (backend == Backend::kCpu) check << "; on cpu the op is its own reference";
        report.note(check.str());
    }
    report.begin_table({
        {"provider", "provider", "", 8, 0},
        {"batch", "batch", "", 5, 0},
        {"seq", "seq", "", 6, 0},
        {"heads", "heads", "", 5, 0},
        {"kv_heads", "kv_heads", "", 8, 0},
        {"head_dim", "head_dim", "", 8, 0},
        {"dtype", "dtype", "", 5, 0},
        {"fwd_us", "fwd_time", "(us)", 10, 1},
        {"fwd_tflops", "fwd_tflops", "(TFLOP/s)", 9, 3},
        {"bwd_us", "bwd_time", "(us)", 10, 1},
        {"bwd_tflops", "bwd_tflops", "(TFLOP/s)", 9, 3},
        {"fwd_bwd_us", "fwdbwd_time", "(us)", 11, 1},
        {"fwd_bwd_tflops", "fwdbwd_tflops", "(TFLOP/s)", 9, 3},
        {"wrong", "#wrong", "", 6, 0},
    });

    std::unique_ptr<Stream> stream = device->create_stream();
    std::unique_ptr<Device> cpu;  // the check's reference
    std::unique_ptr<Stream> cpu_stream;
    if (common.check) {
        cpu = make_device("cpu");
        cpu_stream = cpu->create_stream();
    }
    const std::size_t esize = dtype_size(dtype);
    double fwd_tflops_sum = 0.0, bwd_tflops_sum = 0.0;
    int rows = 0;
    for (const std::int64_t head_dim : args.head_dims) {
        for (const std::int64_t seq : args.seqs) {
            const std::int64_t B = args.batch, S = seq, H = args.heads, D = head_dim, KV = args.kv_heads;
            const std::int64_t qkv_n = B * S * attention_qkv_width(H, KV, D), out_n = B * S * H * D, lse_n = B * H * S;
            DeviceBuffer qkv(*device, static_cast<std::size_t>(qkv_n) * esize);
            DeviceBuffer grad_qkv(*device, static_cast<std::size_t>(qkv_n) * esize);
            DeviceBuffer out(*device, static_cast<std::size_t>(out_n) * esize);
            DeviceBuffer grad_out(*device, static_cast<std::size_t>(out_n) * esize);
            DeviceBuffer lse(*device, static_cast<std::size_t>(lse_n) * sizeof(float));
            upload_uniform(*device, *stream, qkv.data(), dtype, qkv_n, 1.0f, args.seed);
            upload_uniform(*device, *stream, grad_out.data(), dtype, out_n, 1.0f, args.seed + 1);
            const AttentionArgs fwd{B, S, H, D, dtype, qkv.data(), out.data(), lse.as<float>(), KV};
            const AttentionBackwardArgs bwd{
                B, S, H, D, dtype, qkv.data(), out.data(), lse.as<float>(), grad_out.data(), grad_qkv.data(), KV};
            const double fwd_flops = op_cost(fwd).flops, bwd_flops = op_cost(bwd).flops;

            // The CPU reference forward, once per shape (its backward needs each provider's out).
            std::vector<float> host_qkv, host_grad_out, ref_out, ref_lse;
            if (common.check) {
                host_qkv = download_f32(*stream, qkv.data(), dtype, qkv_n);
                host_grad_out = download_f32(*stream, grad_out.data(), dtype, out_n);
                ref_out.resize(static_cast<std::size_t>(out_n));
                ref_lse.resize(static_cast<std::size_t>(lse_n));
                attention_forward({B, S, H, D, DType::kF32, host_qkv.data(), ref_out.data(), ref_lse.data(), KV},
                                  *cpu_stream);
                cpu_stream->synchronize();
            }

            for (const AttentionProvider p : args.providers) {
                const double fwd_us =
                    time_us(*device, *stream, common.warmup, common.iters, [&] { attention_forward(fwd, *stream, p); });
                const double bwd_us = time_us(*device, *stream, common.warmup, common.iters,
                                              [&] { attention_backward(bwd, *stream, p); });
                const double fwd_bwd_us = time_us(*device, *stream, common.warmup, common.iters, [&] {
                    attention_forward(fwd, *stream, p);
                    attention_backward(bwd, *stream, p);
                });
                Cell wrong;
                if (common.check) {
                    // The last timed iteration left this provider's out, lse and grad_qkv.
                    const std::vector<float> got_out = download_f32(*stream, out.data(), dtype, out_n);
                    const std::vector<float> got_grad = download_f32(*stream, grad_qkv.data(), dtype, qkv_n);
                    std::vector<float> ref_grad(static_cast<std::size_t>(qkv_n));
                    attention_backward({B, S, H, D, DType::kF32, host_qkv.data(), got_out.data(), ref_lse.data(),
                                        host_grad_out.data(), ref_grad.data(), KV},
                                       *cpu_stream);
                    cpu_stream->synchronize();
                    const ErrorStats out_err = error_stats(got_out, ref_out), grad_err = error_stats(got_grad, ref_grad);
                    const std::int64_t wrong_out =
                        count_wrong(got_out, ref_out, out_tol, bf16_floor * out_err.max_ref);
                    const std::int64_t wrong_grad =
                        count_wrong(got_grad, ref_grad, grad_tol, bf16_floor * grad_err.max_ref);
                    wrong = wrong_out + wrong_grad;
                    report.note(std::string(attention_provider_name(p)) + " seq " + std::to_string(S) + " head_dim " +
                                std::to_string(D) + ": out " + describe_error(out_err) + " (" +
                                std::to_string(wrong_out) + " wrong); grad_qkv " +
                                describe_error(grad_err) + " (" + std::to_string(wrong_grad) +
                                " wrong)");
                }
                fwd_tflops_sum += tflops(fwd_flops, fwd_us);
                bwd_tflops_sum += tflops(bwd_flops, bwd_us);
                ++rows;
                report.add_row({std::string(attention_provider_name(p)), B, S, H, KV, D, std::string(dtype_name(dtype)),
                                fwd_us, tflops(fwd_flops, fwd_us), bwd_us, tflops(bwd_flops, bwd_us), fwd_bwd_us,
                                tflops(fwd_flops + bwd_flops, fwd_bwd_us), wrong});
            }
        }
    }

    std::ostringstream fwd_avg, bwd_avg;
    fwd_avg.setf(std::ios::fixed);
    bwd_avg.setf(std::ios::fixed);
    fwd_avg.precision(3);
    bwd_avg.precision(3);
    fwd_avg << (rows ? fwd_tflops_sum / rows : 0.0);
    bwd_avg << (rows ? bwd_tflops_sum / rows : 0.0);
    return report.finish({{"Avg fwd TFLOP/s", fwd_avg.str()}, {"Avg bwd TFLOP/s", bwd_avg.str()}});
}

}  // namespace scmoe::bench
