// scmoe-plan: design for your compute. Given a model and a cluster, trains every candidate
// configuration a few steps on emulated GPUs of that cluster and prints them ranked by predicted
// throughput, with the best one as the scmoe-train command to run. See launch/plan.h.
//
//   scmoe-plan --preset gpt2-moe-small --gpu a30 --cluster a30-pcie-8 -J plan.json
//   python3 launch/plan_chart.py chart.png plan.json [more.json ...]   # step time per variant
#include <algorithm>
#include <cstdlib>
#include <cxxopts.hpp>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "scmoe/comm/topology.h"
#include "scmoe/kernels/error.h"
#include "launch/cli_options.h"
#include "launch/emu_choice.h"
#include "launch/emu_stack.h"
#include "launch/plan.h"
#include "scmoe/moe/config.h"

namespace {

using namespace scmoe;
using namespace scmoe::launch;

constexpr int kExitUsage = 2, kExitError = 3;

struct UsageError : std::runtime_error {
    using std::runtime_error::runtime_error;
};


template <class T>
std::vector<T> numbers(const std::string& flag, const std::string& text) {
    std::vector<T> out;
    for (const std::string& item : split_comma_list(text)) {
        std::istringstream in(item);
        T v{};
        if (!(in >> v) || !in.eof() || v <= 0) throw UsageError("--" + flag + ": '" + item + "' is not a positive number");
        out.push_back(v);
    }
    if (out.empty()) throw UsageError("--" + flag + " is empty");
    return out;
}

struct Args {
    PlanRequest request;
    std::string model_name;  // "gpt2-moe-small: 12 layers, hidden 768, ..."
    std::string json;
};

std::string describe_shape(const std::string& preset, const models::LmConfig& m) {
    std::ostringstream os;
    os << preset << ": " << m.layers << " layers, hidden " << m.backbone.hidden << ", " << m.backbone.heads
       << " heads, seq " << m.backbone.seq_len << ", ffn " << m.backbone.ffn << ", " << m.moe.num_experts
       << " experts of ffn " << m.moe.ffn << ", vocab " << m.vocab;
    return os.str();
}

Args parse(int argc, char** argv) {
    cxxopts::Options o("scmoe-plan",
                       "scmoe-plan: design for your compute. Trains each candidate configuration a few steps on "
                       "emulated GPUs of your cluster (--backend emu) and ranks them by predicted tokens/s.\n"
                       "Predictions of a model (scmoe/kernels/emu/, scmoe/comm/topology.h), not measurements.");
    o.set_width(110);
    const std::string variants = block_variant_list();
    add_model_shape_options(o, "gpt2-moe-small", "50257");
    // clang-format off
    o.add_options("cluster")
        ("gpu", "The GPU: a30, a800, h100, h200 or a profile JSON (docs/emu.md)",
         cxxopts::value<std::string>()->default_value("h100"))
        ("cluster", "A cluster preset (scmoe/comm/topology.h: a30-pcie-8, a800-nvlink-8, a800-2x8, h100-nvlink-8, "
                    "h100-ib-2x8, h200-nvlink-8; default: the GPU's 8-GPU node)", cxxopts::value<std::string>())
        ("nodes", "Nodes (overrides the preset's; more than one needs NICs)", cxxopts::value<int>())
        ("gpus-per-node", "GPUs per node (overrides the preset's)", cxxopts::value<int>())
        ("fabric", "Within a node: nvlink or pcie (overrides the preset's; pcie = the GPU's PCIe link, 4 GPUs per "
                   "switch)", cxxopts::value<std::string>())
        ("nic-gbps", "Per node, one direction, all NICs together, GB/s (overrides the preset's)", cxxopts::value<double>())
        ("routing", "How the emulated router picks experts: balanced, zipf:S or counts:c0,c1,...",
         cxxopts::value<std::string>()->default_value("balanced"))
        ("stack", "The software stack around the kernels: scmoe (default), paper (fairseq + Tutel on PyTorch) or a "
                  "stack JSON (docs/emu.md)", cxxopts::value<std::string>()->default_value("scmoe"));
    o.add_options("search")
        ("variants", "Comma list of: " + variants, cxxopts::value<std::string>()->default_value("top2,shared,scmoe-pos2"))
        ("ep", "Expert-parallel sizes to try (default: every one that divides the GPUs and the experts)",
         cxxopts::value<std::string>())
        ("chunks", "Pipeline pieces to try: auto and/or N", cxxopts::value<std::string>()->default_value("auto"))
        ("capacity-factors", "Capacity factors to try", cxxopts::value<std::string>()->default_value("1.25"))
        ("batches", "Sequences per GPU per step (micro-batch) to try", cxxopts::value<std::string>()->default_value("8"))
        ("steps", "Emulated steps per candidate (the first, which calibrates, is not timed)",
         cxxopts::value<int>()->default_value("3"))
        ("J,json", "Write the ranked table as JSON (for launch/plan_chart.py)", cxxopts::value<std::string>())
        ("h,help", "Print this help and exit");
    // clang-format on
    const auto r = o.parse(argc, argv);
    if (r.count("help")) {
        std::cout << o.help({"model", "cluster", "search"}) << "\nExample:\n"
                  << "  scmoe-plan --preset gpt2-moe-small --gpu a30 --cluster a30-pcie-8 -J a30.json\n";
        std::exit(0);
    }
    if (!r.unmatched().empty()) throw UsageError("unexpected argument '" + r.unmatched()[0] + "'");
    Args a;
    PlanRequest& q = a.request;
    try {
        bool custom = false;
        models::LmConfig& m = q.model;
        m = read_model_shape_options(r, &custom);
        const EmuChoice choice = resolve_emu_choice(r["gpu"].as<std::string>(),
                                                    r.count("cluster") ? r["cluster"].as<std::string>() : "",
                                                    r["routing"].as<std::string>(), 1);
        q.emu = choice;
        q.emu.stack = r["stack"].as<std::string>();
        q.cluster = stack_topology(choice.cluster, load_stack(q.emu.stack));
        if (r.count("nodes")) q.cluster.nodes = r["nodes"].as<int>();
        if (r.count("gpus-per-node")) q.cluster.gpus_per_node = r["gpus-per-node"].as<int>();
        if (r.count("nic-gbps")) q.cluster.nic_gbps = r["nic-gbps"].as<double>();
        if (r.count("fabric")) {
            const std::string f = r["fabric"].as<std::string>();
            if (f == "pcie" && q.cluster.fabric != Topology::Fabric::kPcie) {
                q.cluster.fabric = Topology::Fabric::kPcie;
                q.cluster.gpu_link_gbps = q.emu.spec.host_link_gbps;
                q.cluster.gpus_per_switch = 4;
                q.cluster.switch_uplink_gbps = q.cluster.gpu_link_gbps;
                q.cluster.hop_latency_us = 5.7;
                q.cluster.comm_sms = 8;
            } else if (f == "nvlink" && q.cluster.fabric != Topology::Fabric::kNvlink) {
                throw UsageError("--fabric nvlink: start from an NVLink --cluster preset (its link bandwidth)");
            } else if (f != "pcie" && f != "nvlink") {
                throw UsageError("--fabric must be nvlink or pcie");
            }
        }
        if (q.cluster.nodes < 1 || q.cluster.gpus_per_node < 1) throw UsageError("--nodes and --gpus-per-node must be >= 1");
        if (q.cluster.nodes > 1 && q.cluster.nic_gbps <= 0) throw UsageError("more than one node needs --nic-gbps > 0");
        if (r.count("nodes") || r.count("gpus-per-node") || r.count("fabric") || r.count("nic-gbps"))
            q.cluster.name += "+custom";
        const int world = q.cluster.world_size();
        q.space.variants = split_comma_list(r["variants"].as<std::string>());
        if (q.space.variants.empty()) throw UsageError("--variants is empty");
        if (r.count("ep")) {
            q.space.ep = numbers<int>("ep", r["ep"].as<std::string>());
        } else {
            for (int ep = 1; ep <= world; ++ep)
                if (world % ep == 0 && m.moe.num_experts % ep == 0) q.space.ep.push_back(ep);
        }
        for (const std::string& c : split_comma_list(r["chunks"].as<std::string>()))
            q.space.chunks.push_back(c == "auto" ? 0 : numbers<int>("chunks", c).front());
        if (q.space.chunks.empty()) throw UsageError("--chunks is empty");
        q.space.capacity_factors = numbers<float>("capacity-factors", r["capacity-factors"].as<std::string>());
        q.space.batches = numbers<std::int64_t>("batches", r["batches"].as<std::string>());
        q.steps = r["steps"].as<int>();
        if (q.steps < 2) throw UsageError("--steps must be >= 2 (the first calibrates and is not timed)");
        for (const std::string& v : q.space.variants) {
            models::LmConfig c = m;
            c.variant = v;
            c.validate();
        }
        plan_cases(q);  // checks the ep sizes
        a.model_name = describe_shape(r["preset"].as<std::string>() + (custom ? "+custom" : ""), m);
    } catch (const Error& e) {
        throw UsageError(e.what());
    }
    if (r.count("json")) a.json = r["json"].as<std::string>();
    return a;
}

std::string chunks_name(int c) { return c == 0 ? "auto" : std::to_string(c); }

std::string format_ms(double ms) {
    std::ostringstream os;
    os << std::fixed << std::setprecision(1) << ms;
    return os.str();
}

int run(const Args& args) {
    const PlanRequest& q = args.request;
    std::vector<PlanCase> cases = plan_cases(q);
    std::cout << "# scmoe-plan: " << cases.size() << " candidate(s) on " << describe(q.cluster) << "\n"
              << "# GPU: " << make_emu_device(q.emu)->description() << "\n"
              << "# model: " << args.model_name << "\n"
              << "# predictions of the emulator (scmoe/kernels/emu/, scmoe/comm/topology.h), not measurements; " << q.steps
              << " steps per candidate, the first not timed" << std::endl;
    if (std::find(q.space.variants.begin(), q.space.variants.end(), "top1") != q.space.variants.end())
        std::cout << "# note: top1 sends each token to one expert: half the expert FLOPs per token of top2, shared, "
                     "scmoe-*; compare it knowing it is a smaller model"
                  << std::endl;
    for (std::size_t i = 0; i < cases.size(); ++i) {
        PlanCase& c = cases[i];
        run_plan_case(q, c);
        std::cout << "# [" << i + 1 << "/" << cases.size() << "] " << c.variant << " ep " << c.ep << " dp " << c.dp
                  << " chunks " << chunks_name(c.chunks) << " cf " << c.capacity_factor << " batch " << c.batch << ": "
                  << (c.error.empty() ? format_ms(c.step_ms) + " ms/step" : c.out_of_memory ? "out of memory" : "failed: " + c.error)
                  << std::endl;
    }
    rank_plan(cases);
    std::cout << "#\n# rank  variant          ep   dp chunks    cf  batch   step ms     tokens/s  exposed%  peak GiB  status\n";
    for (std::size_t i = 0; i < cases.size(); ++i) {
        const PlanCase& c = cases[i];
        std::cout << std::setw(6) << i + 1 << "  " << std::left << std::setw(15) << c.variant << std::right
                  << std::setw(4) << c.ep << std::setw(5) << c.dp << std::setw(7) << chunks_name(c.chunks) << std::fixed
                  << std::setprecision(2) << std::setw(6) << c.capacity_factor << std::setw(7) << c.batch
                  << std::setprecision(1) << std::setw(10) << c.step_ms << std::setprecision(0) << std::setw(13)
                  << c.tokens_per_s << std::setprecision(1) << std::setw(10) << c.exposed_comm_pct
                  << std::setprecision(2) << std::setw(10) << c.peak_gib << "  "
                  << (c.error.empty() ? "ok" : c.out_of_memory ? "OUT OF MEMORY" : "failed") << std::defaultfloat
                  << "\n";
    }
    const bool any = !cases.empty() && cases.front().error.empty();
    if (any) std::cout << "#\n# best: " << train_command(q, cases.front()) << "\n";
    else std::cout << "#\n# no candidate fits this cluster\n";
    if (!args.json.empty()) {
        nlohmann::ordered_json j;
        j["cluster"] = q.cluster.name;
        j["cluster_description"] = describe(q.cluster);
        j["gpu"] = q.emu.spec.name;
        j["model"] = args.model_name;
        j["routing"] = q.emu.routing;
        j["steps"] = q.steps;
        j["note"] = "predictions of the emulator, not measurements";
        j["cases"] = nlohmann::ordered_json::array();
        for (const PlanCase& c : cases)
            j["cases"].push_back({{"variant", c.variant},
                                  {"ep", c.ep},
                                  {"dp", c.dp},
                                  {"chunks", chunks_name(c.chunks)},
                                  {"capacity_factor", c.capacity_factor},
                                  {"batch", c.batch},
                                  {"step_ms", c.step_ms},
                                  {"tokens_per_s", c.tokens_per_s},
                                  {"exposed_comm_pct", c.exposed_comm_pct},
                                  {"peak_gib", c.peak_gib},
                                  {"out_of_memory", c.out_of_memory},
                                  {"error", c.error}});
        if (any) j["best_command"] = train_command(q, cases.front());
        std::ofstream f(args.json);
        if (!f) throw Error("-J " + args.json + ": cannot open for writing");
        f << j.dump(2) << "\n";
    }
    return any ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
    try {
        return run(parse(argc, argv));
    } catch (const UsageError& e) {
        std::cerr << "scmoe-plan: " << e.what() << " (see --help)" << std::endl;
        return kExitUsage;
    } catch (const cxxopts::exceptions::exception& e) {
        std::cerr << "scmoe-plan: " << e.what() << " (see --help)" << std::endl;
        return kExitUsage;
    } catch (const std::exception& e) {
        std::cerr << "scmoe-plan: error: " << e.what() << std::endl;
        return kExitError;
    }
}
