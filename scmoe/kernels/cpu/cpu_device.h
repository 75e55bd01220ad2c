// The CPU backend's Device, Stream (an in-order worker thread) and Event.
#pragma once

#include <memory>

#include "scmoe/kernels/device.h"

namespace scmoe::cpu {

std::unique_ptr<Device> make_device();

}  // namespace scmoe::cpu
