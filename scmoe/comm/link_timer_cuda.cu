// EmulatedLink's device-side hold (scmoe/comm/detail/link_timer_cuda.h).
#include <cuda_runtime.h>

#include "scmoe/comm/detail/cuda_util.h"
#include "scmoe/comm/detail/link_timer_cuda.h"
#include "scmoe/kernels/cuda/check.cuh"

namespace scmoe::comm_detail {
namespace {

// %globaltimer: the GPU's nanosecond clock (PTX ISA, "Special Registers: %globaltimer").
__device__ __forceinline__ unsigned long long global_timer_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__global__ void link_start_kernel(LinkStamps* stamps) {
    *reinterpret_cast<volatile unsigned long long*>(&stamps->start_ns) = global_timer_ns();
    __threadfence_system();
}

// NOTES: one thread; __nanosleep keeps the spinning warp off the issue slots of the SM it sits on,
// so the hold costs one CTA slot and no compute. end_ns is written after a system fence, so a host
// that sees it non-zero also sees the other stamps.
__global__ void link_hold_kernel(LinkStamps* stamps, unsigned long long hold_ns) {
    auto* s = reinterpret_cast<volatile unsigned long long*>(stamps);
    const unsigned long long start = s[0];
    unsigned long long now = global_timer_ns();
    s[1] = now;
    while (now - start < hold_ns) {
        __nanosleep(1000);
        now = global_timer_ns();
    }
    __threadfence_system();
    s[2] = now == 0 ? 1 : now;
}

}  // namespace

LinkStamps* allocate_link_stamps(int count) {
    void* p = nullptr;
    const std::size_t bytes = static_cast<std::size_t>(count) * sizeof(LinkStamps);
    SCMOE_CUDA_CHECK(cudaHostAlloc(&p, bytes, cudaHostAllocPortable | cudaHostAllocMapped));
    auto* stamps = static_cast<LinkStamps*>(p);
    for (int i = 0; i < count; ++i) stamps[i] = LinkStamps{};
    return stamps;
}

void free_link_stamps(LinkStamps* stamps) {
    if (stamps) cudaFreeHost(stamps);  // NOTES: called from destructors; an error here is not actionable
}

void link_timer_start_cuda(LinkStamps* stamps, void* stream) {
    auto s = static_cast<cudaStream_t>(stream);
    DeviceScope scope(cuda::stream_device(s));
    link_start_kernel<<<1, 1, 0, s>>>(stamps);
    SCMOE_CUDA_CHECK(cudaGetLastError());
}

void link_timer_hold_cuda(LinkStamps* stamps, std::uint64_t hold_ns, void* stream) {
    auto s = static_cast<cudaStream_t>(stream);
    DeviceScope scope(cuda::stream_device(s));
    link_hold_kernel<<<1, 1, 0, s>>>(stamps, static_cast<unsigned long long>(hold_ns));
    SCMOE_CUDA_CHECK(cudaGetLastError());
}

std::uint64_t link_stamps_end_ns(const LinkStamps& stamps) {
    return __atomic_load_n(&stamps.end_ns, __ATOMIC_ACQUIRE);
}

}  // namespace scmoe::comm_detail
