#include <cstring>

#include "scmoe/kernels/cpu/cpu_ops.h"
#include "scmoe/kernels/error.h"

namespace scmoe::cpu {

void copy_row_segments(const RowSegmentsArgs& a) {
    const std::size_t row_bytes = static_cast<std::size_t>(a.hidden) * dtype_size(a.dtype);
    const auto* in = static_cast<const char*>(a.in);
    auto* out = static_cast<char*>(a.out);
    for (int s = 0; s < a.num_segments; ++s) {
        SCMOE_CHECK(a.counts[s] >= 0 && a.from_rows[s] >= 0 && a.to_rows[s] >= 0,
                    "copy_row_segments: segment " << s << " has rows " << a.from_rows[s] << " -> " << a.to_rows[s]
                                                  << ", count " << a.counts[s]);
        if (a.counts[s] == 0) continue;
        std::memcpy(out + static_cast<std::size_t>(a.to_rows[s]) * row_bytes,
                    in + static_cast<std::size_t>(a.from_rows[s]) * row_bytes,
                    static_cast<std::size_t>(a.counts[s]) * row_bytes);
    }
}

}  // namespace scmoe::cpu
