// The consumer's own moe/config.h, beside its kernels/ folder (see kernels/activation.h).
#pragma once

namespace consumer {
inline constexpr int kExperts = 4;
}  // namespace consumer
