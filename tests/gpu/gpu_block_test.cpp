// BlockStack on CUDA (bf16 storage, fp32 accumulation): overlap on and off give bitwise identical
// outputs and gradients; they choose the same expert as the CPU f32 stack run on the same
// bf16-rounded parameters and inputs for every token of every MoE layer, and match its results
// within kBf16OutputTol (output) and kBf16GradTol (input and parameter gradients), relative L2 over
// a whole tensor. The cases and their setup (routing no bf16 rounding can flip, so the tolerance
// measures the arithmetic) are tests/block/bf16_block_case.h's; the CPU test
// block_bf16_conditioning_test proves the setup makes the reference well-conditioned.
#include <gtest/gtest.h>

#include "bf16_block_case.h"
#include "gpu_test_util.h"

namespace scmoe {
namespace {

using gpu_testing::F;
using testing::kBf16GradTol;
using testing::kBf16OutputTol;

class GpuBlock : public ::testing::TestWithParam<std::string> {};

TEST_P(GpuBlock, OverlapIsBitwiseAndMatchesCpu) {
    SCMOE_REQUIRE_GPU();
    gpu_testing::Backends b;
    const std::int64_t T = testing::kBf16CaseTokens, H = testing::kBf16CaseHidden;
    // CPU reference on bf16-valued parameters and inputs.
    testing::Bf16Case cpu(GetParam(), *b.cpu);
    const std::vector<F>& params = cpu.params;
    const F &x = cpu.x, &gy = cpu.gy;
    const testing::StackResult ref = testing::run_stack(cpu.stack, x, gy, false);
    const auto ref_routing = testing::expert_choices(cpu.stack);

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
    std::vector<std::vector<std::int32_t>> routing;
    auto run = [&](bool overlap) {
        BlockStack gpu(testing::bf16_case_config(GetParam(), DType::kBF16), *b.gpu, T);
        put(gpu.backbone_params().data(), params[0], DType::kBF16);
        for (std::size_t m = 0; m < gpu.moe_params().size(); ++m)
            put(gpu.moe_params()[m]->data(), params[m + 1], DType::kBF16);
        nan_fill(gpu.backbone_grads().data(), gpu.backbone_grads().numel(), DType::kF32);
        for (const auto& g : gpu.moe_grads()) nan_fill(g->data(), g->numel(), DType::kF32);
        DeviceBuffer out(*b.gpu, x.size() * 2), gin(*b.gpu, x.size() * 2);
        nan_fill(out.data(), T * H, DType::kBF16);
        nan_fill(gin.data(), T * H, DType::kBF16);
        gpu.forward(t(dx), t(out), overlap);
        if (!overlap) {
            gpu.synchronize();
            routing = testing::expert_choices(gpu);
        }
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
    ASSERT_EQ(testing::routing_diff(routing, ref_routing, cpu.stack.config().moe.top_k), "")
        << "the GPU chose another expert than the CPU reference (GPU vs CPU)";
    gpu_testing::expect_rel_l2(off[0], ref.out, kBf16OutputTol, "output");
    gpu_testing::expect_rel_l2(off[1], ref.grad_in, kBf16GradTol, "grad_input");
    gpu_testing::expect_rel_l2(off[2], ref.backbone_grads, kBf16GradTol, "backbone grads");
    for (std::size_t m = 0; m < ref.moe_grads.size(); ++m)
        gpu_testing::expect_rel_l2(off[3 + m], ref.moe_grads[m], kBf16GradTol, "moe grads");
}

INSTANTIATE_TEST_SUITE_P(Bf16, GpuBlock,
                         ::testing::ValuesIn(testing::bf16_block_cases()),
                         [](const ::testing::TestParamInfo<std::string>& p) { return testing::gtest_name(p.param); });

}  // namespace
}  // namespace scmoe
