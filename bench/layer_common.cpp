#include "layer_common.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iomanip>
#include <memory>
#include <sstream>

#include "scmoe/kernels/error.h"
#include "launch/local_rank.h"
#include "multi_rank.h"

namespace scmoe::bench {

const char* const kStageKey[kNumStages] = {"route_us",       "permute_us",     "dispatch_us",     "experts_us",
                                           "collect_us",     "combine_us",     "shared_us",       "combine_bwd_us",
                                           "collect_bwd_us", "experts_bwd_us", "dispatch_bwd_us", "permute_bwd_us",
                                           "route_bwd_us",   "shared_bwd_us"};
const char* const kStageHeader[kNumStages] = {"route",    "permute",  "dispatch",  "exp_ffn",  "collect",
                                              "combine",  "shared",   "comb_bwd",  "coll_bwd", "exp_bwd",
                                              "disp_bwd", "perm_bwd", "route_bwd", "shrd_bwd"};

// Defaults keep one CPU run (2 cores, OpenBLAS) under about a minute: 2048 tokens, hidden 1024,
// ffn 2048, 8 experts, top-2, SwiGLU.
cxxopts::Options layer_options() {
    cxxopts::Options options("scmoe-bench layer",
                             "MoeLayer forward and forward+backward: time, tokens/s, per-stage times (route, "
                             "permute, dispatch, experts, collect, combine, shared and their backward), dropped "
                             "tokens. --ep N runs the expert-parallel layer on N ranks (in-process threads, or one "
                             "per process under mpirun) and adds the all-to-all time and its share of the layer.");
    options.set_width(110);
    add_common_options(options);
    add_token_options(options, "layer", "2048", "Tokens per case and per rank (with --ep every rank routes this many)");
    // clang-format off
    options.add_options("layer")
        ("hidden", "Model width H", cxxopts::value<std::int64_t>()->default_value("1024"))
        ("ffn", "Expert FFN width F (SwiGLU experts hold W1 [H, 2F])", cxxopts::value<std::int64_t>()->default_value("2048"))
        ("E,experts", "Number of routed experts (all ranks together)", cxxopts::value<int>()->default_value("8"))
        ("k,top-k", "Experts per token: 1 .. min(experts, 8)", cxxopts::value<int>()->default_value("2"))
        ("dispatch", "Dispatch modes, comma list: capacity, dropless", cxxopts::value<std::string>()->default_value("capacity"))
        ("capacity-factor", "Capacity mode: slots per expert = ceil(factor * tokens * top_k / experts), per rank",
         cxxopts::value<float>()->default_value("1.25"))
        ("activation", "Expert activation: swiglu or gelu", cxxopts::value<std::string>()->default_value("swiglu"))
        ("shared-expert", "Add the dense shared expert on x")
        ("shared-ffn", "Shared expert FFN width (0 = --ffn)", cxxopts::value<std::int64_t>()->default_value("0"))
        ("cg", "CG-1 coefficient gate on the shared expert (implies --shared-expert)")
        ("provider", "Grouped GEMM provider of the experts: auto, loop, cublas-batched, device-grouped, "
                     "cutlass-grouped "
                     "(default: SCMOE_GROUPED_GEMM_PROVIDER, else auto)", cxxopts::value<std::string>())
        ("check-finite", "The layer's own NaN/Inf input checks (MoeConfig.check_finite): 0 or 1",
         cxxopts::value<int>()->default_value("1"))
        ("seed", "Seed of the random inputs and parameters", cxxopts::value<std::uint64_t>()->default_value("1234"))
        ("ep", "Expert-parallel ranks, each with --tokens tokens of its own and experts/ep experts: in-process "
               "threads (LocalCommunicator, one CPU stream each); under mpirun the world size (MpiCommunicator, "
               "one rank per process). Default 1, or the mpirun world size", cxxopts::value<int>());
    // clang-format on
    add_link_options(options, "layer");
    add_nccl_tests_guards(options);
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

    const int world = launch::launcher_world_size();
    a.mpi = world > 1;
    a.ep = a.mpi ? world : 1;
    if (r.count("ep")) {
        const int ep = r["ep"].as<int>();
        if (ep < 1) throw UsageError("--ep " + std::to_string(ep) + ": must be >= 1");
        if (a.mpi && ep != world)
            throw UsageError("--ep " + std::to_string(ep) + " under mpirun with " + std::to_string(world) +
                             " processes: ep is the world size (one rank per process)");
        a.ep = ep;
    }
    if (a.experts > 0 && a.experts % a.ep != 0)
        throw UsageError("--experts " + std::to_string(a.experts) + " is not divisible by --ep " +
                         std::to_string(a.ep));
    a.link = read_link_options(r);
    if (a.link && a.ep == 1) throw UsageError("--link needs --ep > 1 (or mpirun): a single rank crosses no link");
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

double expert_forward_flops(const MoeConfig& config, const MoeStats& stats) {
    std::int64_t rows = 0;
    if (config.dispatch == DispatchMode::kCapacity)
        rows = stats.capacity * static_cast<std::int64_t>(stats.expert_counts.size());
    else
        for (std::int32_t c : stats.expert_counts) rows += c;
    const double H = static_cast<double>(config.hidden);
    return 2.0 * static_cast<double>(rows) * H *
           static_cast<double>(config.expert_inner_width() + config.ffn);
}

double shared_forward_flops(const MoeConfig& config, std::int64_t tokens) {
    if (!config.shared_expert) return 0.0;
    const std::int64_t F = config.shared_ffn_width();
    return 2.0 * static_cast<double>(tokens) * static_cast<double>(config.hidden) *
           static_cast<double>(activation_input_width(config.activation, F) + F);
}

nlohmann::ordered_json layer_args_json(const CommonArgs& common, const LayerBenchArgs& args, DType dtype) {
    nlohmann::ordered_json j = common_args_json(common);
    j["tokens"] = args.tokens;
    j["hidden"] = args.hidden;
    j["ffn"] = args.ffn;
    j["experts"] = args.experts;
    j["top_k"] = args.top_k;
    j["dispatch"] = nlohmann::ordered_json::array();
    for (DispatchMode d : args.dispatch) j["dispatch"].push_back(dispatch_mode_name(d));
    j["capacity_factor"] = args.capacity_factor;
    j["activation"] = activation_name(args.activation);
    j["shared_expert"] = args.shared_expert;
    j["shared_ffn"] = args.shared_ffn;
    j["cg"] = args.cg;
    j["provider"] = args.provider_given ? nlohmann::ordered_json(args.provider_name) : nullptr;
    j["check_finite"] = args.check_finite;
    j["seed"] = args.seed;
    j["dtype"] = dtype_name(dtype);
    j["ep"] = args.ep;
    j["mode"] = args.mpi ? "mpi" : args.ep > 1 ? "local" : "single";
    j["link"] = link_json(args.link);
    return j;
}

void init_params(Device& device, Stream& stream, const MoeConfig& config, const MoeParams& params, std::uint64_t seed) {
    const std::vector<ParamSpec> specs = moe_param_specs(config);
    const Tensor* tensor = params.begin();
    for (std::size_t i = 0; i < specs.size(); ++i, ++tensor) {
        const ParamSpec& spec = specs[i];
        if (spec.shape.empty()) continue;
        const std::int64_t fan_in = spec.shape.size() >= 2 ? spec.shape[spec.shape.size() - 2] : spec.shape[0];
        upload_uniform(device, stream, tensor->data, tensor->dtype, tensor->numel(),
                       1.0f / std::sqrt(static_cast<float>(fan_in)), seed + 100 + i);
    }
}

std::int64_t count_bit_mismatches(const std::vector<std::uint8_t>& a, const std::vector<std::uint8_t>& b,
                                  std::size_t esize) {
    std::int64_t mismatches = 0;
    for (std::size_t i = 0; i + esize <= a.size(); i += esize)
        if (std::memcmp(a.data() + i, b.data() + i, esize) != 0) ++mismatches;
    return mismatches;
}

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

}  // namespace scmoe::bench
