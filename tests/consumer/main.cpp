// The README's embedding example, built against the installed package by the test suite
// (packaging_find_package_consumer): one MoE layer forward and backward on whatever backend is
// here (CPU: f32 host memory; CUDA: bf16 device memory), inputs and outputs through host f32 arrays.
// The consumer sets no C++ standard (scmoe::scmoe requires C++20) and has its own kernels/ and moe/
// folders on its include path, which scmoe's headers must not pick up.
#include <scmoe/scmoe.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "kernels/activation.h"  // the consumer's own, not scmoe's (scmoe/kernels/activation.h)
#include "moe/config.h"          // likewise

int main() {
    // [readme-example]
    auto device = scmoe::make_device("auto");  // CUDA when a GPU answers, else CPU
    auto stream = device->create_stream();

    scmoe::MoeConfig cfg;  // validated by the layer; errors name the field
    cfg.hidden = 64;
    cfg.ffn = 128;
    cfg.num_experts = 4;
    cfg.top_k = 2;
    cfg.dtype = device->compute_dtype();  // f32 on CPU, bf16 on CUDA
    const std::int64_t tokens = 32, H = cfg.hidden;

    scmoe::MoeLayer layer(cfg, *device, /*max_tokens=*/tokens);  // allocates its workspace once
    scmoe::MoeParamStore params(*device, cfg, cfg.dtype);        // zero-filled
    params.init(/*seed=*/1, *stream);                            // or write your own weights
    scmoe::MoeParamStore grads(*device, cfg, scmoe::DType::kF32);  // gradients are always f32

    // Tensors live in the device's memory, in cfg.dtype; copy_from_host converts from f32.
    scmoe::DeviceTensor x(*device, cfg.dtype, {tokens, H}), y(*device, cfg.dtype, {tokens, H});
    scmoe::DeviceTensor dy(*device, cfg.dtype, {tokens, H}), dx(*device, cfg.dtype, {tokens, H});
    std::vector<float> host(static_cast<std::size_t>(tokens * H));
    for (std::size_t i = 0; i < host.size(); ++i) host[i] = std::sin(0.37f * static_cast<float>(i));
    scmoe::copy_from_host(host, x, *stream);

    layer.forward(x, /*shortcut=*/{}, params.view(), y, *stream);  // stream-ordered
    const std::vector<float> out = scmoe::copy_to_host(y, *stream);

    // Backward of L = sum(y): dL/dy = 1. The gradients written already include the router's
    // load-balancing and z-loss terms (scaled by cfg.aux_loss_coef and cfg.z_loss_coef).
    scmoe::copy_from_host(std::vector<float>(host.size(), 1.0f), dy, *stream);
    layer.backward(dy, params.view(), grads.view(), dx, /*grad_shortcut=*/{}, *stream);
    const std::vector<float> grad_x = scmoe::copy_to_host(dx, *stream);
    // [readme-example-end]

    double out_norm = 0, grad_norm = 0;
    for (float v : out) out_norm += static_cast<double>(v) * v;
    for (float v : grad_x) grad_norm += static_cast<double>(v) * v;
    const scmoe::MoeStats stats = layer.stats(*stream);
    static_assert(consumer::kExperts == 4);
    if (consumer::relu(-1.0f) != 0.0f || !std::isfinite(out_norm) || !std::isfinite(grad_norm) || out_norm == 0 ||
        grad_norm == 0) {
        std::printf("scmoe consumer FAILED: |y|^2 = %g, |dx|^2 = %g\n", out_norm, grad_norm);
        return 1;
    }
    std::printf("scmoe consumer ok: %s, %lld tokens, %lld dropped, aux loss %.4f, |y| %.4f, |dx| %.4f\n",
                device->description().c_str(), static_cast<long long>(stats.tokens),
                static_cast<long long>(stats.dropped_tokens), stats.aux_loss, std::sqrt(out_norm),
                std::sqrt(grad_norm));
    return 0;
}
