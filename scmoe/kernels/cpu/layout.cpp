#include <vector>

#include "scmoe/kernels/cpu/cpu_ops.h"
#include "scmoe/kernels/error.h"

namespace scmoe::cpu {

void compute_layout(const LayoutArgs& a) {
    const int E = a.num_experts, K = a.top_k;
    const std::int64_t rows = permuted_rows(a.tokens, E, K, a.capacity);
    for (int e = 0; e < E; ++e) a.expert_counts[e] = 0;
    for (std::int64_t i = 0; i < a.tokens * K; ++i) {
        const std::int32_t e = a.expert_index[i];
        SCMOE_CHECK(e >= 0 && e < E, "layout: expert index " << e << " at assignment " << i << " outside [0, " << E
                                                              << ")");
        ++a.expert_counts[e];
    }
    a.group_offsets[0] = 0;
    for (int e = 0; e < E; ++e) {
        a.group_offsets[e + 1] = a.capacity ? static_cast<std::int32_t>((e + 1) * a.capacity)
                                            : a.group_offsets[e] + a.expert_counts[e];
    }
    for (std::int64_t r = 0; r < rows; ++r) a.choice_of_row[r] = -1;
    std::vector<std::int64_t> fill(static_cast<std::size_t>(E), 0);
    std::int32_t dropped = 0;
    for (int j = 0; j < K; ++j) {
        for (std::int64_t t = 0; t < a.tokens; ++t) {
            const std::int64_t choice = t * K + j;
            const std::int32_t e = a.expert_index[choice];
            std::int64_t& pos = fill[static_cast<std::size_t>(e)];
            if (a.capacity && pos >= a.capacity) {
                a.slot_of_choice[choice] = -1;
                ++dropped;
                continue;
            }
            const std::int64_t row = a.group_offsets[e] + pos++;
            a.slot_of_choice[choice] = static_cast<std::int32_t>(row);
            a.choice_of_row[row] = static_cast<std::int32_t>(choice);
        }
    }
    *a.dropped = dropped;
}

}  // namespace scmoe::cpu
