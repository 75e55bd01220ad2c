// scmoe inside libtorch: an MoE layer trained by torch::optim, with scmoe's MoeLayer (CPU backend, f32)
// doing the forward and backward through MoeFunction, a torch::autograd::Function. Tensors cross by
// DLPack both ways, without copies: the parameters live in scmoe's MoeParamStore and torch sees them as
// tensors (scmoe -> torch); inputs, outputs and gradients are torch's and scmoe sees them as views
// (torch -> scmoe). Every step the same layer written with libtorch ops (moe_reference.h) runs on the
// same parameters and input, and the outputs, the router losses, the routing and all gradients are
// compared. Exit status: 0 agreement within tolerance and the loss fell, 1 otherwise, 2 bad command line.
#include <ATen/DLConvertor.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cxxopts.hpp>
#include <memory>
#include <string>
#include <vector>

#include "moe_function.h"
#include "moe_reference.h"
#include "scmoe/interop/dlpack.h"
#include "scmoe/scmoe.h"

namespace {

using scmoe_example::MoeFunction;
using scmoe_example::ScmoeMoe;

cxxopts::Options make_options() {
    cxxopts::Options options(
        "scmoe_libtorch_moe",
        "Trains one MoE layer a few steps with torch::optim, the layer's forward and backward run by scmoe's "
        "MoeLayer (CPU backend, f32) as a torch::autograd::Function with tensors passed by DLPack, and checks "
        "that its outputs, router losses, routing and gradients match the same layer written with libtorch ops. "
        "Layer: dropless dispatch, softmax gating, top-k, the experts' activation, no shared expert. Exit "
        "status: 0 agreement and the loss fell, 1 otherwise, 2 bad command line.");
    options.set_width(110);
    // clang-format off
    options.add_options()
        ("t,tokens", "Tokens per step", cxxopts::value<std::int64_t>()->default_value("64"))
        ("hidden", "Model width H", cxxopts::value<std::int64_t>()->default_value("32"))
        ("ffn", "Expert FFN width F", cxxopts::value<std::int64_t>()->default_value("48"))
        ("E,experts", "Routed experts", cxxopts::value<int>()->default_value("4"))
        ("k,top-k", "Experts per token: 1 .. min(experts, 8)", cxxopts::value<int>()->default_value("2"))
        ("activation", "Experts' activation: swiglu or gelu", cxxopts::value<std::string>()->default_value("swiglu"))
        ("aux-coef", "Load-balancing loss weight", cxxopts::value<float>()->default_value("0.1"))
        ("z-coef", "Router z-loss weight", cxxopts::value<float>()->default_value("0.01"))
        ("optimizer", "torch::optim optimizer: adam or sgd", cxxopts::value<std::string>()->default_value("adam"))
        ("lr", "Learning rate", cxxopts::value<double>()->default_value("0.01"))
        ("n,steps", "Training steps", cxxopts::value<int>()->default_value("5"))
        ("seed", "Seed of scmoe's parameter init and torch's inputs",
         cxxopts::value<std::uint64_t>()->default_value("1"))
        ("rtol", "Tolerance: max|scmoe - torch| <= rtol * max|torch| for the output, each gradient and the "
                 "router losses (fp32)",
         cxxopts::value<double>()->default_value("1e-5"))
        ("h,help", "Print this help");
    // clang-format on
    return options;
}

// The worst agreement of one quantity over the steps.
struct Agreement {
    std::string name;
    double max_abs_err = 0, ref_scale = 0, rel_err = 0;

    void add(const torch::Tensor& got, const torch::Tensor& ref) {
        const double err = (got.detach() - ref.detach()).abs().max().item<double>();
        const double scale = ref.detach().abs().max().item<double>();
        max_abs_err = std::max(max_abs_err, err);
        ref_scale = std::max(ref_scale, scale);
        // NaN anywhere fails the check below (a comparison with NaN is false).
        rel_err = std::isnan(err) ? err : std::max(rel_err, err / std::max(scale, 1e-30));
    }
    bool ok(double rtol) const { return rel_err <= rtol; }
};

std::string command_line(int argc, char** argv) {
    std::string s;
    for (int i = 0; i < argc; ++i) s += (i ? " " : "") + std::string(argv[i]);
    return s;
}

}  // namespace

