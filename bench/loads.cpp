#include "loads.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "common.h"

namespace scmoe::bench {

LoadKind parse_load(const std::string& name) {
    if (name == "balanced") return LoadKind::kBalanced;
    if (name == "zipf") return LoadKind::kZipf;
    throw UsageError("--loads: unknown load '" + name + "': expected balanced or zipf");
}

const char* load_name(LoadKind kind) { return kind == LoadKind::kBalanced ? "balanced" : "zipf"; }

std::vector<std::int64_t> expert_loads(LoadKind kind, std::int64_t rows, int num_experts, double zipf_exponent) {
    const auto E = static_cast<std::size_t>(num_experts);
    std::vector<std::int64_t> counts(E, 0);
    if (kind == LoadKind::kBalanced) {
        for (std::size_t e = 0; e < E; ++e)
            counts[e] = rows / num_experts + (static_cast<std::int64_t>(e) < rows % num_experts ? 1 : 0);
        return counts;
    }
    std::vector<double> share(E);
    for (std::size_t e = 0; e < E; ++e) share[e] = 1.0 / std::pow(static_cast<double>(e + 1), zipf_exponent);
    const double total = std::accumulate(share.begin(), share.end(), 0.0);
    std::vector<double> remainder(E);
    std::int64_t assigned = 0;
    for (std::size_t e = 0; e < E; ++e) {
        const double ideal = static_cast<double>(rows) * share[e] / total;
        counts[e] = static_cast<std::int64_t>(std::floor(ideal));
        remainder[e] = ideal - static_cast<double>(counts[e]);
        assigned += counts[e];
    }
    std::vector<std::size_t> order(E);
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t a, std::size_t b) { return remainder[a] > remainder[b]; });
    for (std::size_t i = 0; assigned < rows; i = (i + 1) % E, ++assigned) ++counts[order[i]];
    return counts;
}

std::vector<std::int32_t> group_offsets(const std::vector<std::int64_t>& counts) {
    std::vector<std::int32_t> offsets(counts.size() + 1, 0);
    std::int64_t running = 0;
    for (std::size_t e = 0; e < counts.size(); ++e) {
        running += counts[e];
        if (running > std::numeric_limits<std::int32_t>::max())
            throw UsageError("grouped GEMM rows exceed the int32 range of group offsets");
        offsets[e + 1] = static_cast<std::int32_t>(running);
    }
    return offsets;
}

}  // namespace scmoe::bench
