// Residency: whether a kernel's blocks can be resident on an SM beside another kernel's, the rule
// the emulated timeline (timeline.h) applies to the Work that holds SMs (communication kernels and
// persistent kernels).
//
// CUDA C++ Programming Guide, "Hardware Multithreading": "The number of blocks and warps that can
// reside and be processed together on the multiprocessor for a given kernel depends on the amount of
// registers and shared memory used by the kernel and the amount of registers and shared memory
// available on the multiprocessor. There are also a maximum number of resident blocks and a maximum
// number of resident warps per multiprocessor." A block is resident from its start to its end: its
// registers and shared memory are held for all of that time. So a second kernel's block fits an SM
// only where the blocks already there leave enough of each resource (GpuSpec's per-SM limits, from
// the Programming Guide's "Technical Specifications per Compute Capability").
//
// A persistent kernel (CUTLASS's grouped GEMM: one block per SM of its grid, each looping over tiles
// until the work is done) therefore claims every SM its grid covers for its whole run: where its
// block leaves too little room, nothing else becomes resident there until it ends.
#pragma once

#include "scmoe/kernels/emu/gpu_spec.h"

namespace scmoe::emu {

// What one block of a kernel holds on the SM it is resident on.
struct BlockResources {
    int threads = 0;               // 0: unknown, taken to fit anywhere
    int registers_per_thread = 0;
    int shared_bytes = 0;          // static + dynamic shared memory (the per-block reservation is added)
};

// Whether one block of `incoming` fits an SM on which one block of `resident` is resident: their
// threads, registers (threads x registers per thread), shared memory (each plus the SM's per-block
// reservation) and block slots within the SM's limits. A spec without per-SM limits
// (registers_per_sm 0: a profile of a CPU, or one without a "base" GPU), a limit it does not know (0)
// or a block of unknown size limits nothing.
bool fits_beside(const GpuSpec& spec, const BlockResources& resident, const BlockResources& incoming);

}  // namespace scmoe::emu
