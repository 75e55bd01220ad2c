// scmoe-bench layer: MoeLayer forward and forward+backward time and tokens/s, a per-stage
// breakdown (each stage method called on its own with events between them), dropped tokens, and
// a check that outputs and gradients are finite and bitwise reproducible.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iomanip>
#include <iostream>
#include <memory>
#include <sstream>

#include "benches.h"
#include "common.h"
#include "kernels/error.h"
#include "moe/moe_layer.h"
#include "moe/params.h"
#include "report.h"

namespace scmoe::bench {
namespace {

struct LayerBenchArgs {
    std::vector<std::int64_t> tokens;
    std::int64_t hidden = 0, ffn = 0, shared_ffn = 0;
    int experts = 0, top_k = 0;
    std::vector<DispatchMode> dispatch;
    float capacity_factor = 1.25f;
    Activation activation = Activation::kSwiGLU;
    bool shared_expert = false, cg = false, check_finite = true;
    bool provider_given = false;  // else the layer's default: SCMOE_GROUPED_GEMM_PROVIDER or auto
    GroupedGemmProvider provider = GroupedGemmProvider::kAuto;
    std::string provider_name;
    std::uint64_t seed = 0;
};

// Defaults keep one CPU run (2 cores, OpenBLAS) under about a minute: 2048 tokens, hidden 1024,
// ffn 2048, 8 experts, top-2, SwiGLU.
cxxopts::Options layer_options() {
    cxxopts::Options options("scmoe-bench layer",
                             "MoeLayer forward and forward+backward: time, tokens/s, per-stage times (route, "
                             "permute, experts, combine, shared and their backward), dropped tokens.");
    options.set_width(110);
    add_common_options(options);
    add_token_options(options, "layer", "2048");
    // clang-format off
    options.add_options("layer")
        ("hidden", "Model width H", cxxopts::value<std::int64_t>()->default_value("1024"))
        ("ffn", "Expert FFN width F (SwiGLU experts hold W1 [H, 2F])", cxxopts::value<std::int64_t>()->default_value("2048"))
        ("E,experts", "Number of routed experts", cxxopts::value<int>()->default_value("8"))
        ("k,top-k", "Experts per token: 1 or 2", cxxopts::value<int>()->default_value("2"))
        ("dispatch", "Dispatch modes, comma list: capacity, dropless", cxxopts::value<std::string>()->default_value("capacity"))
        ("capacity-factor", "Capacity mode: slots per expert = ceil(factor * tokens * top_k / experts)",
         cxxopts::value<float>()->default_value("1.25"))
        ("activation", "Expert activation: swiglu or gelu", cxxopts::value<std::string>()->default_value("swiglu"))
        ("shared-expert", "Add the dense shared expert on x")
        ("shared-ffn", "Shared expert FFN width (0 = --ffn)", cxxopts::value<std::int64_t>()->default_value("0"))
        ("cg", "CG-1 coefficient gate on the shared expert (implies --shared-expert)")
        ("p,provider", "Grouped GEMM provider of the experts: auto, loop, cublas-batched, device-grouped "
                       "(default: SCMOE_GROUPED_GEMM_PROVIDER, else auto)", cxxopts::value<std::string>())
        ("check-finite", "The layer's own NaN/Inf input checks (MoeConfig.check_finite): 0 or 1",
         cxxopts::value<int>()->default_value("1"))
        ("seed", "Seed of the random inputs and parameters", cxxopts::value<std::uint64_t>()->default_value("1234"));
    // clang-format on
    return options;
}

LayerBenchArgs read_layer_args(const cxxopts::ParseResult& r) {
    LayerBenchArgs a;
    a.tokens = read_token_options(r);
    a.hidden = r["hidden"].as<std::int64_t>();
    a.ffn = r["ffn"].as<std::int64_t>();
    a.shared_ffn = r["shared-ffn"].as<std::int64_t>();
    a.experts = r["experts"].as<int>();
    a.top_k = r["top-k"].as<int>();
    try {
        for (const std::string& name : split_list(r["dispatch"].as<std::string>()))
            a.dispatch.push_back(parse_dispatch_mode(name));
        a.activation = parse_activation(r["activation"].as<std::string>());
        if (r.count("provider")) {
            a.provider_given = true;
            a.provider_name = r["provider"].as<std::string>();
            a.provider = parse_grouped_gemm_provider(a.provider_name.c_str());
        }
    } catch (const Error& e) {
        throw UsageError(e.what());
    }
    if (a.dispatch.empty()) throw UsageError("--dispatch: empty list");
    a.capacity_factor = r["capacity-factor"].as<float>();
    a.cg = r.count("cg") > 0;
    a.shared_expert = r.count("shared-expert") > 0 || a.cg;
    const int check_finite = r["check-finite"].as<int>();
    if (check_finite != 0 && check_finite != 1) throw UsageError("--check-finite: expected 0 or 1");
    a.check_finite = check_finite == 1;
    a.seed = r["seed"].as<std::uint64_t>();
    return a;
}

MoeConfig make_config(const LayerBenchArgs& a, DispatchMode dispatch, DType dtype) {
    MoeConfig c;
    c.hidden = a.hidden;
    c.ffn = a.ffn;
    c.num_experts = a.experts;
    c.top_k = a.top_k;
    c.capacity_factor = a.capacity_factor;
    c.dispatch = dispatch;
    c.activation = a.activation;
    c.dtype = dtype;
    c.shared_expert = a.shared_expert;
    c.shared_ffn = a.shared_ffn;
    c.coefficient_gate = a.cg;
    c.check_finite = a.check_finite;
    try {
        c.validate();
    } catch (const Error& e) {
        throw UsageError(e.what());
    }
    return c;
}

// Uniform in [-1, 1) / sqrt(fan_in), fan_in = the second-to-last dimension ([.., in, out] weights).
void init_params(Device& device, Stream& stream, const MoeConfig& config, const MoeParams& params, std::uint64_t seed) {
    const std::vector<ParamSpec> specs = moe_param_specs(config);
    const Tensor* tensor = params.begin();
    for (std::size_t i = 0; i < specs.size(); ++i, ++tensor) {
        const ParamSpec& spec = specs[i];
        if (spec.shape.empty()) continue;
        const std::int64_t fan_in = spec.shape.size() >= 2 ? spec.shape[spec.shape.size() - 2] : spec.shape[0];
        upload_uniform(device, stream, tensor->data, tensor->dtype, spec.numel(),
                       1.0f / std::sqrt(static_cast<float>(fan_in)), seed + 100 + i);
    }
}

// Elements of n * esize bytes that differ bitwise.
std::int64_t count_bit_mismatches(const std::vector<std::uint8_t>& a, const std::vector<std::uint8_t>& b,
                                  std::size_t esize) {
    std::int64_t mismatches = 0;
    for (std::size_t i = 0; i + esize <= a.size(); i += esize)
        if (std::memcmp(a.data() + i, b.data() + i, esize) != 0) ++mismatches;
    return mismatches;
}

// The stages of one forward+backward in table-column order. LayerPass::run gives the execution
// order, which is MoeLayer::backward's: the shared expert's backward runs before permute_backward.
enum Stage {
    kRoute,
    kPermute,
    kExperts,
    kCombine,
    kShared,
    kCombineBwd,
    kExpertsBwd,
    kPermuteBwd,
    kRouteBwd,
    kSharedBwd,
    kNumStages
};
const char* const kStageKey[kNumStages] = {"route_us",     "permute_us",     "experts_us",     "combine_us",
                                           "shared_us",    "combine_bwd_us", "experts_bwd_us", "permute_bwd_us",
                                           "route_bwd_us", "shared_bwd_us"};
const char* const kStageHeader[kNumStages] = {"route",    "permute", "exp_ffn",  "combine",   "shared",
                                              "comb_bwd", "exp_bwd", "perm_bwd", "route_bwd", "shrd_bwd"};

// What one forward+backward does, stage by stage, as MoeLayer::forward/backward do it.
struct LayerPass {
    MoeLayer& layer;
    const MoeParams& params;
    const MoeGrads& grads;
    Tensor x, y, grad_y, grad_x;
    bool shared;

