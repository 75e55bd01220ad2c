#include "scmoe/kernels/emu/residency.h"

#include <cstdint>

namespace scmoe::emu {

bool fits_beside(const GpuSpec& spec, const BlockResources& resident, const BlockResources& incoming) {
    if (spec.registers_per_sm <= 0 || resident.threads <= 0 || incoming.threads <= 0) return true;
    auto within = [](std::int64_t need, int limit) { return limit <= 0 || need <= limit; };
    const std::int64_t threads = std::int64_t{resident.threads} + incoming.threads;
    const std::int64_t registers = std::int64_t{resident.threads} * resident.registers_per_thread +
                                   std::int64_t{incoming.threads} * incoming.registers_per_thread;
    const std::int64_t shared = std::int64_t{resident.shared_bytes} + incoming.shared_bytes +
                                2 * std::int64_t{spec.shared_bytes_reserved_per_block};
    return within(threads, spec.threads_per_sm) && within(registers, spec.registers_per_sm) &&
           within(shared, spec.shared_bytes_per_sm) && within(2, spec.blocks_per_sm);
}

}  // namespace scmoe::emu
