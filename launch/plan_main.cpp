// scmoe-plan: design for your compute. Given a model and a cluster, trains every candidate
// configuration a few steps on emulated GPUs of that cluster and prints them ranked by predicted
// throughput, with the best one as the scmoe-train command to run. See launch/plan.h.
//
//   scmoe-plan --preset gpt2-moe-small --gpu a30 --cluster a30-pcie-8 -J plan.json
//   python3 launch/plan_chart.py chart.png plan.json [more.json ...]   # tokens/s per variant per cluster
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
    std::vector<double> nic_sweep;  // --nic-gbit-s A,B,...: one search per NIC speed
};

std::string describe_shape(const std::string& preset, const models::LmConfig& m) {
    std::ostringstream os;
    os << preset << ": " << m.layers << " layers, hidden " << m.backbone.hidden << ", " << m.backbone.heads
       << " heads, seq " << m.backbone.seq_len << ", ffn " << m.backbone.ffn << ", " << m.moe.num_experts
       << " experts of ffn " << m.moe.ffn << ", vocab " << m.vocab;
    return os.str();
}

std::string fixed(double v, int digits) {
    std::ostringstream os;
    os << std::fixed << std::setprecision(digits) << v;
    return os.str();
}

std::string band_text() {
    return "error band " + fixed(100 * kPredictionErrorBand.low, 0) + "%..+" +
           fixed(100 * kPredictionErrorBand.high, 0) + "% (" + kPredictionErrorBand.source + ")";
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
        ("gpu", "The GPU: a30, a800, h100, h200 or a profile JSON (docs/emu.md; a profile needs --cluster)",
         cxxopts::value<std::string>()->default_value("h100"))
        ("routing", "How the emulated router picks experts: balanced, zipf:S or counts:c0,c1,... (zipf shows as "
                    "dropped tokens in capacity mode and as slower steps in dropless mode)",
         cxxopts::value<std::string>()->default_value("balanced"))
        ("stack", "The software stack around the kernels: scmoe (default), paper (fairseq + Tutel on PyTorch), "
                  "paper-swin (Swin-MoE + Tutel under amp) or a stack JSON (docs/emu.md); its gradient all-reduce too (paper: after the backward, fp16-sized), "
                  "as scmoe-train's emulated run of a printed command takes it", cxxopts::value<std::string>()->default_value("scmoe"));
    add_cluster_options(o, "cluster", /*nic_list=*/true);
    o.add_options("search")
        ("variants", "Comma list of: " + variants, cxxopts::value<std::string>()->default_value("top2,shared,scmoe-pos2"))
        ("ep", "Expert-parallel sizes to try (default: every one that divides the GPUs and the experts)",
         cxxopts::value<std::string>())
        ("chunks", "Pipeline pieces to try: auto and/or N", cxxopts::value<std::string>()->default_value("auto"))
        ("dispatch", "Dispatch modes to try: capacity and/or dropless", cxxopts::value<std::string>()->default_value("capacity,dropless"))
        ("capacity-factors", "Capacity factors to try (capacity mode)", cxxopts::value<std::string>()->default_value("1.25"))
        ("batches", "Sequences per GPU per step (micro-batch) to try (default: 4, 8, 16, ... doubling for each "
                    "configuration until it runs out of memory or reaches --max-batch)", cxxopts::value<std::string>())
        ("max-batch", "The largest micro-batch the default batch search tries", cxxopts::value<std::int64_t>()->default_value("128"))
        ("memory-headroom", "Fraction of each GPU's memory kept free (CUDA context, NCCL buffers, fragmentation, "
                            "which the emulator does not count): a candidate whose predicted peak exceeds the rest "
                            "is marked out of memory", cxxopts::value<double>()->default_value(fixed(kDefaultMemoryHeadroom, 2)))
        ("steps", "Emulated steps per candidate (the first, which calibrates, is not timed)",
         cxxopts::value<int>()->default_value("3"))
        ("J,json", "Write the ranked table as JSON (for launch/plan_chart.py)", cxxopts::value<std::string>())
        ("h,help", "Print this help and exit");
    // clang-format on
    const auto r = o.parse(argc, argv);
    if (r.count("help")) {
        std::cout << o.help({"model", "cluster", "search"}) << "\nExamples:\n"
                  << "  scmoe-plan --preset gpt2-moe-small --gpu a30 --cluster a30-pcie-8 -J a30.json\n"
                  << "  scmoe-plan --gpu a800 --cluster a800-2x8 --nic-gbit-s 100,200,400 --variants top2,scmoe-pos2 "
                     "--batches 8   # a NIC-speed sweep\n";
        std::exit(0);
    }
    if (!r.unmatched().empty()) throw UsageError("unexpected argument '" + r.unmatched()[0] + "'");
    Args a;
    PlanRequest& q = a.request;
    try {
        bool custom = false;
        models::LmConfig& m = q.model;
        m = read_model_shape_options(r, &custom);
        const ClusterFlags flags = read_cluster_options(r, &a.nic_sweep);
        q.emu = resolve_emu_choice(r["gpu"].as<std::string>(), r["routing"].as<std::string>(), flags, 1);
        q.emu.stack = r["stack"].as<std::string>();
        q.cluster = emulated_topology(q.emu.topology, q.emu.stack);
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
        for (const std::string& d : split_comma_list(r["dispatch"].as<std::string>())) {
            if (d != "capacity" && d != "dropless") throw UsageError("--dispatch " + d + ": expected capacity and/or dropless");
            q.space.dispatch.push_back(parse_dispatch_mode(d));
        }
        if (q.space.dispatch.empty()) throw UsageError("--dispatch is empty");
        q.space.capacity_factors = numbers<float>("capacity-factors", r["capacity-factors"].as<std::string>());
        if (r.count("batches")) q.space.batches = numbers<std::int64_t>("batches", r["batches"].as<std::string>());
        q.space.max_batch = r["max-batch"].as<std::int64_t>();
        if (q.space.max_batch < 4) throw UsageError("--max-batch must be >= 4 (the batch search starts at 4)");
        q.memory_headroom = r["memory-headroom"].as<double>();
        if (!(q.memory_headroom >= 0 && q.memory_headroom < 1))
            throw UsageError("--memory-headroom " + fixed(q.memory_headroom, 3) +
                             ": expected a fraction of the GPU's memory in [0, 1), e.g. 0.1 keeps 10% free");
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

std::string status(const PlanCase& c) { return c.error.empty() ? "ok" : c.out_of_memory ? "OUT OF MEMORY" : "failed"; }

void print_header(const PlanRequest& q, const std::string& model_name) {
    std::cout << "# scmoe-plan on " << describe(q.cluster) << "\n";
    for (const std::string& note : cluster_notes(q.emu)) std::cout << "# " << note << "\n";
    const double capacity_gib = static_cast<double>(q.emu.spec.memory_bytes) / (1ull << 30);
    std::cout << "# GPU " << q.emu.spec.name << " (--gpu " << q.emu.gpu << "): " << make_emu_device(q.emu)->description()
              << "\n"
              << "# model: " << model_name << "\n"
              << "# emulated: predictions of the emulator (scmoe/kernels/emu/, scmoe/comm/topology.h), not "
                 "measurements; "
              << q.steps << " steps per candidate, the first not timed\n"
              << "# " << band_text() << ": a predicted P tokens/s allows a measured P/" << fixed(1 + kPredictionErrorBand.high, 2)
              << " .. P/" << fixed(1 + kPredictionErrorBand.low, 2) << " (the range beside each prediction)\n"
              << "# memory: " << 100 * q.memory_headroom << "% of each GPU's " << fixed(capacity_gib, 1)
              << " GiB kept free (--memory-headroom " << q.memory_headroom << "): a predicted peak above "
              << fixed((1 - q.memory_headroom) * capacity_gib, 2) << " GiB is out of memory" << std::endl;
    if (std::find(q.space.variants.begin(), q.space.variants.end(), "top1") != q.space.variants.end())
        std::cout << "# note: top1 sends each token to one expert: half the expert FLOPs per token of top2, shared, "
                     "scmoe-*; compare it knowing it is a smaller model"
                  << std::endl;
}

void print_table(const std::vector<PlanCase>& cases) {
    std::cout << "#\n# rank  variant          ep   dp chunks dispatch    cf  batch   step ms     tokens/s (error band)"
                 "         exposed%  a2a%  grad%  comm%  dropped/step  peak GiB  status\n";
    for (std::size_t i = 0; i < cases.size(); ++i) {
        const PlanCase& c = cases[i];
        const bool ok = c.error.empty();
        std::ostringstream band;
        if (ok) band << "(" << fixed(band_low(c.tokens_per_s), 0) << "-" << fixed(band_high(c.tokens_per_s), 0) << ")";
        std::cout << std::setw(6) << i + 1 << "  " << std::left << std::setw(15) << c.variant << std::right
                  << std::setw(4) << c.ep << std::setw(5) << c.dp << std::setw(7) << chunks_name(c.chunks) << " "
                  << std::left << std::setw(8) << dispatch_mode_name(c.dispatch) << std::right
                  << std::setw(6) << (c.dispatch == DispatchMode::kCapacity ? fixed(c.capacity_factor, 2) : "-")
                  << std::setw(7) << c.batch << std::setw(10) << fixed(c.step_ms, 1) << std::setw(13)
                  << fixed(c.tokens_per_s, 0) << " " << std::left << std::setw(22) << band.str() << std::right
                  << std::setw(8) << fixed(c.exposed_comm_pct, 1) << std::setw(6) << fixed(c.exposed_a2a_pct, 1)
                  << std::setw(7) << fixed(c.exposed_grad_pct, 1) << std::setw(7) << fixed(c.comm_pct, 1)
                  << std::setw(14) << fixed(c.dropped_tokens, 0) << std::setw(10) << fixed(c.peak_gib, 2) << "  "
                  << status(c) << "\n";
    }
    std::cout << "# exposed%: of the step, communication with no compute beside it = a2a% (all-to-all) + grad% "
                 "(gradient all-reduce); comm%: of the step, any communication; dropped/step: token assignments "
                 "dropped by capacity, over every rank and MoE layer\n";
}

void print_best(const PlanRequest& q, const std::vector<PlanCase>& ranked, const std::vector<PlanCase>& tried) {
    if (ranked.empty() || !ranked.front().error.empty()) {
        std::cout << "#\n# no candidate fits this cluster\n";
        return;
    }
    const PlanCase& best = ranked.front();
    for (const std::string& w : search_edge_warnings(q, tried, best)) std::cout << "# warning: " << w << "\n";
    const PlanCommands cmd = plan_commands(q, best);
    std::cout << "#\n# best (predicted " << fixed(best.tokens_per_s, 0) << " tokens/s, error band "
              << fixed(band_low(best.tokens_per_s), 0) << "-" << fixed(band_high(best.tokens_per_s), 0)
              << "): " << best.variant << ", ep " << best.ep << " x dp " << best.dp << ", batch " << best.batch << "\n"
              << "# replay on emulated GPUs (scmoe-train and scmoe-bench take the same cluster flags):\n"
              << "replay-train: " << cmd.train_emu << "\n"
              << "replay-bench: " << cmd.bench_emu << "\n"
              << "# run it on the cluster (one process per GPU"
              << (q.cluster.nodes > 1 ? ", " + std::to_string(q.cluster.gpus_per_node) + " per node" : std::string())
              << "):\n"
              << "best: " << cmd.train_cuda << "\n";
    if (!cmd.slurm.empty())
        std::cout << "slurm: " << cmd.slurm << "\n"
                  << "# (launch/slurm.sbatch runs srun, one task per GPU, checkpointing; edit its partition)\n";
}

nlohmann::ordered_json plan_json(const Args& args, const PlanRequest& q, const std::vector<PlanCase>& cases,
                                 const std::vector<PlanCase>& tried) {
    nlohmann::ordered_json j;
    j["cluster"] = q.cluster.name;
    j["cluster_label"] = cluster_label(q.cluster);
    j["cluster_description"] = describe(q.cluster);
    j["cluster_flags"] = emu_choice_flags(q.emu);
    j["assumed"] = nlohmann::ordered_json::array();
    for (const std::string& n : cluster_notes(q.emu)) j["assumed"].push_back(n);
    j["world"] = q.cluster.world_size();
    j["nodes"] = q.cluster.nodes;
    j["nic_gbit_s"] = q.cluster.nodes > 1 ? q.cluster.nic_gbps * 8 : 0.0;
    j["gpu"] = q.emu.spec.name;
    j["gpu_description"] = q.emu.spec.description;
    j["model"] = args.model_name;
    j["routing"] = q.emu.routing;
    j["steps"] = q.steps;
    j["memory_headroom"] = q.memory_headroom;
    j["note"] = "emulated: predictions of the emulator, not measurements";
    j["error_band"] = {{"low", kPredictionErrorBand.low}, {"high", kPredictionErrorBand.high},
                       {"source", kPredictionErrorBand.source}};
    j["cases"] = nlohmann::ordered_json::array();
    for (const PlanCase& c : cases)
        j["cases"].push_back({{"variant", c.variant},
                              {"ep", c.ep},
                              {"dp", c.dp},
                              {"chunks", chunks_name(c.chunks)},
                              {"dispatch", dispatch_mode_name(c.dispatch)},
                              {"capacity_factor", c.capacity_factor},
                              {"batch", c.batch},
                              {"step_ms", c.step_ms},
                              {"tokens_per_s", c.tokens_per_s},
                              {"tokens_per_s_band", {band_low(c.tokens_per_s), band_high(c.tokens_per_s)}},
                              {"exposed_comm_pct", c.exposed_comm_pct},
                              {"exposed_a2a_pct", c.exposed_a2a_pct},
                              {"exposed_grad_pct", c.exposed_grad_pct},
                              {"comm_pct", c.comm_pct},
                              {"dropped_tokens_per_step", c.dropped_tokens},
                              {"peak_gib", c.peak_gib},
                              {"out_of_memory", c.out_of_memory},
                              {"error", c.error}});
    if (!cases.empty() && cases.front().error.empty()) {
        const PlanCommands cmd = plan_commands(q, cases.front());
        j["best_command"] = cmd.train_cuda;
        j["replay_train"] = cmd.train_emu;
        j["replay_bench"] = cmd.bench_emu;
        if (!cmd.slurm.empty()) j["slurm"] = cmd.slurm;
        j["warnings"] = search_edge_warnings(q, tried, cases.front());
    }
    return j;
}

// One search: prints its progress, table and best; returns its JSON.
nlohmann::ordered_json search(const Args& args, const PlanRequest& q, std::vector<PlanCase>* ranked_out) {
    print_header(q, args.model_name);
    const std::size_t configurations = plan_cases(q).size();
    std::cout << "# " << configurations << " candidate configuration(s)"
              << (q.space.batches.empty() ? ", each from batch 4 doubling until memory ends (max " +
                                                std::to_string(q.space.max_batch) + ")"
                                          : std::string())
              << std::endl;
    const std::vector<PlanCase> tried = run_plan(q, [](const PlanCase& c, std::size_t i) {
        std::cout << "# [" << i + 1 << "] " << c.variant << " ep " << c.ep << " dp " << c.dp << " chunks "
                  << chunks_name(c.chunks) << " " << dispatch_mode_name(c.dispatch) << " cf " << c.capacity_factor
                  << " batch " << c.batch << ": "
                  << (c.error.empty() ? fixed(c.step_ms, 1) + " ms/step"
                                   : c.out_of_memory ? "out of memory (" + c.error + ")" : "failed: " + c.error)
                  << std::endl;
    });
    std::vector<PlanCase> cases = tried;
    rank_plan(cases);
    print_table(cases);
    print_best(q, cases, tried);
    if (ranked_out) *ranked_out = cases;
    return plan_json(args, q, cases, tried);
}

// The best case of `variant` (or nullptr).
const PlanCase* best_of(const std::vector<PlanCase>& ranked, const std::string& variant) {
    for (const PlanCase& c : ranked)
        if (c.error.empty() && c.variant == variant) return &c;
    return nullptr;
}

int run(const Args& args) {
    if (args.nic_sweep.size() <= 1) {
        std::vector<PlanCase> ranked;
        const nlohmann::ordered_json j = search(args, args.request, &ranked);
        if (!args.json.empty()) {
            std::ofstream f(args.json);
            if (!f) throw Error("-J " + args.json + ": cannot open for writing");
            f << j.dump(2) << "\n";
        }
        return !ranked.empty() && ranked.front().error.empty() ? 0 : 1;
    }
    // The NIC-speed sweep: the same search at each speed, then one summary.
    nlohmann::ordered_json all;
    all["nic_sweep_gbit_s"] = args.nic_sweep;
    all["plans"] = nlohmann::ordered_json::array();
    std::vector<std::pair<double, std::vector<PlanCase>>> results;
    for (double speed : args.nic_sweep) {
        PlanRequest q = args.request;
        ClusterFlags flags = q.emu.flags;
        flags.nic_gbit_s = speed;
        const std::string stack = q.emu.stack;
        q.emu = resolve_emu_choice(q.emu.gpu, q.emu.routing, flags, 1);
        q.emu.stack = stack;
        q.cluster = emulated_topology(q.emu.topology, stack);
        std::cout << "#\n# ===== NIC " << describe_nic_rate(q.cluster.nic_gbps) << " per node =====\n";
        std::vector<PlanCase> ranked;
        all["plans"].push_back(search(args, q, &ranked));
        results.emplace_back(speed, std::move(ranked));
    }
    std::cout << "#\n# NIC-speed sweep (emulated; " << band_text() << "): each variant's best configuration\n"
              << "# NIC Gb/s   GB/s  variant          ep  batch     tokens/s  comm% of step  exposed%  exposed % of comm\n";
    all["summary"] = nlohmann::ordered_json::array();
    for (const auto& [speed, ranked] : results)
        for (const std::string& v : args.request.space.variants) {
            const PlanCase* c = best_of(ranked, v);
            if (!c) continue;
            const double of_comm = c->comm_pct > 0 ? 100.0 * c->exposed_comm_pct / c->comm_pct : 0.0;
            std::cout << "# " << std::setw(8) << fixed(speed, 0) << std::setw(7) << fixed(speed / 8, 1) << "  "
                      << std::left << std::setw(15) << v << std::right << std::setw(4) << c->ep << std::setw(7)
                      << c->batch << std::setw(13) << fixed(c->tokens_per_s, 0) << std::setw(15)
                      << fixed(c->comm_pct, 1) << std::setw(10) << fixed(c->exposed_comm_pct, 1) << std::setw(19)
                      << fixed(of_comm, 1) << "\n";
            all["summary"].push_back({{"nic_gbit_s", speed},
                                      {"variant", v},
                                      {"ep", c->ep},
                                      {"batch", c->batch},
                                      {"tokens_per_s", c->tokens_per_s},
                                      {"comm_pct", c->comm_pct},
                                      {"exposed_comm_pct", c->exposed_comm_pct},
                                      {"exposed_pct_of_comm", of_comm}});
        }
    if (!args.json.empty()) {
        std::ofstream f(args.json);
        if (!f) throw Error("-J " + args.json + ": cannot open for writing");
        f << all.dump(2) << "\n";
    }
    return 0;
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
