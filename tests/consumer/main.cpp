// Runs one MoE layer forward + backward through the installed package on the CPU backend.
#include <scmoe.h>

#include <cmath>
#include <cstdio>
#include <vector>

int main() {
    scmoe::MoeConfig config;
    config.hidden = 16;
    config.ffn = 32;
    config.num_experts = 4;
    config.top_k = 2;
    auto device = scmoe::make_device("cpu");
    auto stream = device->create_stream();
    const std::int64_t tokens = 8;
    scmoe::MoeLayer layer(config, *device, tokens);
    scmoe::MoeParamStore params(*device, config, scmoe::DType::kF32);
    scmoe::MoeParamStore grads(*device, config, scmoe::DType::kF32);
    auto* p = static_cast<float*>(params.data());
    for (std::int64_t i = 0; i < params.numel(); ++i) p[i] = 0.01f * static_cast<float>(i % 17) - 0.08f;
    std::vector<float> x(tokens * 16), y(x.size()), dy(x.size(), 1.0f), dx(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::sin(static_cast<float>(i));
    scmoe::Tensor xt(x.data(), scmoe::DType::kF32, {tokens, 16});
    layer.forward(xt, scmoe::Tensor(), params.view(), scmoe::Tensor(y.data(), scmoe::DType::kF32, {tokens, 16}),
                  *stream);
    layer.backward(scmoe::Tensor(dy.data(), scmoe::DType::kF32, {tokens, 16}), params.view(), grads.view(),
                   scmoe::Tensor(dx.data(), scmoe::DType::kF32, {tokens, 16}), scmoe::Tensor(), *stream);
    stream->synchronize();
    for (float v : y)
        if (!std::isfinite(v)) return 1;
    scmoe::MoeStats stats = layer.stats(*stream);
    std::printf("scmoe consumer ok: %lld tokens, %lld dropped, aux loss %.4f\n", static_cast<long long>(stats.tokens),
                static_cast<long long>(stats.dropped_tokens), stats.aux_loss);
    return 0;
}
