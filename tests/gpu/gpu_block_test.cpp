// BlockStack on CUDA (bf16 storage, fp32 accumulation): overlap on and off give bitwise identical
// outputs and gradients, and they match the CPU f32 stack run on the same bf16-rounded parameters
// and inputs. Tolerances (relative L2 over a whole tensor): output 5e-2, input gradient and
// parameter gradients 1e-1 — many bf16 roundings in a row, and a router near-tie may send a token
// to another expert than on the CPU. A variant name ending in "-gqa" runs that variant with
// grouped-query attention (4 heads on 2 K/V heads, as the llama2-moe preset's 16 on 4); every case
// has SwiGLU (BackboneShape's and MoeConfig's default).
#include <gtest/gtest.h>

#include "block_test_util.h"
#include "gpu_test_util.h"

namespace scmoe {
namespace {

using gpu_testing::F;

BlockStackConfig gpu_config(std::string variant, DType dtype) {
    const std::string gqa_suffix = "-gqa";
    const bool gqa = variant.size() > gqa_suffix.size() && variant.ends_with(gqa_suffix);
    if (gqa) variant.resize(variant.size() - gqa_suffix.size());
    BackboneShape s;
    s.hidden = 64;
    s.heads = 4;
    s.kv_heads = gqa ? 2 : 0;
    s.seq_len = 16;
    s.ffn = 96;
    s.dtype = dtype;
    MoeConfig m = testing::small_moe(DispatchMode::kDropless);
    m.hidden = 64;
    m.ffn = 96;
    m.dtype = dtype;
    return block_variant(variant, s, m, true, 3);
}

// Rounds every parameter of a CPU stack to bf16 in place; returns them in one flat vector per store.
std::vector<F> round_params(BlockStack& cpu) {
    std::vector<F> out;
    auto take = [&](void* data, std::int64_t n) {
        auto* p = static_cast<float*>(data);
        F v = gpu_testing::round_bf16(F(p, p + n));
        std::copy(v.begin(), v.end(), p);
        out.push_back(v);
    };
    take(cpu.backbone_params().data(), cpu.backbone_params().numel());
    for (const auto& m : cpu.moe_params()) take(m->data(), m->numel());
    return out;
}

class GpuBlock : public ::testing::TestWithParam<std::string> {};

TEST_P(GpuBlock, OverlapIsBitwiseAndMatchesCpu) {
    SCMOE_REQUIRE_GPU();
    gpu_testing::Backends b;
    const std::int64_t T = 32, H = 64;
    // CPU reference on bf16-valued parameters and inputs.
    BlockStack cpu(gpu_config(GetParam(), DType::kF32), *b.cpu, T);
    testing::init_params(cpu, 5);
    const std::vector<F> params = round_params(cpu);
    const F x = gpu_testing::round_bf16(testing::make_input(T, H, 1));
    const F gy = gpu_testing::round_bf16(testing::make_input(T, H, 2));
    const testing::StackResult ref = testing::run_stack(cpu, x, gy, false);

    // Overlap off and on each on a stack of its own, with the output, the input gradient and every
    // parameter gradient filled with NaN first (issue 28): nothing one run skips can come from the
    // other's buffers.
    auto put = [&](void* dst, const F& host, DType dtype) {
        DeviceBuffer tmp = gpu_testing::upload(b, host, dtype);
        b.gpu_stream->copy(dst, tmp.data(), host.size() * dtype_size(dtype));
        b.gpu_stream->synchronize();
    };
    auto nan_fill = [&](void* dst, std::int64_t n, DType dtype) { put(dst, F(testing::sz(n), testing::kUnwritten), dtype); };
    DeviceBuffer dx = gpu_testing::upload(b, x, DType::kBF16), dgy = gpu_testing::upload(b, gy, DType::kBF16);
    auto t = [&](const DeviceBuffer& buf) { return Tensor(buf.data(), DType::kBF16, {T, H}); };
    auto run = [&](bool overlap) {
        BlockStack gpu(gpu_config(GetParam(), DType::kBF16), *b.gpu, T);
        put(gpu.backbone_params().data(), params[0], DType::kBF16);
        for (std::size_t m = 0; m < gpu.moe_params().size(); ++m)
            put(gpu.moe_params()[m]->data(), params[m + 1], DType::kBF16);
        nan_fill(gpu.backbone_grads().data(), gpu.backbone_grads().numel(), DType::kF32);
        for (const auto& g : gpu.moe_grads()) nan_fill(g->data(), g->numel(), DType::kF32);
        DeviceBuffer out(*b.gpu, x.size() * 2), gin(*b.gpu, x.size() * 2);
        nan_fill(out.data(), T * H, DType::kBF16);
        nan_fill(gin.data(), T * H, DType::kBF16);
        gpu.forward(t(dx), t(out), overlap);
        gpu.backward(t(dgy), t(gin), overlap);
        gpu.synchronize();
        std::vector<F> r{gpu_testing::download(b, out.data(), T * H, DType::kBF16),
                         gpu_testing::download(b, gin.data(), T * H, DType::kBF16),
                         gpu_testing::download(b, gpu.backbone_grads().data(), gpu.backbone_grads().numel(), DType::kF32)};
        for (const auto& g : gpu.moe_grads()) r.push_back(gpu_testing::download(b, g->data(), g->numel(), DType::kF32));
        return r;
    };
    ASSERT_EQ(testing::unwritten(ref), "") << "the CPU reference";
    const std::vector<F> off = run(false), on = run(true);
    for (std::size_t i = 0; i < off.size(); ++i)
        ASSERT_LT(testing::first_nan(off[i]), 0) << "overlap off left result " << i << " unwritten (NaN)";
    for (std::size_t i = 0; i < off.size(); ++i) gpu_testing::expect_bitwise_equal(on[i], off[i], "overlap on vs off");
    gpu_testing::expect_rel_l2(off[0], ref.out, 5e-2, "output");
    gpu_testing::expect_rel_l2(off[1], ref.grad_in, 1e-1, "grad_input");
    gpu_testing::expect_rel_l2(off[2], ref.backbone_grads, 1e-1, "backbone grads");
    for (std::size_t m = 0; m < ref.moe_grads.size(); ++m)
        gpu_testing::expect_rel_l2(off[3 + m], ref.moe_grads[m], 1e-1, "moe grads");
}

INSTANTIATE_TEST_SUITE_P(Bf16, GpuBlock,
                         ::testing::Values("top2", "scmoe-pos2", "scmoe-pos3", "every-block-pos1", "top3",
                                           "every-block-top2", "every-block-shared", "every-block-pos1-gqa"),
                         [](const ::testing::TestParamInfo<std::string>& p) { return testing::gtest_name(p.param); });

}  // namespace
}  // namespace scmoe
