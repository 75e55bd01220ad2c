// EmulatedLink's hold on CUDA streams: a device-side timer instead of a host callback that sleeps
// (review L2: callbacks of every stream share the driver's one callback thread, so a sleeping link
// stalled the backbone's callbacks). Private to comm/; no CUDA types, built only with CUDA.
//
// Per op: a start kernel stamps %globaltimer, the wrapped op runs, then a hold kernel (one thread
// of one CTA) stamps the wrapped op's end and spins with __nanosleep until start + hold, then
// stamps its own end. The stamps live in mapped pinned host memory, so the host reads them after a
// sync without a copy; end_ns != 0 says the hold has finished (written last, after a system fence).
#pragma once

#include <cstdint>

namespace scmoe::comm_detail {

struct LinkStamps {
    std::uint64_t start_ns = 0;        // %globaltimer when the op reached the stream
    std::uint64_t wrapped_end_ns = 0;  // when the wrapped op had finished (the hold kernel started)
    std::uint64_t end_ns = 0;          // when the hold ended; 0 while it has not
    std::uint64_t unused = 0;
};

// `count` zeroed stamps in pinned host memory mapped into every device's address space.
LinkStamps* allocate_link_stamps(int count);
void free_link_stamps(LinkStamps* stamps);

// Enqueue the two kernels on `stream` (a cudaStream_t), on the stream's device.
void link_timer_start_cuda(LinkStamps* stamps, void* stream);
void link_timer_hold_cuda(LinkStamps* stamps, std::uint64_t hold_ns, void* stream);

// Reads end_ns with acquire order (0: the hold has not finished).
std::uint64_t link_stamps_end_ns(const LinkStamps& stamps);

}  // namespace scmoe::comm_detail
