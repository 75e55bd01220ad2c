// The consumer's own kernels/activation.h: a project with its own kernels/ folder on its include
// path. scmoe's headers include theirs as "scmoe/kernels/activation.h", so this one cannot shadow
// them (before the scmoe/ layout, moe/config.h's "kernels/activation.h" found this file and failed).
#pragma once

namespace consumer {
inline float relu(float v) { return v > 0.0f ? v : 0.0f; }
}  // namespace consumer
