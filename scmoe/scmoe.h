// scmoe: shortcut-connected Mixture-of-Experts runtime. Umbrella header for embedders: what a trainer
// that embeds the MoE layer, or the ScMoE blocks with their overlap, needs from scmoe::scmoe.
//
// It brings, in namespace scmoe (README.md, "Using scmoe from another project", lists the same; the
// test docs_umbrella_claims compiles every name below against this header alone):
//   devices              `make_device()` `Device` `Stream` `Event`
//   tensors              `Tensor` `DType` `DeviceTensor` `copy_from_host()` `copy_to_host()`
//   the MoE layer        `MoeConfig` `MoeParams` `MoeParamStore` `MoeLayer` `GradGroup` `all_reduce_moe_grads()`
//   blocks, scheduler    `BlockStackConfig` `block_variant()` `BlockStack` `LayerScheduler` `SchedulePlan` `Tracer`
//   communicators        `Communicator` `LocalGroup` `LocalCommunicator` `EmulatedLink` `EmuGroup` `Topology`
//   errors               `Error`
// and what those headers declare besides (each header says what it holds). Not here, as they need
// more than scmoe::scmoe: scmoe/comm/mpi_communicator.h (scmoe::mpi), scmoe/comm/nccl_communicator.h
// (scmoe::nccl) and scmoe/models/*.h (scmoe::models).
#pragma once

#include "scmoe/comm/comm_sms.h"
#include "scmoe/comm/communicator.h"
#include "scmoe/comm/emu_communicator.h"
#include "scmoe/comm/emulated_link.h"
#include "scmoe/comm/local_communicator.h"
#include "scmoe/comm/topology.h"
#include "scmoe/kernels/attention.h"
#include "scmoe/kernels/device.h"
#include "scmoe/kernels/emu/emu_device.h"
#include "scmoe/kernels/error.h"
#include "scmoe/kernels/grouped_gemm.h"
#include "scmoe/kernels/host_io.h"
#include "scmoe/kernels/rmsnorm.h"
#include "scmoe/kernels/tensor.h"
#include "scmoe/moe/block_stack.h"
#include "scmoe/moe/config.h"
#include "scmoe/moe/grad_reduction.h"
#include "scmoe/moe/layer_scheduler.h"
#include "scmoe/moe/moe_layer.h"
#include "scmoe/moe/params.h"
#include "scmoe/moe/trace.h"