    // Calls `mark(stage)` before each stage and `mark(kNumStages)` after the last.
    template <class Mark>
    void run(Stream& s, Mark&& mark) {
        mark(kRoute);
        layer.route(x, params, s);
        mark(kPermute);
        layer.permute(s);
        mark(kExperts);
        layer.experts(params, s);
        mark(kCombine);
        layer.combine(y, s);
        if (shared) {
            mark(kShared);
            layer.shared_expert(x, params, y, s);
        }
        mark(kCombineBwd);
        layer.combine_backward(grad_y, s);
        mark(kExpertsBwd);
        layer.experts_backward(params, grads, s);
        if (shared) {
            mark(kSharedBwd);
            layer.shared_expert_backward(grad_y, params, grads, grad_x, false, s);
        }
        mark(kPermuteBwd);
        layer.permute_backward(grad_x, shared, s);  // adds to the shared expert's part when there is one
        mark(kRouteBwd);
        layer.route_backward(params, grads, grad_x, s);
        mark(kNumStages);
    }
};

// Mean time of each stage over `iters` passes; events are recorded between the stages and read
// only after the last pass, so the loop never waits on the host.
std::vector<double> stage_times_us(Device& device, Stream& stream, LayerPass& pass, int iters) {
    std::vector<std::vector<std::unique_ptr<Event>>> events(static_cast<std::size_t>(iters));
    std::vector<std::vector<int>> order(static_cast<std::size_t>(iters));
    for (int it = 0; it < iters; ++it) {
        auto& ev = events[static_cast<std::size_t>(it)];
        auto& ord = order[static_cast<std::size_t>(it)];
        pass.run(stream, [&](int stage) {
            ev.push_back(device.create_event());
            ev.back()->record(stream);
            ord.push_back(stage);
        });
    }
    stream.synchronize();
    std::vector<double> sum(kNumStages, 0.0);
    for (int it = 0; it < iters; ++it) {
        const auto& ev = events[static_cast<std::size_t>(it)];
        const auto& ord = order[static_cast<std::size_t>(it)];
        for (std::size_t i = 0; i + 1 < ev.size(); ++i)
            sum[static_cast<std::size_t>(ord[i])] += 1000.0 * ev[i + 1]->elapsed_ms_since(*ev[i]);
    }
    for (double& s : sum) s /= iters;
    return sum;
}

// Where the layer's grouped GEMM provider came from, for the config line.
std::string provider_source(const LayerBenchArgs& args) {
    if (args.provider_given) return "--provider";
    const char* env = std::getenv("SCMOE_GROUPED_GEMM_PROVIDER");
    return env && *env ? "SCMOE_GROUPED_GEMM_PROVIDER" : "the default";
}

std::string fixed(double value, int precision) {
    std::ostringstream os;
    os << std::fixed << std::setprecision(precision) << value;
    return os.str();
}

}  // namespace

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