int main(int argc, char** argv) {
    cxxopts::Options options = make_options();
    cxxopts::ParseResult args;
    try {
        args = options.parse(argc, argv);
    } catch (const cxxopts::exceptions::exception& e) {
        std::fprintf(stderr, "scmoe_libtorch_moe: %s (see --help)\n", e.what());
        return 2;
    }
    if (args.count("help")) {
        std::printf("%s\n", options.help().c_str());
        return 0;
    }
    const std::int64_t T = args["tokens"].as<std::int64_t>();
    const int steps = args["steps"].as<int>();
    const double rtol = args["rtol"].as<double>(), lr = args["lr"].as<double>();
    const std::string optimizer_name = args["optimizer"].as<std::string>();
    scmoe::MoeConfig cfg;
    cfg.hidden = args["hidden"].as<std::int64_t>();
    cfg.ffn = args["ffn"].as<std::int64_t>();
    cfg.num_experts = args["experts"].as<int>();
    cfg.top_k = args["top-k"].as<int>();
    cfg.dispatch = scmoe::DispatchMode::kDropless;
    cfg.dtype = scmoe::DType::kF32;
    cfg.aux_loss_coef = args["aux-coef"].as<float>();
    cfg.z_loss_coef = args["z-coef"].as<float>();
    try {
        cfg.activation = scmoe::parse_activation(args["activation"].as<std::string>());
        cfg.validate();
        if (T < 1 || steps < 1 || !(rtol > 0) || !(lr > 0))
            throw std::invalid_argument("--tokens, --steps, --rtol and --lr must be positive");
        if (optimizer_name != "adam" && optimizer_name != "sgd")
            throw std::invalid_argument("--optimizer " + optimizer_name + ": expected adam or sgd");
    } catch (const std::exception& e) {
        std::fprintf(stderr, "scmoe_libtorch_moe: %s (see --help)\n", e.what());
        return 2;
    }
    const std::int64_t H = cfg.hidden, F = cfg.ffn;
    const std::uint64_t seed = args["seed"].as<std::uint64_t>();

    auto device = scmoe::make_device("cpu");
    auto stream = device->create_stream();
    std::printf("# scmoe_libtorch_moe: libtorch %s, scmoe's MoeLayer on %s\n", TORCH_VERSION,
                device->description().c_str());
    std::printf("# command: %s\n", command_line(argc, argv).c_str());
    std::printf("# layer: %s (dropless, softmax gating, top-%d, %s experts, no shared expert; f32); %lld tokens\n",
                cfg.to_string().c_str(), cfg.top_k, scmoe::activation_name(cfg.activation), static_cast<long long>(T));

    scmoe::MoeLayer layer(cfg, *device, T);
    scmoe::MoeParamStore store(*device, cfg, scmoe::DType::kF32);
    store.init(seed, *stream);
    // scmoe -> torch: the parameters stay in scmoe's store; torch's tensors are views of it (the store
    // outlives them: it is declared first). The optimizer updates them in place, where scmoe reads them.
    const scmoe::MoeParams& view = store.view();
    auto as_torch = [&](const scmoe::Tensor& t) {
        return at::fromDLPackVersioned(scmoe::to_dlpack_versioned(t, *device));
    };
    torch::Tensor gate_w = as_torch(view.gate_w), expert_w1 = as_torch(view.expert_w1),
                  expert_w2 = as_torch(view.expert_w2);
    if (gate_w.data_ptr() != view.gate_w.data || expert_w1.data_ptr() != view.expert_w1.data ||
        expert_w2.data_ptr() != view.expert_w2.data) {
        std::printf("scmoe libtorch example FAILED: torch's parameters are not views of scmoe's store\n");
        return 1;
    }
    {
        // scmoe's init draws N(0, 0.02^2); rescaled in place by torch to N(0, 1 / fan_in), so the router's
        // logits are O(1) and its top-k choices well separated.
        torch::NoGradGuard no_grad;
        const double init = scmoe::MoeParamStore::kInitStd;
        gate_w.mul_(1.0 / (std::sqrt(static_cast<double>(H)) * init));
        expert_w1.mul_(1.0 / (std::sqrt(static_cast<double>(H)) * init));
        expert_w2.mul_(1.0 / (std::sqrt(static_cast<double>(F)) * init));
    }
    for (torch::Tensor* p : {&gate_w, &expert_w1, &expert_w2}) p->requires_grad_(true);
    std::printf(
        "# parameters: torch tensors [%lld, %d], [%d, %lld, %lld], [%d, %lld, %lld] are views of scmoe's "
        "MoeParamStore (same data pointers; DLPack, no copy)\n",
        static_cast<long long>(H), cfg.num_experts, cfg.num_experts, static_cast<long long>(H),
        static_cast<long long>(cfg.expert_inner_width()), cfg.num_experts, static_cast<long long>(F),
        static_cast<long long>(H));

    std::unique_ptr<torch::optim::Optimizer> optimizer;
    const std::vector<torch::Tensor> params{gate_w, expert_w1, expert_w2};
    if (optimizer_name == "adam")
        optimizer = std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(lr));
    else
        optimizer = std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(lr));
    std::printf("# optimizer: torch::optim::%s, lr %g, %d steps; loss = mse(y, target) + %g * aux + %g * z\n",
                optimizer_name == "adam" ? "Adam" : "SGD", lr, steps, cfg.aux_loss_coef, cfg.z_loss_coef);

    torch::manual_seed(seed);
    const torch::Tensor x = torch::randn({T, H}), target = torch::randn({T, H});
    ScmoeMoe moe{*device, *stream, layer};
    std::vector<Agreement> agree{{"y"},        {"grad x"}, {"grad gate_w"}, {"grad expert_w1"}, {"grad expert_w2"},
                                 {"aux loss"}, {"z loss"}};
    std::int64_t routing_mismatches = 0;
    double first_loss = 0, last_loss = 0;
    std::printf("#%5s %12s %12s %12s %12s %12s\n", "step", "loss", "aux", "z", "y_err", "grad_err");
    for (int step = 0; step < steps; ++step) {
        // The reference, on copies of this step's parameters and input.
        const torch::Tensor rx = x.clone().requires_grad_(true), rg = gate_w.detach().clone().requires_grad_(true),
                            r1 = expert_w1.detach().clone().requires_grad_(true),
                            r2 = expert_w2.detach().clone().requires_grad_(true);
        const scmoe_example::ReferenceOutput ref = scmoe_example::reference_forward(cfg, rx, rg, r1, r2);
        (torch::mse_loss(ref.y, target) + cfg.aux_loss_coef * ref.aux + cfg.z_loss_coef * ref.z).backward();

        // scmoe, trained by the optimizer. The router losses' gradients come from the layer's backward.
        const torch::Tensor sx = x.clone().requires_grad_(true);
        const torch::Tensor y = MoeFunction::apply(sx, gate_w, expert_w1, expert_w2, &moe);
        const scmoe::MoeStats stats = layer.stats(*stream);
        const scmoe::MoeRouting routing = layer.routing(*stream);
        const torch::Tensor task_loss = torch::mse_loss(y, target);
        optimizer->zero_grad();
        task_loss.backward();

        const std::vector<std::pair<torch::Tensor, torch::Tensor>> pairs{
            {y, ref.y},
            {sx.grad(), rx.grad()},
            {gate_w.grad(), rg.grad()},
            {expert_w1.grad(), r1.grad()},
            {expert_w2.grad(), r2.grad()},
            {torch::tensor(stats.aux_loss, torch::kFloat64), ref.aux.to(torch::kFloat64)},
            {torch::tensor(stats.z_loss, torch::kFloat64), ref.z.to(torch::kFloat64)}};
        double y_err = 0, grad_err = 0;
        for (std::size_t i = 0; i < pairs.size(); ++i) {
            Agreement one{agree[i].name};
            one.add(pairs[i].first, pairs[i].second);
            agree[i].add(pairs[i].first, pairs[i].second);
            if (i == 0) y_err = one.rel_err;
            if (i >= 1 && i <= 4) grad_err = std::max(grad_err, one.rel_err);
        }
        const torch::Tensor ref_index = ref.expert_index.to(torch::kInt32).contiguous();
        const torch::Tensor got_index =
            torch::from_blob(const_cast<std::int32_t*>(routing.expert_index.data()), ref_index.sizes(), torch::kInt32);
        routing_mismatches += (got_index != ref_index).sum().item<std::int64_t>();

        const double loss =
            task_loss.item<double>() + cfg.aux_loss_coef * stats.aux_loss + cfg.z_loss_coef * stats.z_loss;
        if (step == 0) first_loss = loss;
        last_loss = loss;
        std::printf(" %5d %12.6f %12.6f %12.6f %12.3e %12.3e\n", step, loss, stats.aux_loss, stats.z_loss, y_err,
                    grad_err);
        optimizer->step();
    }

    std::printf(
        "# agreement with the libtorch reference, worst over %d steps; pass: max|scmoe - torch| <= rtol * "
        "max|torch|, rtol %g\n",
        steps, rtol);
    std::printf("#%-16s %14s %14s %14s %6s\n", "tensor", "max_abs_err", "max|torch|", "rel_err", "ok");
    bool ok = true;
    for (const Agreement& a : agree) {
        std::printf(" %-16s %14.3e %14.3e %14.3e %6s\n", a.name.c_str(), a.max_abs_err, a.ref_scale, a.rel_err,
                    a.ok(rtol) ? "ok" : "WRONG");
        ok = ok && a.ok(rtol);
    }
    const std::int64_t assignments = static_cast<std::int64_t>(steps) * T * cfg.top_k;
    std::printf("# routing: %lld of %lld token-to-expert assignments differ\n",
                static_cast<long long>(routing_mismatches), static_cast<long long>(assignments));
    std::printf("# loss: %.6f -> %.6f over %d steps\n", first_loss, last_loss, steps);
    if (!ok || routing_mismatches != 0) {
        std::printf("scmoe libtorch example FAILED: scmoe's layer and the libtorch reference disagree (above)\n");
        return 1;
    }
    if (steps > 1 && !(last_loss < first_loss)) {
        std::printf("scmoe libtorch example FAILED: the loss did not fall (%.6f -> %.6f)\n", first_loss, last_loss);
        return 1;
    }
    std::printf(
        "scmoe libtorch example ok: outputs, router losses, routing and gradients match libtorch within rtol "
        "%g over %d steps\n",
        rtol, steps);
    return 0;
}
