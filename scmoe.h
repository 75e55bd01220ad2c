// scmoe: shortcut-connected Mixture-of-Experts runtime. Umbrella header for embedders.
#pragma once

#include "comm/comm_sms.h"
#include "comm/communicator.h"
#include "comm/emu_communicator.h"
#include "comm/local_communicator.h"
#include "comm/topology.h"
#include "kernels/attention.h"
#include "kernels/device.h"
#include "kernels/emu/emu_device.h"
#include "kernels/error.h"
#include "kernels/grouped_gemm.h"
#include "kernels/host_io.h"
#include "kernels/rmsnorm.h"
#include "kernels/tensor.h"
#include "moe/config.h"
#include "moe/moe_layer.h"
#include "moe/params.h"
