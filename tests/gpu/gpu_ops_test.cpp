// CUDA ops against the CPU ops on the same (bf16-rounded) inputs: GEMM, grouped GEMM (every kind x
// every provider x balanced / skewed / empty / capacity loads), activations, gated add, the
// non-finite check and dtype conversion.
//
// Tolerances (|gpu - cpu| <= tol * max(1, |cpu|) unless stated):
//   bf16 outputs of GEMMs with K <= 512:       2e-2  (bf16 keeps 8 significant bits: 3.9e-3 relative)
//   f32 outputs of GEMMs on bf16 inputs:       1e-3  (products are exact in fp32; only the sum order differs)
//   f32 GEMM on f32 inputs (CUBLAS_COMPUTE_32F): 1e-4
//   elementwise bf16 outputs:                  1e-2  (one rounding, device vs glibc expf/tanhf)
//   elementwise f32 outputs:                   1e-5
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <tuple>

#include "gpu_test_util.h"
#include "test_util.h"
#include "scmoe/kernels/activation.h"
#include "scmoe/kernels/elementwise.h"
#include "scmoe/kernels/error.h"
#include "scmoe/kernels/gemm.h"
#include "scmoe/kernels/grouped_gemm.h"

namespace scmoe {
namespace {

using namespace gpu_testing;

// ---- GEMM ---------------------------------------------------------------------------------

void check_gemm(Backends& b, bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float beta, DType ab,
                DType c_dtype, std::uint64_t seed) {
    SCOPED_TRACE("ta=" + std::to_string(ta) + " tb=" + std::to_string(tb) + " m=" + std::to_string(m) +
                 " n=" + std::to_string(n) + " k=" + std::to_string(k) + " beta=" + std::to_string(beta) +
                 " ab=" + dtype_name(ab) + " c=" + dtype_name(c_dtype));
    F a = random_uniform(m * k, 1.0f, seed), bm = random_uniform(k * n, 1.0f, seed + 1),
      c = random_uniform(m * n, 1.0f, seed + 2);
    if (ab == DType::kBF16) a = round_bf16(a), bm = round_bf16(bm);
    if (c_dtype == DType::kBF16) c = round_bf16(c);
    DeviceBuffer da = upload(b, a, ab), db = upload(b, bm, ab), dc = upload(b, c, c_dtype);
    gemm({ta, tb, m, n, k, 1.0f, beta, da.data(), db.data(), dc.data(), ab, c_dtype}, *b.gpu_stream);
    F got = download(b, dc.data(), m * n, c_dtype);
    F want = c;
    gemm({ta, tb, m, n, k, 1.0f, beta, a.data(), bm.data(), want.data(), DType::kF32, DType::kF32}, *b.cpu_stream);
    b.cpu_stream->synchronize();
    const float tol = c_dtype == DType::kBF16 ? 2e-2f : (ab == DType::kBF16 ? 1e-3f : 1e-4f);
    expect_close(got, want, tol, "gemm");
}

TEST(GpuOps, GemmAllTransposesMatchCpu) {
    SCMOE_REQUIRE_GPU();
    Backends b;
    std::uint64_t seed = 10;
    for (bool ta : {false, true})
        for (bool tb : {false, true})
            for (DType c : {DType::kF32, DType::kBF16})
                for (float beta : {0.0f, 1.0f}) {
                    check_gemm(b, ta, tb, 37, 45, 61, beta, DType::kBF16, c, seed += 3);    // odd sizes
                    check_gemm(b, ta, tb, 64, 128, 256, beta, DType::kBF16, c, seed += 3);  // aligned
                }
    for (bool ta : {false, true})
        for (bool tb : {false, true}) check_gemm(b, ta, tb, 33, 17, 129, 1.0f, DType::kF32, DType::kF32, seed += 3);
    // Router-shaped GEMMs: n = 1 (CG-1 gate) and n = E.
    check_gemm(b, false, false, 100, 1, 64, 0.0f, DType::kBF16, DType::kF32, seed += 3);
    check_gemm(b, true, false, 64, 4, 100, 0.0f, DType::kBF16, DType::kF32, seed += 3);
}

TEST(GpuOps, GemmEmptySizes) {
    SCMOE_REQUIRE_GPU();
    Backends b;
    const std::int64_t m = 5, n = 7;
    F c(static_cast<std::size_t>(m * n), 3.0f);
    for (DType ct : {DType::kF32, DType::kBF16}) {
        DeviceBuffer dc = upload(b, c, ct);
        // k == 0, beta == 0: C is zeroed.
        gemm({false, false, m, n, 0, 1.0f, 0.0f, nullptr, nullptr, dc.data(), DType::kBF16, ct}, *b.gpu_stream);
        F got = download(b, dc.data(), m * n, ct);
        for (float v : got) ASSERT_EQ(v, 0.0f);
        // k == 0, beta == 2: C is scaled.
        DeviceBuffer dc2 = upload(b, c, ct);
        gemm({false, false, m, n, 0, 1.0f, 2.0f, nullptr, nullptr, dc2.data(), DType::kBF16, ct}, *b.gpu_stream);
        got = download(b, dc2.data(), m * n, ct);
        for (float v : got) ASSERT_EQ(v, 6.0f);
        // m == 0 / n == 0: nothing happens.
        gemm({false, false, 0, n, 4, 1.0f, 0.0f, nullptr, nullptr, nullptr, DType::kBF16, ct}, *b.gpu_stream);
        gemm({false, false, m, 0, 4, 1.0f, 0.0f, nullptr, nullptr, nullptr, DType::kBF16, ct}, *b.gpu_stream);
        b.gpu_stream->synchronize();
    }
}

// ---- Grouped GEMM -------------------------------------------------------------------------

struct Load {
    const char* name;
    I rows;                       // per group
    std::int64_t rows_per_group;  // capacity mode (every group this many rows), else 0
};

std::vector<Load> loads() {
    return {
        {"balanced", {50, 50, 50, 50}, 0},
        {"skewed", {0, 260, 0, 0}, 0},  // one expert gets everything (3 row tiles)
        {"empty_experts", {0, 120, 0, 77}, 0},
        {"capacity", {48, 48, 48, 48}, 48},
    };
}

const char* kind_name(GroupedGemmKind k) {
    switch (k) {
        case GroupedGemmKind::kForward:
            return "forward";
        case GroupedGemmKind::kGradInput:
            return "grad_input";
        case GroupedGemmKind::kGradWeight:
            return "grad_weight";
    }
    return "?";
}

using GroupedParam = std::tuple<GroupedGemmKind, GroupedGemmProvider>;

}  // namespace
// Readable parameters in test output (found by argument-dependent lookup).
void PrintTo(GroupedGemmKind k, std::ostream* os) { *os << kind_name(k); }
void PrintTo(GroupedGemmProvider p, std::ostream* os) { *os << grouped_gemm_provider_name(p, Backend::kCuda); }
namespace {

class GpuGroupedGemm : public ::testing::TestWithParam<GroupedParam> {};

TEST_P(GpuGroupedGemm, MatchesCpu) {
    SCMOE_REQUIRE_GPU();
    const auto [kind, provider] = GetParam();
    Backends b;
    constexpr float kSentinel = 123.0f;
    // (k, n): multiples of 8 take the vectorised (cp.async) path of the own kernel; the others the
    // scalar path; n = 160 spans two column tiles.
    const std::pair<std::int64_t, std::int64_t> shapes[] = {{64, 96}, {72, 160}, {36, 20}};
    std::uint64_t seed = 100;
    for (const Load& load : loads()) {
        if (provider == GroupedGemmProvider::kCublasStridedBatched && load.rows_per_group == 0) continue;
        for (auto [k, n] : shapes) {
            for (DType c_dtype : {DType::kBF16, DType::kF32}) {
                SCOPED_TRACE(std::string(kind_name(kind)) + " provider=" +
                             grouped_gemm_provider_name(provider, Backend::kCuda) + " load=" + load.name +
                             " k=" + std::to_string(k) + " n=" + std::to_string(n) + " c=" + dtype_name(c_dtype));
                const int G = static_cast<int>(load.rows.size());
                I offsets(static_cast<std::size_t>(G + 1), 0);
                for (int g = 0; g < G; ++g) offsets[g + 1] = offsets[g] + load.rows[g];
                const std::int64_t total = offsets[G];
                const std::int64_t max_rows = total + 16;  // padding rows outside every group
                std::int64_t a_n = 0, b_n = 0, c_n = 0;
                switch (kind) {
                    case GroupedGemmKind::kForward:
                        a_n = max_rows * k, b_n = G * k * n, c_n = max_rows * n;
                        break;
                    case GroupedGemmKind::kGradInput:
                        a_n = max_rows * n, b_n = G * k * n, c_n = max_rows * k;
                        break;
                    case GroupedGemmKind::kGradWeight:
                        a_n = max_rows * k, b_n = max_rows * n, c_n = G * k * n;
                        break;
                }
                const F a = round_bf16(random_uniform(a_n, 1.0f, seed++));
                const F bm = round_bf16(random_uniform(b_n, 1.0f, seed++));
                DeviceBuffer da = upload(b, a, DType::kBF16), db = upload(b, bm, DType::kBF16);
                DeviceBuffer dc = upload(b, F(static_cast<std::size_t>(c_n), kSentinel), c_dtype);
                DeviceBuffer doff = upload_i32(b, offsets);

                GroupedGemmArgs args;
                args.kind = kind;
                args.num_groups = G;
                args.k = k;
                args.n = n;
                args.max_rows = max_rows;
                args.rows_per_group = load.rows_per_group;
                args.group_offsets = doff.as<std::int32_t>();
                args.a = da.data();
                args.b = db.data();
                args.c = dc.data();
                args.ab_dtype = DType::kBF16;
                args.c_dtype = c_dtype;
                grouped_gemm(args, *b.gpu_stream, provider);
                const F got = download(b, dc.data(), c_n, c_dtype);

                F want(static_cast<std::size_t>(c_n), kSentinel);
                GroupedGemmArgs cpu_args = args;
                cpu_args.group_offsets = offsets.data();
                cpu_args.a = a.data();
                cpu_args.b = bm.data();
                cpu_args.c = want.data();
                cpu_args.ab_dtype = cpu_args.c_dtype = DType::kF32;
                grouped_gemm(cpu_args, *b.cpu_stream, GroupedGemmProvider::kLoop);
                b.cpu_stream->synchronize();
                // Rows outside the groups keep the sentinel; empty kGradWeight groups are zeros (CPU too).
                expect_close(got, want, c_dtype == DType::kBF16 ? 2e-2f : 1e-3f, "grouped gemm");
            }
        }
    }
}

INSTANTIATE_TEST_SUITE_P(
    Gpu, GpuGroupedGemm,
    ::testing::Combine(::testing::Values(GroupedGemmKind::kForward, GroupedGemmKind::kGradInput,
                                         GroupedGemmKind::kGradWeight),
                       ::testing::Values(GroupedGemmProvider::kLoop, GroupedGemmProvider::kCublasStridedBatched,
                                         GroupedGemmProvider::kDeviceGrouped, GroupedGemmProvider::kAuto)),
    [](const ::testing::TestParamInfo<GroupedParam>& param_info) {
        return testing::gtest_name(std::string(kind_name(std::get<0>(param_info.param))) + "_" +
                                   grouped_gemm_provider_name(std::get<1>(param_info.param), Backend::kCuda));
    });

TEST(GpuOps, GroupedGemmBatchedNeedsCapacity) {
    SCMOE_REQUIRE_GPU();
    Backends b;
    DeviceBuffer doff = upload_i32(b, {0, 4, 8});
    GroupedGemmArgs args;
    args.num_groups = 2;
    args.k = args.n = 8;
    args.max_rows = 8;
    args.group_offsets = doff.as<std::int32_t>();
    args.ab_dtype = args.c_dtype = DType::kBF16;
    EXPECT_THROW(grouped_gemm(args, *b.gpu_stream, GroupedGemmProvider::kCublasStridedBatched), Error);
}

// ---- Activations, gated add, non-finite check, convert --------------------------------------

TEST(GpuOps, ActivationsMatchCpu) {
    SCMOE_REQUIRE_GPU();
    Backends b;
    const std::int64_t rows = 67, ffn = 96;
    for (Activation act : {Activation::kSwiGLU, Activation::kGeLU}) {
        for (DType dt : {DType::kBF16, DType::kF32}) {
            SCOPED_TRACE(std::string(activation_name(act)) + " " + dtype_name(dt));
            const std::int64_t width = activation_input_width(act, ffn);
            F h = random_uniform(rows * width, 4.0f, 7), go = random_uniform(rows * ffn, 1.0f, 8);
            if (dt == DType::kBF16) h = round_bf16(h), go = round_bf16(go);
            DeviceBuffer dh = upload(b, h, dt), dgo = upload(b, go, dt);
            DeviceBuffer dout(*b.gpu, static_cast<std::size_t>(rows * ffn) * dtype_size(dt));
            DeviceBuffer dgh(*b.gpu, static_cast<std::size_t>(rows * width) * dtype_size(dt));
            activation_forward({act, rows, ffn, dt, dh.data(), dout.data()}, *b.gpu_stream);
            activation_backward({act, rows, ffn, dt, dh.data(), dgo.data(), dgh.data()}, *b.gpu_stream);
            F out(static_cast<std::size_t>(rows * ffn)), gh(static_cast<std::size_t>(rows * width));
            activation_forward({act, rows, ffn, DType::kF32, h.data(), out.data()}, *b.cpu_stream);
            activation_backward({act, rows, ffn, DType::kF32, h.data(), go.data(), gh.data()}, *b.cpu_stream);
            b.cpu_stream->synchronize();
            const float tol = dt == DType::kBF16 ? 1e-2f : 1e-5f;
            expect_close(download(b, dout.data(), rows * ffn, dt), out, tol, "activation forward");
            expect_close(download(b, dgh.data(), rows * width, dt), gh, tol, "activation backward");
        }
    }
}

TEST(GpuOps, GatedAddMatchesCpu) {
    SCMOE_REQUIRE_GPU();
    Backends b;
    const std::int64_t T = 45, H = 80;
    for (bool gated : {true, false}) {
        SCOPED_TRACE(gated ? "CG-1" : "direct add");
        const F logit = random_uniform(T, 3.0f, 1);
        const F branch = round_bf16(random_uniform(T * H, 1.0f, 2)), y0 = round_bf16(random_uniform(T * H, 1.0f, 3)),
                gy = round_bf16(random_uniform(T * H, 1.0f, 4));
        DeviceBuffer dl = upload(b, logit, DType::kF32), dbr = upload(b, branch, DType::kBF16),
                     dy = upload(b, y0, DType::kBF16), dgy = upload(b, gy, DType::kBF16);
        DeviceBuffer dgb(*b.gpu, static_cast<std::size_t>(T * H) * 2), dgl(*b.gpu, static_cast<std::size_t>(T) * 2);
        const float* gl = gated ? dl.as<float>() : nullptr;
        gated_add({T, H, DType::kBF16, gl, dbr.data(), dy.data()}, *b.gpu_stream);
        gated_add_backward({T, H, DType::kBF16, gl, dbr.data(), dgy.data(), dgb.data(), dgl.data()}, *b.gpu_stream);

        F y = y0, gb(static_cast<std::size_t>(T * H)), glc(static_cast<std::size_t>(T));
        const float* cl = gated ? logit.data() : nullptr;
        gated_add({T, H, DType::kF32, cl, branch.data(), y.data()}, *b.cpu_stream);
        gated_add_backward({T, H, DType::kF32, cl, branch.data(), gy.data(), gb.data(), glc.data()}, *b.cpu_stream);
        b.cpu_stream->synchronize();
        expect_close(download(b, dy.data(), T * H, DType::kBF16), y, 1e-2f, "gated_add y");
        expect_close(download(b, dgb.data(), T * H, DType::kBF16), gb, 1e-2f, "grad_branch");
        if (gated) expect_close(download(b, dgl.data(), T, DType::kBF16), glc, 1e-2f, "grad_gate_logit");
    }
}

TEST(GpuOps, CountNonfiniteAndConvert) {
    SCMOE_REQUIRE_GPU();
    Backends b;
    const std::int64_t n = 100000;
    F x = random_uniform(n, 10.0f, 5);
    DeviceBuffer counts(*b.gpu, 2 * sizeof(std::int64_t));
    auto read_counts = [&] {
        std::int64_t host[2];
        b.gpu_stream->copy(host, counts.data(), sizeof(host));
        b.gpu_stream->synchronize();
        return std::pair<std::int64_t, std::int64_t>(host[0], host[1]);
    };
    auto* c = counts.as<std::int64_t>();
    for (DType dt : {DType::kF32, DType::kBF16}) {
        SCOPED_TRACE(dtype_name(dt));
        DeviceBuffer clean = upload(b, x, dt);
        count_nonfinite(clean.data(), n, dt, c, c + 1, *b.gpu_stream);
        EXPECT_EQ(read_counts(), std::make_pair(std::int64_t{0}, std::int64_t{-1}));
        F bad = x;
        bad[77777] = std::numeric_limits<float>::quiet_NaN();
        bad[4242] = std::numeric_limits<float>::infinity();
        bad[99999] = -std::numeric_limits<float>::infinity();
        DeviceBuffer dirty = upload(b, bad, dt);
        count_nonfinite(dirty.data(), n, dt, c, c + 1, *b.gpu_stream);
        EXPECT_EQ(read_counts(), std::make_pair(std::int64_t{3}, std::int64_t{4242}));
    }
    // f32 -> bf16 -> f32 on the device is the host's round-to-nearest-even, NaN included.
    F special = x;
    special[0] = std::numeric_limits<float>::quiet_NaN();
    special[1] = 1.00390625f;  // halfway between two bf16 values: ties to even
    special[2] = 3.0e38f;
    DeviceBuffer f32 = upload(b, special, DType::kF32);
    DeviceBuffer bf(*b.gpu, static_cast<std::size_t>(n) * 2), back(*b.gpu, static_cast<std::size_t>(n) * 4);
    convert(f32.data(), DType::kF32, bf.data(), DType::kBF16, n, *b.gpu_stream);
    convert(bf.data(), DType::kBF16, back.data(), DType::kF32, n, *b.gpu_stream);
    std::vector<std::uint16_t> bits(static_cast<std::size_t>(n));
    b.gpu_stream->copy(bits.data(), bf.data(), bits.size() * 2);
    const F widened = download(b, back.data(), n, DType::kF32);
    for (std::int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(bits[static_cast<std::size_t>(i)], math::f32_to_bf16_bits(special[static_cast<std::size_t>(i)]))
            << "element " << i;
        if (i > 0) {
            ASSERT_EQ(widened[static_cast<std::size_t>(i)], math::round_to_bf16(special[static_cast<std::size_t>(i)]));
        }
    }
    EXPECT_TRUE(std::isnan(widened[0]));
}

}  // namespace
}  // namespace scmoe
