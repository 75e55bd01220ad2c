// The emu backend's Device, Stream and Event: an emulated GPU (after GPEmu, VLDB 2025).
//
// CUDA's execution semantics, each rule next to the CUDA documentation it models:
//  - "Kernel launches are asynchronous ... control returns to the host thread before the device has
//    completed the requested task" (CUDA C++ Programming Guide, Asynchronous Concurrent Execution):
//    every enqueue returns at once, costing the host thread GpuSpec::launch_us of its clock, plus the
//    stack's per-op framework time for kernels and copies (Stack::framework_us, stack.h).
//  - "Operations within a stream are executed in order" / cudaStreamWaitEvent makes "all future work
//    submitted to stream wait for all work captured in event" (CUDA Runtime API): see timeline.h.
//  - cudaStreamSynchronize / cudaEventSynchronize "blocks until ... completed" (Runtime API): the
//    host clock jumps to the completion, plus GpuSpec::sync_us.
//  - cudaMemcpyAsync with pageable host memory: "for transfers from device memory to pageable host
//    memory, the function will return only once the copy has completed"; "for transfers from pageable
//    host memory to device memory, a stream sync is performed before the copy is initiated" (Runtime
//    API, API synchronization behavior): both block the host until the copy has completed here.
//    Copies to or from memory from allocate_host (pinned) are asynchronous.
//  - cudaLaunchHostFunc: "Host functions without a mandated order (such as in independent streams)
//    execute in undefined order and may be serialized": all host tasks of the GPU run on one callback
//    lane, GpuSpec::host_task_us each.
//  - cudaStreamCreateWithPriority: "work in a higher priority stream may preempt work already
//    executing in a low priority stream": high-priority kernels get SMs first (timeline.h).
//  - cudaMalloc: "returns cudaErrorMemoryAllocation in case of failure": allocations count against
//    the capacity; the error names the request, the memory in use and the peak.
//
// Ops hold their stream for a modeled time and do not compute (scmoe/kernels/emu/emu_ops.cpp). Device
// memory is reserved address space (mmap, MAP_NORESERVE) that payload ops never touch, so it costs
// no host memory; routing metadata, which the runtime's host code and the time model read, is
// computed for real: copies into device memory up to kRealCopyBytes and every copy to host memory
// are performed, larger ones into device memory only timed.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "scmoe/kernels/device.h"
#include "scmoe/kernels/emu/gpu_spec.h"
#include "scmoe/kernels/emu/residency.h"
#include "scmoe/kernels/emu/routing.h"
#include "scmoe/kernels/emu/stack.h"
#include "scmoe/kernels/emu/timeline.h"
#include "scmoe/kernels/op_cost.h"

namespace scmoe::emu {

// Copies and fills into device memory up to this size are performed (routing metadata: indices,
// offsets, counts, segment tables); larger ones are payload, timed and skipped.
inline constexpr std::size_t kRealCopyBytes = std::size_t{4} << 20;

struct EmuOptions {
    GpuSpec spec;
    RoutingModel routing;
    Stack stack;  // what runs around the kernels (stack.h); the default, scmoe, adds nothing
};

std::unique_ptr<Device> make_device(EmuOptions options);

struct MemoryStats {
    std::uint64_t in_use = 0, peak = 0, capacity = 0;  // bytes
};

class EmuDevice : public Device {
public:
    int sm_count() const override { return spec().sms; }
    virtual const GpuSpec& spec() const = 0;
    virtual const RoutingModel& routing() const = 0;
    virtual const Stack& stack() const = 0;
    // Host time one launch costs the issuing thread: GpuSpec::launch_us plus the stack's framework time
    // before it (Stack::framework_us: Python and eager dispatch delay the launch).
    double launch_host_us() const { return spec().launch_us + stack().framework_us; }
    virtual Timeline& timeline() = 0;
    virtual MemoryStats memory() const = 0;
    // Memory an op keeps from its forward until its backward (a framework's saved tensors, e.g. the
    // unfused attention's probabilities under a stack, emu_ops.cpp): hold() allocates `bytes`
    // against the capacity under (key, slot), first releasing what that pair held; release() frees it
    // (nothing when it holds nothing).
    virtual void hold(const void* key, int slot, std::size_t bytes) = 0;
    virtual void release(const void* key, int slot) = 0;
    // Numbers the router's draws on this device (one host thread issues them, so the sequence is
    // deterministic).
    virtual std::uint64_t next_router_draw() = 0;
    // True when [ptr, ptr + bytes) lies in one of this device's allocations.
    virtual bool is_device_memory(const void* ptr, std::size_t bytes) const = 0;
};

// How a kernel takes the SMs (timeline.h, residency.h). An ordinary kernel's blocks retire as they
// finish, so it shares the SMs with whatever else runs (processor sharing). A persistent kernel
// launches one block per SM of its grid and each stays resident, looping over the work, until the
// kernel ends: it holds those SMs (min(grid, its 128x128 tiles) of them; blocks without a tile exit
// at once), and another kernel becomes resident there only where `block` leaves room.
struct KernelShape {
    bool persistent = false;
    BlockResources block;  // persistent: what one of its blocks holds on its SM
    int sm_limit = 0;      // the most SMs its grid covers (0: every SM)
};

class EmuStream : public Stream {
public:
    virtual EmuDevice& device() = 0;
    virtual int id() const = 0;
    // Enqueues a kernel of the given cost (see cost_model.h); `effect` runs when it completes. It runs
    // on every SM whatever the stream's SM budget (on CUDA only the grouped GEMM honours the budget,
    // through GroupedGemmArgs::sm_limit; Stream::set_sm_budget).
    virtual void launch(const std::string& name, const OpCost& cost, std::function<void()> effect = {}) = 0;
    // As launch(), with the cost computed when the kernel starts (from routing metadata in device
    // memory that earlier Work wrote).
    virtual void launch_sized_at_start(const std::string& name, std::function<OpCost()> cost,
                                       std::function<void()> effect = {}) = 0;
    // As launch_sized_at_start(), for a kernel of the given shape (a persistent kernel, a grid limit).
    virtual void launch_shaped_at_start(const std::string& name, std::function<OpCost()> cost, KernelShape shape,
                                        std::function<void()> effect = {}) = 0;
};

// The emulated device or stream behind an interface; throws Error when it is not one.
EmuDevice& as_emu(Device& device);
EmuStream& as_emu(Stream& stream);

}  // namespace scmoe::emu
