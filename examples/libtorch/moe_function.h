// scmoe's MoeLayer as a libtorch autograd function. Tensors cross between torch and scmoe as DLPack
// tensors (scmoe/interop/dlpack.h; torch's ATen/DLConvertor.h): torch's inputs, outputs and gradients
// are imported into scmoe as views, never copied.
//
// CPU backend, f32: every tensor is a torch CPU float32 tensor. Non-contiguous inputs and output
// gradients are made contiguous first (an scmoe::Tensor is compact row-major).
#pragma once

#include <torch/autograd.h>
#include <torch/types.h>

#include <cstdint>

#include "scmoe/kernels/device.h"
#include "scmoe/moe/moe_layer.h"

namespace scmoe_example {

// What forward and backward share: the layer (built for a config and max_tokens) and the device and
// stream it runs on. One forward/backward at a time: MoeLayer keeps the forward's activations for the
// next backward, so a backward whose forward is not the layer's last one is refused.
struct ScmoeMoe {
    scmoe::Device& device;
    scmoe::Stream& stream;
    scmoe::MoeLayer& layer;
    std::int64_t forwards = 0;  // forwards run so far (each backward checks it is its forward's turn)
};

// y = MoeLayer(x) with the parameters of the config's layer: dropless or capacity routing, top-k,
// the experts' activation, no shared expert. Shapes (I = 2F for SwiGLU, F for GELU):
//   x [T, H], gate_w [H, E], expert_w1 [E, H, I], expert_w2 [E, F, H]  ->  y [T, H]
// Backward returns the gradients of x and the three parameters. As MoeLayer's backward, they include
// the router's load-balancing and z-loss terms (config.aux_loss_coef * aux + config.z_loss_coef * z,
// MoeLayer::stats): the function trains  L(y) + aux_loss_coef * aux + z_loss_coef * z.
class MoeFunction : public torch::autograd::Function<MoeFunction> {
  public:
    static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                                 const torch::Tensor& gate_w, const torch::Tensor& expert_w1,
                                 const torch::Tensor& expert_w2, ScmoeMoe* moe);
    static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                   torch::autograd::variable_list grad_outputs);
};

}  // namespace scmoe_example
