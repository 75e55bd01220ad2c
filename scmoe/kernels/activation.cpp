#include "scmoe/kernels/activation.h"

namespace scmoe {

const char* activation_name(Activation a) { return a == Activation::kSwiGLU ? "swiglu" : "gelu"; }

}  // namespace scmoe
