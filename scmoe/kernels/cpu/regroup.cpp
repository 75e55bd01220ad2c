#include <cstring>
#include <vector>

#include "scmoe/kernels/cpu/cpu_ops.h"
#include "scmoe/kernels/error.h"

namespace scmoe::cpu {

void regroup(const RegroupArgs& a) {
    const int S = a.num_sources, L = a.num_local_experts;
    const std::size_t row_bytes = static_cast<std::size_t>(a.hidden) * dtype_size(a.dtype);
    // Start row of every chunk in both orders.
    std::vector<std::int64_t> src_major(static_cast<std::size_t>(S * L)), expert_major(src_major.size());
    std::int64_t row = 0;
    for (int s = 0; s < S; ++s)
        for (int e = 0; e < L; ++e) {
            SCMOE_CHECK(a.counts[s * L + e] >= 0, "regroup: negative count " << a.counts[s * L + e] << " for source "
                                                                             << s << ", local expert " << e);
            src_major[static_cast<std::size_t>(s * L + e)] = row;
            row += a.counts[s * L + e];
        }
    row = 0;
    for (int e = 0; e < L; ++e)
        for (int s = 0; s < S; ++s) {
            expert_major[static_cast<std::size_t>(s * L + e)] = row;
            row += a.counts[s * L + e];
        }
    const auto* in = static_cast<const char*>(a.in);
    auto* out = static_cast<char*>(a.out);
    for (std::size_t c = 0; c < src_major.size(); ++c) {
        const std::int64_t from = a.to_expert_major ? src_major[c] : expert_major[c];
        const std::int64_t to = a.to_expert_major ? expert_major[c] : src_major[c];
        std::memcpy(out + static_cast<std::size_t>(to) * row_bytes, in + static_cast<std::size_t>(from) * row_bytes,
                    static_cast<std::size_t>(a.counts[c]) * row_bytes);
    }
}

}  // namespace scmoe::cpu
