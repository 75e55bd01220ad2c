#include "launch/plan.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <sstream>
#include <tuple>

#include "scmoe/kernels/activation.h"
#include "scmoe/kernels/emu/emu_device.h"
#include "scmoe/kernels/error.h"
#include "launch/emu_choice.h"
#include "launch/emu_stack.h"
#include "launch/train_comms.h"
#include "scmoe/models/trainer.h"
#include "scmoe/moe/moe_layer.h"
#include "scmoe/moe/trace.h"

namespace scmoe::launch {

namespace {

std::string chunks_name(int c) { return c == 0 ? "auto" : std::to_string(c); }

std::string number(double v) {
    std::ostringstream os;
    os << v;
    return os.str();
}

bool is_gradient_reduce(const TraceEntry& e) { return e.comm && e.name.rfind("grad_allreduce", 0) == 0; }

}  // namespace

std::vector<PlanCase> plan_cases(const PlanRequest& r) {
    const int world = r.cluster.world_size();
    const std::vector<std::int64_t> batches = r.space.batches.empty() ? std::vector<std::int64_t>{4} : r.space.batches;
    std::vector<PlanCase> out;
    for (const std::string& v : r.space.variants)
        for (int ep : r.space.ep) {
            SCMOE_CHECK(ep >= 1 && world % ep == 0 && r.model.moe.num_experts % ep == 0,
                        "ep " << ep << ": must divide the " << world << " GPUs and the " << r.model.moe.num_experts
                              << " experts");
            for (int chunks : r.space.chunks)
                for (DispatchMode d : r.space.dispatch) {
                    // Dropless has no capacity: one case, whatever the capacity factors.
                    const std::vector<float> cfs =
                        d == DispatchMode::kDropless ? std::vector<float>{r.space.capacity_factors.front()}
                                                     : r.space.capacity_factors;
                    for (float cf : cfs)
                        for (std::int64_t batch : batches) {
                            PlanCase c;
                            c.variant = v;
                            c.ep = ep;
                            c.dp = world / ep;
                            // A piece is a group of the local experts, or with one expert per rank a
                            // slice of its rows.
                            c.chunks = std::min(chunks, max_pipeline_pieces(r.model.moe.num_experts, ep));
                            c.dispatch = d;
                            c.capacity_factor = cf;
                            c.batch = batch;
                            out.push_back(c);
                        }
                }
        }
    return out;
}

void run_plan_case(const PlanRequest& r, PlanCase& c) {
    const int world = r.cluster.world_size();
    models::TrainConfig config;
    config.model = r.model;
    config.model.variant = c.variant;
    config.model.moe.dispatch = c.dispatch;
    config.model.moe.capacity_factor = c.capacity_factor;
    config.batch = c.batch;
    config.steps = r.steps;
    apply_grad_reduce(load_stack(r.emu.stack), config);  // as scmoe-train's emulated run of the printed command
    std::vector<PlanCase> per_rank(static_cast<std::size_t>(world), c);
    std::vector<char> peer_failed(static_cast<std::size_t>(world), 0);  // the rank's error is a peer's CommError
    try {
        config.model.validate();
        LocalTrainGroups groups(world, c.ep, r.cluster);
        run_local_ranks(groups, world, [&](int rank, const RankComms& comms) {
            PlanCase& mine = per_rank[static_cast<std::size_t>(rank)];
            auto device = make_emu_device(r.emu);
            // Outlives the catch: a rank that fails (out of memory at construction, or a step's error
            // on this rank only, e.g. a dropless receive beyond the workspace under skewed routing)
            // abandons its groups before its trainer unwinds, so its peers' collectives fail at once
            // instead of waiting for it.
            std::unique_ptr<models::Trainer> trainer;
            std::unique_ptr<Tracer> trace;
            try {
                trainer = std::make_unique<models::Trainer>(config, *device, models::ParallelLayout{world, rank, c.ep},
                                                            comms.comms());
                trainer->model().blocks().set_expert_chunks(c.chunks);
                trace = std::make_unique<Tracer>(*device, rank);
                trainer->set_trace(trace.get());
                double ms = 0, tps = 0, exposed = 0, a2a = 0, comm = 0, dropped = 0;
                for (int s = 0; s < r.steps; ++s) {
                    trace->clear();
                    const models::StepMetrics m = trainer->step();
                    if (s == 0) continue;
                    ms += m.step_ms, tps += m.tokens_per_s, exposed += m.exposed_comm_pct;
                    dropped += static_cast<double>(m.dropped_tokens);
                    // The exposed time split: the all-to-all's alone (the gradient all-reduce's entries
                    // left out), the gradient all-reduce's the rest of the step's exposed time.
                    const std::vector<TraceEntry>& all = trace->entries();
                    std::vector<TraceEntry> no_grad;
                    std::copy_if(all.begin(), all.end(), std::back_inserter(no_grad),
                                 [](const TraceEntry& e) { return !is_gradient_reduce(e); });
                    const double to_pct = 100.0 / (m.step_ms * 1000.0);
                    a2a += std::min(m.exposed_comm_pct, summarize_overlap(no_grad).exposed_us * to_pct);
                    comm += std::min(100.0, summarize_overlap(all).comm_us * to_pct);
                }
                const double timed = std::max(1, r.steps - 1);
                mine.step_ms = ms / timed;
                mine.tokens_per_s = tps / timed;
                mine.exposed_comm_pct = exposed / timed;
                mine.exposed_a2a_pct = a2a / timed;
                mine.exposed_grad_pct = std::max(0.0, mine.exposed_comm_pct - mine.exposed_a2a_pct);
                mine.comm_pct = comm / timed;
                mine.dropped_tokens = dropped / timed;
                trainer->set_trace(nullptr);
            } catch (const CommError& e) {
                groups.abandon(rank, e.what());
                mine.error = e.what();
                peer_failed[static_cast<std::size_t>(rank)] = true;
            } catch (const Error& e) {
                groups.abandon(rank, e.what());
                mine.error = e.what();
                mine.out_of_memory = mine.error.find("out of memory") != std::string::npos;
            }
            mine.peak_gib = static_cast<double>(emu::as_emu(*device).memory().peak) / (1ull << 30);
        });
    } catch (const std::exception& e) {
        c.error = e.what();
        c.out_of_memory = c.error.find("out of memory") != std::string::npos;
        return;
    }
    const PlanCase& lead = per_rank[0];
    c.step_ms = lead.step_ms;
    c.tokens_per_s = lead.tokens_per_s;
    c.exposed_comm_pct = lead.exposed_comm_pct;
    c.exposed_a2a_pct = lead.exposed_a2a_pct;
    c.exposed_grad_pct = lead.exposed_grad_pct;
    c.comm_pct = lead.comm_pct;
    c.dropped_tokens = lead.dropped_tokens;
    // The cause: a rank's own error, before the CommErrors its abandoning caused on the others.
    c.error.clear();
    c.out_of_memory = false;
    const PlanCase* cause = nullptr;
    for (int pass = 0; pass < 2 && !cause; ++pass)
        for (std::size_t i = 0; i < per_rank.size() && !cause; ++i)
            if (!per_rank[i].error.empty() && (pass == 1 || !peer_failed[i])) cause = &per_rank[i];
    if (cause) c.error = cause->error, c.out_of_memory = cause->out_of_memory;
    for (const PlanCase& p : per_rank) c.peak_gib = std::max(c.peak_gib, p.peak_gib);
    // The headroom: a peak above (1 - headroom) of the GPU's memory would not fit beside what the
    // emulator does not count.
    const double capacity_gib = static_cast<double>(r.emu.spec.memory_bytes) / (1ull << 30);
    const double usable_gib = (1.0 - r.memory_headroom) * capacity_gib;
    if (c.error.empty() && c.peak_gib > usable_gib) {
        std::ostringstream os;
        os.setf(std::ios::fixed);
        os.precision(2);
        os << "out of memory with the headroom: peak " << c.peak_gib << " GiB > " << usable_gib << " GiB ("
           << number(100 * (1 - r.memory_headroom)) << "% of " << capacity_gib << " GiB; --memory-headroom "
           << number(r.memory_headroom) << ")";
        c.error = os.str();
        c.out_of_memory = true;
    }
}

std::vector<PlanCase> run_plan(const PlanRequest& r, const std::function<void(const PlanCase&, std::size_t)>& progress) {
    std::vector<PlanCase> cases = plan_cases(r);
    std::vector<PlanCase> done;
    for (PlanCase c : cases) {
        if (!r.space.batches.empty()) {
            run_plan_case(r, c);
            done.push_back(c);
            if (progress) progress(done.back(), done.size() - 1);
            continue;
        }
        // Grow the batch until memory ends.
        for (std::int64_t b = c.batch; b <= r.space.max_batch; b *= 2) {
            PlanCase g = c;
            g.batch = b;
            run_plan_case(r, g);
            done.push_back(g);
            if (progress) progress(done.back(), done.size() - 1);
            if (!g.error.empty()) break;
        }
    }
    return done;
}

void rank_plan(std::vector<PlanCase>& cases) {
    std::stable_sort(cases.begin(), cases.end(), [](const PlanCase& a, const PlanCase& b) {
        const bool ok_a = a.error.empty(), ok_b = b.error.empty();
        if (ok_a != ok_b) return ok_a;
        return a.tokens_per_s > b.tokens_per_s;
    });
}

std::vector<std::string> search_edge_warnings(const PlanRequest& r, const std::vector<PlanCase>& cases,
                                              const PlanCase& best) {
    std::vector<std::string> out;
    // The same configuration but the batch: what was tried, and whether the next one ran out of memory.
    std::int64_t largest_tried = 0, smallest_tried = 0;
    bool larger_failed = false;
    for (const PlanCase& c : cases) {
        if (c.variant != best.variant || c.ep != best.ep || c.chunks != best.chunks || c.dispatch != best.dispatch ||
            c.capacity_factor != best.capacity_factor)
            continue;
        largest_tried = std::max(largest_tried, c.batch);
        smallest_tried = smallest_tried == 0 ? c.batch : std::min(smallest_tried, c.batch);
        if (c.batch > best.batch && c.out_of_memory) larger_failed = true;
    }
    if (best.batch == largest_tried && !larger_failed) {
        if (r.space.batches.empty())
            out.push_back("the winner's micro-batch " + std::to_string(best.batch) +
                          " is the largest the search tries (max " + std::to_string(r.space.max_batch) +
                          ") and still fits: a larger one may be faster");
        else
            out.push_back("the winner's micro-batch " + std::to_string(best.batch) +
                          " is the largest tried (--batches) and fits in memory: try larger ones (or leave "
                          "--batches out: the search then grows the batch until memory ends)");
    }
    if (best.batch == smallest_tried && smallest_tried != largest_tried)
        out.push_back("the winner's micro-batch " + std::to_string(best.batch) +
                      " is the smallest tried: try smaller ones (--batches)");
    const int world = r.cluster.world_size();
    const int max_ep = *std::max_element(r.space.ep.begin(), r.space.ep.end());
    const int min_ep = *std::min_element(r.space.ep.begin(), r.space.ep.end());
    int possible_max = 1, possible_min = world;
    for (int ep = 1; ep <= world; ++ep)
        if (world % ep == 0 && r.model.moe.num_experts % ep == 0) {
            possible_max = std::max(possible_max, ep);
            possible_min = std::min(possible_min, ep);
        }
    if (best.ep == max_ep && max_ep < possible_max)
        out.push_back("the winner's expert-parallel size " + std::to_string(best.ep) +
                      " is the largest tried (--ep); up to " + std::to_string(possible_max) + " divides the GPUs and "
                      "experts");
    if (best.ep == min_ep && min_ep > possible_min)
        out.push_back("the winner's expert-parallel size " + std::to_string(best.ep) +
                      " is the smallest tried (--ep); " + std::to_string(possible_min) + " is possible");
    if (best.dispatch == DispatchMode::kCapacity && r.space.capacity_factors.size() > 1) {
        const auto [lo, hi] = std::minmax_element(r.space.capacity_factors.begin(), r.space.capacity_factors.end());
        if (best.capacity_factor == *lo)
            out.push_back("the winner's capacity factor " + number(best.capacity_factor) +
                          " is the smallest tried (--capacity-factors): a smaller one drops more tokens, and may "
                          "be faster");
        else if (best.capacity_factor == *hi)
            out.push_back("the winner's capacity factor " + number(best.capacity_factor) +
                          " is the largest tried (--capacity-factors)");
    }
    if (r.space.variants.size() == 1)
        out.push_back("only one variant was searched (--variants): the winner is that variant's best configuration");
    return out;
}

PlanCommands plan_commands(const PlanRequest& r, const PlanCase& c) {
    const models::LmConfig& m = r.model;
    const int world = r.cluster.world_size();
    std::ostringstream shape;
    shape << " --layers " << m.layers << " --hidden " << m.backbone.hidden << " --heads " << m.backbone.heads
          << " --seq " << m.backbone.seq_len << " --ffn " << m.backbone.ffn << " --experts " << m.moe.num_experts
          << " --expert-ffn " << m.moe.ffn << " --vocab " << m.vocab;
    // The replayed command starts from scmoe-train's default preset (tiny: multi-head, GELU): the
    // shape's GQA and SwiGLU must be spelled out (named only where they differ, so MHA/GELU plans
    // print as before).
    if (backbone_kv_heads(m.backbone) != m.backbone.heads) shape << " --kv-heads " << m.backbone.kv_heads;
    if (m.backbone.activation != Activation::kGeLU) shape << " --activation " << activation_name(m.backbone.activation);
    std::ostringstream config;
    config << " --variants " << c.variant << " --ep " << c.ep << " --batch " << c.batch << " --dispatch "
           << dispatch_mode_name(c.dispatch);
    if (c.dispatch == DispatchMode::kCapacity) config << " --capacity-factor " << number(c.capacity_factor);
    config << " --chunks " << chunks_name(c.chunks);
    PlanCommands out;
    out.train_emu = "scmoe-train --backend emu " + emu_choice_flags(r.emu) + " --ranks " + std::to_string(world) +
                    config.str() + shape.str() + " --steps " + std::to_string(r.steps) + " --quiet";
    {
        // The MoE block of the configuration on its expert-parallel group (ranks 0..ep-1 of the same
        // cluster): the tokens one GPU carries per step.
        std::ostringstream b;
        b << "scmoe-bench block --backend emu " << emu_choice_flags(r.emu) << " --ranks " << c.ep << " --variants "
          << c.variant << " --tokens " << c.batch * m.backbone.seq_len << " --hidden " << m.backbone.hidden
          << " --ffn " << m.moe.ffn << " --heads " << m.backbone.heads << " --seq " << m.backbone.seq_len
          << " --experts " << m.moe.num_experts << " --activation " << activation_name(m.backbone.activation)
          << " --dispatch " << dispatch_mode_name(c.dispatch) << " --capacity-factor " << number(c.capacity_factor)
          << " --chunks " << chunks_name(c.chunks);
        out.bench_emu = b.str();
    }
    std::ostringstream train_flags;
    train_flags << "--backend cuda" << config.str() << shape.str();
    std::ostringstream cuda;
    cuda << "mpirun -np " << world;
    // One process per GPU, a node's GPUs' processes on that node (Open MPI's ppr: processes per resource).
    if (r.cluster.nodes > 1) cuda << " --map-by ppr:" << r.cluster.gpus_per_node << ":node";
    cuda << " scmoe-train " << train_flags.str();
    out.train_cuda = cuda.str();
    if (r.cluster.nodes > 1)
        out.slurm = "sbatch --nodes=" + std::to_string(r.cluster.nodes) +
                    " --ntasks-per-node=" + std::to_string(r.cluster.gpus_per_node) +
                    " --gpus-per-node=" + std::to_string(r.cluster.gpus_per_node) + " launch/slurm.sbatch" +
                    config.str() + shape.str();
    return out;
}

std::string train_command(const PlanRequest& r, const PlanCase& c) { return plan_commands(r, c).train_cuda; }

}  // namespace scmoe::launch
