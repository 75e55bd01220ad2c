// scmoe-bench layer: MoeLayer forward and forward+backward time and tokens/s, a per-stage
// breakdown (each stage method called on its own with events between them), dropped tokens, and
// a check that outputs and gradients are finite and bitwise reproducible. With --ep N (or under
// mpirun) the expert-parallel layer runs on N ranks instead: layer_ep_bench.cpp.
#include <algorithm>
#include <iostream>
#include <memory>

#include "benches.h"
#include "common.h"
#include "scmoe/kernels/error.h"
#include "layer_common.h"
#include "scmoe/moe/moe_layer.h"
#include "scmoe/moe/params.h"
#include "report.h"

namespace scmoe::bench {

int run_layer_bench(int argc, char** argv, const std::string& command) {
    cxxopts::Options options = layer_options();
    const cxxopts::ParseResult result = options.parse(argc, argv);
    if (result.count("help")) {
        std::cout << options.help({"common", "layer"});
        return kExitOk;
    }
    reject_unmatched(result);
    CommonArgs common = read_common_options(result);
    const LayerBenchArgs args = read_layer_args(result);
    for (DispatchMode d : args.dispatch) make_config(args, d, DType::kF32);  // bad configs fail before any work
    if (args.ep > 1) return run_layer_ep_bench(common, args, command);

    std::unique_ptr<Device> device = make_bench_device(common);
    const Backend backend = device->backend();
    resolve_iters(common, backend);
    const DType dtype = device->compute_dtype();
    if (args.provider_given && backend == Backend::kCpu && args.provider != GroupedGemmProvider::kAuto &&
        args.provider != GroupedGemmProvider::kLoop)
        throw UsageError("--provider " + args.provider_name + " needs the cuda backend");

    const nlohmann::ordered_json args_json = layer_args_json(common, args, dtype);

    Report report(std::cout, "layer", command, *device, common, args_json);
    report.print_preamble();
    report.note(
        "fwd = MoeLayer::forward; train = forward + backward; stage columns: each stage method alone, "
        "events between stages, mean over the timed iterations");
    report.note(
        "exp_TF/s, sh_TF/s: the routed (capacity mode: capacity rows per expert; dropless: the rows routed) and "
        "shared experts' GEMM FLOPs over their stage's time (activation included), forward and backward");
    if (common.check)
        report.note(
            "check: outputs and gradients finite, and a second forward+backward bitwise equal "
            "(wrong = non-finite + mismatching elements)");

    std::vector<Column> columns = {
        {"experts", "experts", "", 7, 0},
        {"top_k", "top_k", "", 5, 0},
        {"dispatch", "dispatch", "", 8, 0},
        {"tokens", "tokens", "", 7, 0},
        {"fwd_us", "fwd_time", "(us)", 10, 1},
        {"fwd_tokens_per_s", "fwd_tok/s", "(tok/s)", 10, 0},
        {"fwd_bwd_us", "train_time", "(us)", 10, 1},
        {"train_tokens_per_s", "train_tok/s", "(tok/s)", 10, 0},
    };
    std::vector<int> stage_columns = {kRoute, kPermute, kExperts, kCombine};
    if (args.shared_expert) stage_columns.push_back(kShared);
    for (int s : {kCombineBwd, kExpertsBwd, kPermuteBwd, kRouteBwd}) stage_columns.push_back(s);
    if (args.shared_expert) stage_columns.push_back(kSharedBwd);
    for (int s : stage_columns) columns.push_back({kStageKey[s], kStageHeader[s], "(us)", 9, 1});
    // The grouped (and shared) GEMMs' rates within their stages: make_profile.py's source.
    columns.push_back({"experts_tflops", "exp_TF/s", "", 8, 4});
    columns.push_back({"experts_bwd_tflops", "exp_bw_TF/s", "", 11, 4});
    if (args.shared_expert) {
        columns.push_back({"shared_tflops", "sh_TF/s", "", 8, 4});
        columns.push_back({"shared_bwd_tflops", "sh_bw_TF/s", "", 10, 4});
    }
    columns.push_back({"dropped", "dropped", "", 7, 0});
    columns.push_back({"wrong", "#wrong", "", 6, 0});

    const std::int64_t max_tokens = *std::max_element(args.tokens.begin(), args.tokens.end());
    const std::int64_t H = args.hidden;
    const std::size_t act_bytes = static_cast<std::size_t>(max_tokens * H) * dtype_size(dtype);
    std::unique_ptr<Stream> stream = device->create_stream();

    // Parameter shapes do not depend on the dispatch mode: one set for all configs.
    const MoeConfig shape_config = make_config(args, args.dispatch.front(), dtype);
    MoeParamStore params(*device, shape_config, dtype);
    MoeParamStore grads(*device, shape_config, DType::kF32);
    init_params(*device, *stream, shape_config, params.view(), args.seed);
    DeviceBuffer x_buf(*device, act_bytes), y_buf(*device, act_bytes), dy_buf(*device, act_bytes),
        dx_buf(*device, act_bytes);
    upload_uniform(*device, *stream, x_buf.data(), dtype, max_tokens * H, 1.0f, args.seed);
    upload_uniform(*device, *stream, dy_buf.data(), dtype, max_tokens * H, 1.0f, args.seed + 1);
    // Second outputs for the determinism check.
    std::unique_ptr<MoeParamStore> grads2;
    DeviceBuffer y2_buf, dx2_buf;
    if (common.check) {
        grads2 = std::make_unique<MoeParamStore>(*device, shape_config, DType::kF32);
        y2_buf = DeviceBuffer(*device, act_bytes);
        dx2_buf = DeviceBuffer(*device, act_bytes);
    }

    double fwd_rate_sum = 0.0, train_rate_sum = 0.0;
    int rows = 0;
    bool table_started = false;
    for (const DispatchMode dispatch : args.dispatch) {
        const MoeConfig config = make_config(args, dispatch, dtype);
        MoeLayer layer(config, *device, max_tokens);
        if (args.provider_given) layer.set_grouped_gemm_provider(args.provider);
        report.note("config: " + config.to_string() +
                    " provider=" + grouped_gemm_provider_name(layer.grouped_gemm_provider(), backend) + " (from " +
                    provider_source(args) + ")");
        if (!table_started) {
            report.begin_table(columns);
            table_started = true;
        }
        for (const std::int64_t T : args.tokens) {
            const Tensor x(x_buf.data(), dtype, {T, H}), y(y_buf.data(), dtype, {T, H});
            const Tensor dy(dy_buf.data(), dtype, {T, H}), dx(dx_buf.data(), dtype, {T, H});
            const MoeParams& p = params.view();
            const MoeGrads& g = grads.view();

            const double fwd_us = time_us(*device, *stream, common.warmup, common.iters,
                                          [&] { layer.forward(x, Tensor{}, p, y, *stream); });
            const double train_us = time_us(*device, *stream, common.warmup, common.iters, [&] {
                layer.forward(x, Tensor{}, p, y, *stream);
                layer.backward(dy, p, g, dx, Tensor{}, *stream);
            });
            LayerPass pass{layer, p, g, x, y, dy, dx, args.shared_expert, false};
            const std::vector<double> stage_us = stage_times_us(*device, *stream, pass, common.iters);
            const MoeStats stats = layer.stats(*stream);

            Cell wrong;
            if (common.check) {
                std::int64_t bad = count_nonfinite_elements(*device, *stream, y.data, dtype, y.numel());
                bad += count_nonfinite_elements(*device, *stream, dx.data, dtype, dx.numel());
                for (const Tensor& t : g)
                    if (t.defined()) bad += count_nonfinite_elements(*device, *stream, t.data, t.dtype, t.numel());
                // Determinism: the same inputs again, into second buffers, compared bit for bit.
                const Tensor y2(y2_buf.data(), dtype, {T, H}), dx2(dx2_buf.data(), dtype, {T, H});
                layer.forward(x, Tensor{}, p, y2, *stream);
                layer.backward(dy, p, grads2->view(), dx2, Tensor{}, *stream);
                stream->synchronize();
                bad += count_bit_mismatches(download_bytes(*stream, y.data, y.bytes()),
                                            download_bytes(*stream, y2.data, y2.bytes()), dtype_size(dtype));
                bad += count_bit_mismatches(download_bytes(*stream, dx.data, dx.bytes()),
                                            download_bytes(*stream, dx2.data, dx2.bytes()), dtype_size(dtype));
                const Tensor* t2 = grads2->view().begin();
                for (const Tensor* t = g.begin(); t != g.end(); ++t, ++t2) {
                    if (!t->defined()) continue;
                    bad += count_bit_mismatches(download_bytes(*stream, t->data, t->bytes()),
                                                download_bytes(*stream, t2->data, t2->bytes()), dtype_size(t->dtype));
                }
                wrong = bad;
            }

            // TFLOP/s = FLOPs / (us * 1e6); the backward does two GEMMs per forward GEMM.
            const auto tflops = [&](double flops, int stage) {
                const double us = stage_us[static_cast<std::size_t>(stage)];
                return us > 0 ? flops / (us * 1e6) : 0.0;
            };
            const double expert_flops = expert_forward_flops(config, stats);
            std::vector<double> gemm_rates = {tflops(expert_flops, kExperts), tflops(2 * expert_flops, kExpertsBwd)};
            if (args.shared_expert) {
                const double shared_flops = shared_forward_flops(config, T);
                gemm_rates.push_back(tflops(shared_flops, kShared));
                gemm_rates.push_back(tflops(2 * shared_flops, kSharedBwd));
            }

            const double fwd_rate = static_cast<double>(T) / (fwd_us * 1e-6);
            const double train_rate = static_cast<double>(T) / (train_us * 1e-6);
            fwd_rate_sum += fwd_rate;
            train_rate_sum += train_rate;
            ++rows;
            std::vector<Cell> cells = {static_cast<std::int64_t>(args.experts),
                                       static_cast<std::int64_t>(args.top_k),
                                       std::string(dispatch_mode_name(dispatch)),
                                       T,
                                       fwd_us,
                                       fwd_rate,
                                       train_us,
                                       train_rate};
            for (int s : stage_columns) cells.push_back(stage_us[static_cast<std::size_t>(s)]);
            for (double rate : gemm_rates) cells.push_back(rate);
            cells.push_back(stats.dropped_tokens);
            cells.push_back(wrong);
            report.add_row(std::move(cells));
        }
    }

    return report.finish({{"Avg fwd tokens/s", fixed(rows ? fwd_rate_sum / rows : 0.0, 0)},
                          {"Avg train tokens/s", fixed(rows ? train_rate_sum / rows : 0.0, 0)}});
}

}  // namespace scmoe::bench
