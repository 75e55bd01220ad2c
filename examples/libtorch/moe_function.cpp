#include "moe_function.h"

#include <ATen/DLConvertor.h>

#include <stdexcept>
#include <string>

#include "scmoe/interop/dlpack.h"

namespace scmoe_example {
namespace {

// torch -> scmoe, read only: torch marks the export read-only (DLPACK_FLAG_BITMASK_READ_ONLY) and
// scmoe checks the flag against the access it asks for.
scmoe::DLPackTensor read_view(const torch::Tensor& t, const ScmoeMoe& moe, const char* what) {
    return scmoe::DLPackTensor(at::toDLPackVersionedReadOnly(t), moe.device, what, scmoe::DLPackAccess::kRead);
}

// torch -> scmoe, written by scmoe.
scmoe::DLPackTensor write_view(const torch::Tensor& t, const ScmoeMoe& moe, const char* what) {
    return scmoe::DLPackTensor(at::toDLPackVersioned(t), moe.device, what, scmoe::DLPackAccess::kWrite);
}

}  // namespace

torch::Tensor MoeFunction::forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                                   const torch::Tensor& gate_w, const torch::Tensor& expert_w1,
                                   const torch::Tensor& expert_w2, ScmoeMoe* moe) {
    const torch::Tensor xc = x.contiguous();
    torch::Tensor y = torch::empty_like(xc);
    // The views hold torch's tensors (DLPack's manager_ctx) until they are destroyed at the end of
    // this scope; the layer keeps pointers to x until backward, which ctx's saved x keeps alive.
    const scmoe::DLPackTensor x_view = read_view(xc, *moe, "MoeFunction x");
    const scmoe::DLPackTensor y_view = write_view(y, *moe, "MoeFunction y");
    const scmoe::DLPackTensor gate_view = read_view(gate_w, *moe, "MoeFunction gate_w");
    const scmoe::DLPackTensor w1_view = read_view(expert_w1, *moe, "MoeFunction expert_w1");
    const scmoe::DLPackTensor w2_view = read_view(expert_w2, *moe, "MoeFunction expert_w2");
    scmoe::MoeParams params;
    params.gate_w = gate_view.tensor();
    params.expert_w1 = w1_view.tensor();
    params.expert_w2 = w2_view.tensor();
    moe->layer.forward(x_view.tensor(), /*shortcut=*/{}, params, y_view.tensor(), moe->stream);
    moe->stream.synchronize();  // torch reads y next, outside scmoe's stream order
    ctx->save_for_backward({xc, gate_w, expert_w1, expert_w2});
    ctx->saved_data["moe"] = reinterpret_cast<std::int64_t>(moe);
    ctx->saved_data["forward"] = ++moe->forwards;
    return y;
}

torch::autograd::variable_list MoeFunction::backward(torch::autograd::AutogradContext* ctx,
                                                     torch::autograd::variable_list grad_outputs) {
    auto* moe = reinterpret_cast<ScmoeMoe*>(ctx->saved_data["moe"].toInt());
    const std::int64_t forward = ctx->saved_data["forward"].toInt();
    if (forward != moe->forwards)
        throw std::runtime_error("MoeFunction backward of forward " + std::to_string(forward) +
                                 ", but the layer has run forward " + std::to_string(moe->forwards) +
                                 " since: MoeLayer keeps one forward's activations; run backward before the next "
                                 "forward");
    const torch::autograd::variable_list saved = ctx->get_saved_variables();
    const torch::Tensor &x = saved[0], &gate_w = saved[1], &expert_w1 = saved[2], &expert_w2 = saved[3];
    // sum()'s gradient, for one, is an expanded tensor (stride 0), which scmoe refuses.
    const torch::Tensor grad_y = grad_outputs[0].contiguous();
    torch::Tensor grad_x = torch::empty_like(x), grad_gate = torch::empty_like(gate_w);
    torch::Tensor grad_w1 = torch::empty_like(expert_w1), grad_w2 = torch::empty_like(expert_w2);
    const scmoe::DLPackTensor grad_y_view = read_view(grad_y, *moe, "MoeFunction grad_y");
    const scmoe::DLPackTensor gate_view = read_view(gate_w, *moe, "MoeFunction gate_w");
    const scmoe::DLPackTensor w1_view = read_view(expert_w1, *moe, "MoeFunction expert_w1");
    const scmoe::DLPackTensor w2_view = read_view(expert_w2, *moe, "MoeFunction expert_w2");
    const scmoe::DLPackTensor grad_x_view = write_view(grad_x, *moe, "MoeFunction grad_x");
    const scmoe::DLPackTensor grad_gate_view = write_view(grad_gate, *moe, "MoeFunction grad gate_w");
    const scmoe::DLPackTensor grad_w1_view = write_view(grad_w1, *moe, "MoeFunction grad expert_w1");
    const scmoe::DLPackTensor grad_w2_view = write_view(grad_w2, *moe, "MoeFunction grad expert_w2");
    scmoe::MoeParams params;
    params.gate_w = gate_view.tensor();
    params.expert_w1 = w1_view.tensor();
    params.expert_w2 = w2_view.tensor();
    scmoe::MoeGrads grads;
    grads.gate_w = grad_gate_view.tensor();
    grads.expert_w1 = grad_w1_view.tensor();
    grads.expert_w2 = grad_w2_view.tensor();
    moe->layer.backward(grad_y_view.tensor(), params, grads, grad_x_view.tensor(), /*grad_shortcut=*/{}, moe->stream);
    moe->stream.synchronize();
    // One gradient per forward argument; the layer pointer has none.
    return {grad_x, grad_gate, grad_w1, grad_w2, torch::Tensor()};
}

}  // namespace scmoe_example
