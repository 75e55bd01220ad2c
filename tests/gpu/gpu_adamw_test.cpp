// The optimizer's ops on CUDA against the CPU backend: the AdamW step is the same arithmetic
// (math::adamw_update, every operation rounded separately) so f32 master weights and moments are
// bitwise equal; the bf16 param copy is round-to-nearest-even of the master; sum_of_squares is
// bitwise reproducible run to run and agrees with the CPU to f32 rounding (both accumulate in double).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "gpu_test_util.h"
#include "scmoe/kernels/adamw.h"
#include "scmoe/kernels/error.h"
#include "scmoe/models/optimizer.h"

namespace scmoe {
namespace {

using namespace gpu_testing;

struct AdamWState {
    F grad, master, m, v;
};

AdamWArgs args_for(std::int64_t n, std::int64_t step, const void* grad, void* master, void* m, void* v) {
    AdamWArgs a;
    a.n = n;
    a.lr = 3e-3f;
    a.beta1 = 0.9f;
    a.beta2 = 0.95f;
    a.eps = 1e-8f;
    a.weight_decay = 0.1f;
    a.step = step;
    a.grad_scale = 0.7f;
    a.grad = static_cast<const float*>(grad);
    a.master = static_cast<float*>(master);
    a.m = static_cast<float*>(m);
    a.v = static_cast<float*>(v);
    return a;
}

void check_adamw_matches_cpu(std::int64_t n, DType param_dtype) {
    SCOPED_TRACE("n=" + std::to_string(n) + " param=" + dtype_name(param_dtype));
    Backends b;
    F master = random_uniform(n, 2.0f, 1), m(static_cast<std::size_t>(n), 0.0f), v(static_cast<std::size_t>(n), 0.0f);
    DeviceBuffer d_master = upload(b, master, DType::kF32), d_m = upload(b, m, DType::kF32),
                 d_v = upload(b, v, DType::kF32);
    DeviceBuffer d_param(*b.gpu, std::max<std::size_t>(static_cast<std::size_t>(n) * dtype_size(param_dtype), 1));
    F cpu_param(static_cast<std::size_t>(n));
    for (std::int64_t step = 1; step <= 3; ++step) {
        F grad = random_uniform(n, 1.0f, 100 + static_cast<std::uint64_t>(step));
        if (step == 2) grad[0] = 0.0f;  // a zero gradient: only decay moves the weight
        DeviceBuffer d_grad = upload(b, grad, DType::kF32);
        AdamWArgs gpu = args_for(n, step, d_grad.data(), d_master.data(), d_m.data(), d_v.data());
        gpu.param = d_param.data();
        gpu.param_dtype = param_dtype;
        adamw_step(gpu, *b.gpu_stream);
        AdamWArgs cpu = args_for(n, step, grad.data(), master.data(), m.data(), v.data());
        cpu.param = cpu_param.data();
        adamw_step(cpu, *b.cpu_stream);
        b.cpu_stream->synchronize();
        b.gpu_stream->synchronize();
    }
    expect_bitwise_equal(download(b, d_master.data(), n, DType::kF32), master, "master");
    expect_bitwise_equal(download(b, d_m.data(), n, DType::kF32), m, "m");
    expect_bitwise_equal(download(b, d_v.data(), n, DType::kF32), v, "v");
    const F param = download(b, d_param.data(), n, param_dtype);
    expect_bitwise_equal(param, param_dtype == DType::kBF16 ? round_bf16(master) : master, "param copy");
}

TEST(GpuAdamW, StepMatchesCpuBitwiseWithBf16Param) {
    SCMOE_REQUIRE_GPU();
    check_adamw_matches_cpu(100003, DType::kBF16);  // odd size: a partial last block
}

TEST(GpuAdamW, StepMatchesCpuBitwiseWithF32Param) {
    SCMOE_REQUIRE_GPU();
    check_adamw_matches_cpu(4099, DType::kF32);
}

TEST(GpuAdamW, StepWithoutParamCopyAndEmpty) {
    SCMOE_REQUIRE_GPU();
    Backends b;
    const std::int64_t n = 1000;
    F master = random_uniform(n, 1.0f, 3), grad = random_uniform(n, 1.0f, 4), zeros(n, 0.0f);
    DeviceBuffer d_master = upload(b, master, DType::kF32), d_grad = upload(b, grad, DType::kF32),
                 d_m = upload(b, zeros, DType::kF32), d_v = upload(b, zeros, DType::kF32);
    adamw_step(args_for(n, 1, d_grad.data(), d_master.data(), d_m.data(), d_v.data()), *b.gpu_stream);
    F m = zeros, v = zeros;
    adamw_step(args_for(n, 1, grad.data(), master.data(), m.data(), v.data()), *b.cpu_stream);
    b.cpu_stream->synchronize();
    expect_bitwise_equal(download(b, d_master.data(), n, DType::kF32), master, "master");
    adamw_step(args_for(0, 1, nullptr, nullptr, nullptr, nullptr), *b.gpu_stream);
    b.gpu_stream->synchronize();
    EXPECT_THROW(adamw_step(args_for(-1, 1, nullptr, nullptr, nullptr, nullptr), *b.gpu_stream), Error);
    EXPECT_THROW(adamw_step(args_for(n, 0, d_grad.data(), d_master.data(), d_m.data(), d_v.data()), *b.gpu_stream),
                 Error);
}

TEST(GpuSumOfSquares, DeterministicAndCloseToCpu) {
    SCMOE_REQUIRE_GPU();
    Backends b;
    DeviceBuffer scratch(*b.gpu, sum_of_squares_scratch_bytes());
    DeviceBuffer d_out(*b.gpu, 2 * sizeof(float));
    for (std::int64_t n : {std::int64_t{0}, std::int64_t{1}, std::int64_t{1000}, std::int64_t{(1 << 20) + 7},
                           std::int64_t{3000001}}) {
        SCOPED_TRACE("n=" + std::to_string(n));
        const F x = random_uniform(n, 3.0f, 5 + static_cast<std::uint64_t>(n));
        DeviceBuffer d_x = upload(b, x, DType::kF32);
        sum_of_squares(static_cast<const float*>(d_x.data()), n, d_out.as<float>(), scratch.data(), *b.gpu_stream);
        sum_of_squares(static_cast<const float*>(d_x.data()), n, d_out.as<float>() + 1, scratch.data(),
                       *b.gpu_stream);
        const F got = download(b, d_out.data(), 2, DType::kF32);
        expect_bitwise_equal({got[0]}, {got[1]}, "sum_of_squares run to run");
        DeviceBuffer cpu_scratch(*b.cpu, sum_of_squares_scratch_bytes());
        float want = -1.0f;
        sum_of_squares(x.data(), n, &want, cpu_scratch.data(), *b.cpu_stream);
        b.cpu_stream->synchronize();
        EXPECT_NEAR(got[0], want, 1e-6f * std::max(1.0f, want));
    }
}

TEST(GpuAdamWOptimizer, Bf16ParamsMatchCpuOptimizer) {
    SCMOE_REQUIRE_GPU();
    Backends b;
    const std::int64_t n = 5000;
    const F init = round_bf16(random_uniform(n, 1.0f, 6));  // what bf16 params hold
    DeviceBuffer d_params = upload(b, init, DType::kBF16);
    F cpu_params = init;
    models::AdamWConfig config;
    config.schedule = {1e-2f, 1e-3f, 2, 10};
    config.weight_decay = 0.05f;
    models::AdamW gpu_opt(*b.gpu, d_params.data(), DType::kBF16, n, config, *b.gpu_stream);
    models::AdamW cpu_opt(*b.cpu, cpu_params.data(), DType::kF32, n, config, *b.cpu_stream);
    for (int step = 0; step < 4; ++step) {
        const F grad = random_uniform(n, 1.0f, 50 + static_cast<std::uint64_t>(step));
        DeviceBuffer d_grad = upload(b, grad, DType::kF32);
        const float gpu_norm = models::global_grad_norm({{d_grad.as<float>(), n}}, *b.gpu, *b.gpu_stream);
        const float cpu_norm = models::global_grad_norm({{grad.data(), n}}, *b.cpu, *b.cpu_stream);
        EXPECT_NEAR(gpu_norm, cpu_norm, 1e-6f * cpu_norm);
        const float scale = models::clip_scale(cpu_norm, 20.0f);
        gpu_opt.step(d_grad.as<float>(), scale, *b.gpu_stream);
        cpu_opt.step(grad.data(), scale, *b.cpu_stream);
        b.gpu_stream->synchronize();
        b.cpu_stream->synchronize();
    }
    F cpu_master(cpu_opt.master(), cpu_opt.master() + n);
    expect_bitwise_equal(download(b, gpu_opt.master(), n, DType::kF32), cpu_master, "master");
    expect_bitwise_equal(download(b, d_params.data(), n, DType::kBF16), round_bf16(cpu_master), "bf16 params");
}

}  // namespace
}  // namespace scmoe
