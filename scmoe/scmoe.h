// scmoe: shortcut-connected Mixture-of-Experts runtime. Umbrella header for embedders.
#pragma once

#include "scmoe/comm/comm_sms.h"
#include "scmoe/comm/communicator.h"
#include "scmoe/comm/emu_communicator.h"
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
#include "scmoe/moe/config.h"
#include "scmoe/moe/moe_layer.h"
#include "scmoe/moe/params.h"
