#include "scmoe/kernels/layout.h"

#include <cmath>

namespace scmoe {

std::int64_t expert_capacity(std::int64_t tokens, int num_experts, int top_k, float capacity_factor) {
    if (tokens <= 0) return 1;
    const double c = std::ceil(static_cast<double>(capacity_factor) * static_cast<double>(tokens * top_k) /
                               static_cast<double>(num_experts));
    // An expert receives at most one row per token: a larger capacity holds nothing more (and a huge
    // factor, e.g. 1e30, would overflow the conversion).
    if (c >= static_cast<double>(tokens)) return tokens;
    return c < 1.0 ? 1 : static_cast<std::int64_t>(c);
}

std::int64_t permuted_rows(std::int64_t tokens, int num_experts, int top_k, std::int64_t capacity) {
    return capacity > 0 ? capacity * num_experts : tokens * top_k;
}

}  // namespace scmoe