    std::unique_ptr<Device> device = make_device(common.backend);
    const Backend backend = device->backend();
    resolve_iters(common, backend);
    const DType dtype = device->compute_dtype();
    if (args.provider_given && backend == Backend::kCpu && args.provider != GroupedGemmProvider::kAuto &&
        args.provider != GroupedGemmProvider::kLoop)
        throw UsageError("--provider " + args.provider_name + " needs the cuda backend");

    nlohmann::ordered_json args_json = common_args_json(common);
    args_json["tokens"] = args.tokens;
    args_json["hidden"] = args.hidden;
    args_json["ffn"] = args.ffn;
    args_json["experts"] = args.experts;
    args_json["top_k"] = args.top_k;
    args_json["dispatch"] = nlohmann::ordered_json::array();
    for (DispatchMode d : args.dispatch) args_json["dispatch"].push_back(dispatch_mode_name(d));
    args_json["capacity_factor"] = args.capacity_factor;
    args_json["activation"] = activation_name(args.activation);
    args_json["shared_expert"] = args.shared_expert;
    args_json["shared_ffn"] = args.shared_ffn;
    args_json["cg"] = args.cg;
    args_json["provider"] = args.provider_given ? nlohmann::ordered_json(args.provider_name) : nullptr;
    args_json["check_finite"] = args.check_finite;
    args_json["seed"] = args.seed;
    args_json["dtype"] = dtype_name(dtype);

    Report report(std::cout, "layer", command, *device, common, args_json);
    report.print_preamble();
    report.note(
        "fwd = MoeLayer::forward; train = forward + backward; stage columns: each stage method alone, "
        "events between stages, mean over the timed iterations");
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
            LayerPass pass{layer, p, g, x, y, dy, dx, args.shared_expert};
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
            cells.push_back(stats.dropped_tokens);
            cells.push_back(wrong);
            report.add_row(std::move(cells));
        }
    }

    return report.finish({{"Avg fwd tokens/s", fixed(rows ? fwd_rate_sum / rows : 0.0, 0)},
                          {"Avg train tokens/s", fixed(rows ? train_rate_sum / rows : 0.0, 0)}});
}

}  // namespace scmoe::bench
