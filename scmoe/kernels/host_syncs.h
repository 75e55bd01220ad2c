// Host syncs: the points where a host thread waits for device work to finish. Every backend's
// Stream::synchronize and Event::synchronize count one, for the thread that calls them, so a test
// or a benchmark can count the syncs a piece of code makes (MoeLayer's per-layer counts: README,
// "Host syncs"). The device-buffer communicators (NcclCommunicator, LocalCommunicator on CUDA,
// the emulated NCCL) wait through Stream::synchronize, so their waits count too; the CPU backend's
// communicators run as stream host tasks and do not wait.
#pragma once

#include <cstdint>

namespace scmoe {

// Host syncs made by the calling thread since it started.
std::uint64_t host_syncs_this_thread();

namespace detail {
// Called by each backend's synchronize (scmoe/kernels/cpu, scmoe/kernels/cuda, scmoe/kernels/emu).
void count_host_sync();
}  // namespace detail

}  // namespace scmoe
