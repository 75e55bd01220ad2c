#include "scmoe/moe/grad_reduction.h"

#include <vector>

#include "scmoe/comm/communicator.h"
#include "scmoe/kernels/error.h"

namespace scmoe {

void all_reduce_moe_grads(const MoeConfig& config, const MoeGrads& grads, int ep_size, Communicator* data_parallel,
                          Communicator* expert_replicas, Stream& stream) {
    check_moe_params(config, grads, DType::kF32, "all_reduce_moe_grads: MoeGrads", ep_size);
    const int world = data_parallel ? data_parallel->size() : 1;
    const int replicas = expert_replicas ? expert_replicas->size() : 1;
    SCMOE_CHECK(world == ep_size * replicas,
                "all_reduce_moe_grads: the data-parallel group has "
                    << world << " ranks, but ep_size " << ep_size << " x the expert-replica group's " << replicas
                    << " ranks = " << ep_size * replicas
                    << " (data_parallel: every rank of the world; expert_replicas: the ranks holding the same experts)");
    struct Run {
        float* data;
        std::int64_t count;
        GradGroup group;
    };
    std::vector<Run> runs;
    const Tensor* t = grads.begin();
    for (const ParamSpec& spec : moe_param_specs(config, ep_size)) {
        const Tensor& g = *t++;
        if (spec.shape.empty()) continue;
        auto* p = g.as<float>();
        if (!runs.empty() && runs.back().group == spec.reduce_over && runs.back().data + runs.back().count == p) {
            runs.back().count += g.numel();
        } else {
            runs.push_back({p, g.numel(), spec.reduce_over});
        }
    }
    for (const Run& r : runs) {
        Communicator* c = r.group == GradGroup::kExpertReplicas ? expert_replicas : data_parallel;
        if (c && c->size() > 1) c->all_reduce_sum(r.data, r.count, DType::kF32, stream);
    }
}

}  // namespace scmoe
