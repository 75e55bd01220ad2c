#include "launch/plan.h"

#include <algorithm>
#include <mutex>
#include <sstream>

#include "scmoe/kernels/emu/emu_device.h"
#include "scmoe/kernels/error.h"
#include "launch/emu_choice.h"
#include "launch/train_comms.h"
#include "scmoe/models/trainer.h"

namespace scmoe::launch {

std::vector<PlanCase> plan_cases(const PlanRequest& r) {
    const int world = r.cluster.world_size();
    std::vector<PlanCase> out;
    for (const std::string& v : r.space.variants)
        for (int ep : r.space.ep) {
            SCMOE_CHECK(ep >= 1 && world % ep == 0 && r.model.moe.num_experts % ep == 0,
                        "ep " << ep << ": must divide the " << world << " GPUs and the " << r.model.moe.num_experts
                              << " experts");
            for (int chunks : r.space.chunks)
                for (float cf : r.space.capacity_factors)
                    for (std::int64_t batch : r.space.batches) {
                        PlanCase c;
                        c.variant = v;
                        c.ep = ep;
                        c.dp = world / ep;
                        c.chunks = std::min(chunks, r.model.moe.num_experts / ep);
                        c.capacity_factor = cf;
                        c.batch = batch;
                        out.push_back(c);
                    }
        }
    return out;
}

void run_plan_case(const PlanRequest& r, PlanCase& c) {
    const int world = r.cluster.world_size();
    models::TrainConfig config;
    config.model = r.model;
    config.model.variant = c.variant;
    config.model.moe.capacity_factor = c.capacity_factor;
    config.batch = c.batch;
    config.steps = r.steps;
    std::vector<PlanCase> per_rank(static_cast<std::size_t>(world), c);
    try {
        config.model.validate();
        LocalTrainGroups groups(world, c.ep, r.cluster);
        run_local_ranks(groups, world, [&](int rank, const RankComms& comms) {
            PlanCase& mine = per_rank[static_cast<std::size_t>(rank)];
            auto device = make_emu_device(r.emu);
            try {
                models::Trainer trainer(config, *device, {world, rank, c.ep}, comms.comms());
                trainer.model().blocks().set_expert_chunks(c.chunks);
                double ms = 0, tps = 0, exposed = 0;
                for (int s = 0; s < r.steps; ++s) {
                    const models::StepMetrics m = trainer.step();
                    if (s == 0) continue;
                    ms += m.step_ms, tps += m.tokens_per_s, exposed += m.exposed_comm_pct;
                }
                const double timed = std::max(1, r.steps - 1);
                mine.step_ms = ms / timed;
                mine.tokens_per_s = tps / timed;
                mine.exposed_comm_pct = exposed / timed;
            } catch (const Error& e) {
                // Out of memory is found at construction, on every rank alike (the same shapes), so no
                // rank is left waiting in a collective.
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
    c.error = lead.error;
    c.out_of_memory = lead.out_of_memory;
    for (const PlanCase& p : per_rank) {
        c.peak_gib = std::max(c.peak_gib, p.peak_gib);
        if (c.error.empty() && !p.error.empty()) c.error = p.error, c.out_of_memory = p.out_of_memory;
    }
}

void rank_plan(std::vector<PlanCase>& cases) {
    std::stable_sort(cases.begin(), cases.end(), [](const PlanCase& a, const PlanCase& b) {
        const bool ok_a = a.error.empty(), ok_b = b.error.empty();
        if (ok_a != ok_b) return ok_a;
        return a.tokens_per_s > b.tokens_per_s;
    });
}

std::string train_command(const PlanRequest& r, const PlanCase& c) {
    const models::LmConfig& m = r.model;
    std::ostringstream os;
    os << "mpirun -np " << r.cluster.world_size() << " scmoe-train --backend cuda --variants " << c.variant
       << " --ep " << c.ep << " --batch " << c.batch << " --capacity-factor " << c.capacity_factor << " --chunks "
       << (c.chunks == 0 ? std::string("auto") : std::to_string(c.chunks)) << " --layers " << m.layers
       << " --hidden " << m.backbone.hidden << " --heads " << m.backbone.heads << " --seq " << m.backbone.seq_len
       << " --ffn " << m.backbone.ffn << " --experts " << m.moe.num_experts << " --expert-ffn " << m.moe.ffn
       << " --vocab " << m.vocab;
    // The replayed command starts from scmoe-train's default preset (tiny: multi-head, GELU): the
    // shape's GQA and SwiGLU must be spelled out (named only where they differ, so MHA/GELU plans
    // print as before).
    if (backbone_kv_heads(m.backbone) != m.backbone.heads) os << " --kv-heads " << m.backbone.kv_heads;
    if (m.backbone.activation != Activation::kGeLU) os << " --activation " << activation_name(m.backbone.activation);
    return os.str();
}

}  // namespace scmoe::launch
