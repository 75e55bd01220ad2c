// The cutlass-grouped provider against the per-group cuBLAS loop (the reference provider) on the
// same device inputs: every kind with the output dtype the MoE layer uses (bf16 rows, f32 weight
// gradients), over balanced, Zipf-skewed, empty-group, shifted-offset, capacity and all-empty
// loads; rows outside the groups untouched; empty groups' weight gradients exactly zero; bitwise
// repeatable; refusals that name the alternative; auto falling back where CUTLASS refuses.
//
// Tolerances: both providers accumulate in fp32 over the same bf16 inputs and round once. bf16
// outputs may differ by one bf16 rounding step (2^-8 relative) after a different summation order:
// |got - want| <= 1e-2 * max(1, |want|). f32 weight gradients differ only by summation order over
// at most a few hundred products of magnitude < 1: |got - want| <= 1e-3 * max(1, |want|).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "gpu_test_util.h"
#include "kernels/error.h"
#include "kernels/grouped_gemm.h"

namespace scmoe {
namespace {

using namespace gpu_testing;

#define SCMOE_REQUIRE_CUTLASS()                                                                   \
    do {                                                                                          \
        SCMOE_REQUIRE_GPU();                                                                      \
        if (!grouped_gemm_provider_built(GroupedGemmProvider::kCutlassGrouped))                   \
            GTEST_SKIP() << "this scmoe was built without CUTLASS: cutlass-grouped test skipped"; \
    } while (0)

struct Load {
    std::string name;
    I rows;                       // per group
    std::int64_t rows_per_group;  // capacity mode, else 0
    int first_group = 0;          // pass offsets + first_group (as MoeLayer::experts_range does)
};

// Counts of `total` rows over `groups` experts with P(g) ~ 1 / (g + 1)^s (the skew of real routers).
I zipf_rows(int groups, std::int64_t total, double s) {
    std::vector<double> w(static_cast<std::size_t>(groups));
    double sum = 0.0;
    for (int g = 0; g < groups; ++g) sum += w[static_cast<std::size_t>(g)] = 1.0 / std::pow(g + 1.0, s);
    I rows(static_cast<std::size_t>(groups));
    std::int64_t given = 0;
    for (int g = 0; g < groups; ++g) {
        rows[static_cast<std::size_t>(g)] =
            static_cast<std::int32_t>(static_cast<double>(total) * w[static_cast<std::size_t>(g)] / sum);
        given += rows[static_cast<std::size_t>(g)];
    }
    rows[0] += static_cast<std::int32_t>(total - given);
    return rows;
}

std::vector<Load> loads() {
    return {
        {"balanced", {64, 64, 64, 64}, 0},
        {"zipf", zipf_rows(8, 700, 1.2), 0},         // ~290 rows on expert 0 (3 row tiles), tails of ~30
        {"empty_groups", {0, 300, 0, 0, 77, 0}, 0},  // empty first, middle and last groups
        {"tiny_groups", {1, 7, 9, 130}, 0},          // partial tiles well below one 128-row tile
        {"shifted", {10, 40, 0, 56, 33}, 0, 2},      // offsets[0] != 0: the slice experts_range passes
        {"capacity", {48, 48, 48, 48}, 48},
        {"all_empty", {0, 0, 0}, 0},
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

}  // namespace
// Readable parameters in test output (found by argument-dependent lookup).
void PrintTo(GroupedGemmKind k, std::ostream* os) { *os << kind_name(k); }
namespace {

// The output dtype the MoE layer gives each kind (moe_layer.cpp, moe_layer_backward.cpp).
DType layer_c_dtype(GroupedGemmKind k) { return k == GroupedGemmKind::kGradWeight ? DType::kF32 : DType::kBF16; }

struct Problem {
    GroupedGemmArgs args;  // device pointers
    DeviceBuffer a, b, offsets;
    std::int64_t c_elems = 0;
    int all_groups = 0;  // groups in `offsets` (args.num_groups of them from first_group)
};

Problem make_problem(Backends& be, GroupedGemmKind kind, const Load& load, std::int64_t k, std::int64_t n,
                     std::uint64_t seed) {
    const int G = static_cast<int>(load.rows.size());
    I offsets(static_cast<std::size_t>(G + 1), 0);
    for (int g = 0; g < G; ++g)
        offsets[static_cast<std::size_t>(g + 1)] =
            offsets[static_cast<std::size_t>(g)] + load.rows[static_cast<std::size_t>(g)];
    const std::int64_t max_rows = offsets.back() + 16;  // padding rows outside every group
    const int used = G - load.first_group;
    std::int64_t a_n = 0, b_n = 0, c_n = 0;
    switch (kind) {
        case GroupedGemmKind::kForward:
            a_n = max_rows * k, b_n = used * k * n, c_n = max_rows * n;
            break;
        case GroupedGemmKind::kGradInput:
            a_n = max_rows * n, b_n = used * k * n, c_n = max_rows * k;
            break;
        case GroupedGemmKind::kGradWeight:
            a_n = max_rows * k, b_n = max_rows * n, c_n = used * k * n;
            break;
    }
    Problem p{GroupedGemmArgs{},
              upload(be, round_bf16(random_uniform(a_n, 1.0f, seed)), DType::kBF16),
              upload(be, round_bf16(random_uniform(b_n, 1.0f, seed + 1)), DType::kBF16),
              upload_i32(be, offsets),
              c_n,
              G};
    GroupedGemmArgs& a = p.args;
    a.kind = kind;
    a.num_groups = used;
    a.k = k;
    a.n = n;
    a.max_rows = max_rows;
    a.rows_per_group = load.rows_per_group;
    a.group_offsets = p.offsets.as<std::int32_t>() + load.first_group;
    a.a = p.a.data();
    a.b = p.b.data();
    a.ab_dtype = DType::kBF16;
    a.c_dtype = layer_c_dtype(kind);
    return p;
}

constexpr float kSentinel = 123.0f;

// Runs `args` with `provider` into a sentinel-filled C and returns C widened to f32.
F run(Backends& be, GroupedGemmArgs args, std::int64_t c_elems, GroupedGemmProvider provider) {
    DeviceBuffer c = upload(be, F(static_cast<std::size_t>(c_elems), kSentinel), args.c_dtype);
    args.c = c.data();
    grouped_gemm(args, *be.gpu_stream, provider);
    return download(be, c.data(), c_elems, args.c_dtype);
}

class GpuCutlassGroupedGemm : public ::testing::TestWithParam<GroupedGemmKind> {};

TEST_P(GpuCutlassGroupedGemm, MatchesTheLoopProvider) {
    SCMOE_REQUIRE_CUTLASS();
    const GroupedGemmKind kind = GetParam();
    Backends be;
    // (k, n): one tile; several tiles with a partial last one (k = 136 is not a multiple of 64 or
    // 128); deep enough for the pipeline to wrap its stages (k = 512: 8 k-tiles of 64).
    const std::pair<std::int64_t, std::int64_t> shapes[] = {{64, 96}, {136, 264}, {512, 128}};
    const float tol = layer_c_dtype(kind) == DType::kBF16 ? 1e-2f : 1e-3f;
    std::uint64_t seed = 1000;
    for (const Load& load : loads()) {
        for (auto [k, n] : shapes) {
            SCOPED_TRACE(std::string(kind_name(kind)) + " load=" + load.name + " k=" + std::to_string(k) +
                         " n=" + std::to_string(n));
            Problem p = make_problem(be, kind, load, k, n, seed += 2);
            const F want = run(be, p.args, p.c_elems, GroupedGemmProvider::kLoop);
            const F got = run(be, p.args, p.c_elems, GroupedGemmProvider::kCutlassGrouped);
            // The loop writes the sentinel-free rows and zero weight gradients for empty groups too,
            // so equality with it covers "rows outside groups untouched" and "empty group -> 0".
            expect_close(got, want, tol, "cutlass-grouped vs loop");
            if (kind == GroupedGemmKind::kGradWeight) {
                for (int g = 0; g < p.args.num_groups; ++g) {
                    if (load.rows[static_cast<std::size_t>(g + load.first_group)] != 0) continue;
                    for (std::int64_t i = 0; i < k * n; ++i)
                        ASSERT_EQ(got[static_cast<std::size_t>(g * k * n + i)], 0.0f) << "empty group " << g;
                }
            } else {
                const std::int64_t width = kind == GroupedGemmKind::kForward ? n : k;
                I offsets = download_i32(be, p.offsets.data(), p.all_groups + 1);
                const std::int64_t lo = offsets[static_cast<std::size_t>(load.first_group)];
                const std::int64_t hi = offsets.back();
                for (std::int64_t r = 0; r < p.args.max_rows; ++r) {
                    if (r >= lo && r < hi) continue;
                    for (std::int64_t j = 0; j < width; ++j)
                        ASSERT_EQ(got[static_cast<std::size_t>(r * width + j)], kSentinel) << "row " << r;
                }
            }
        }
    }
}

TEST_P(GpuCutlassGroupedGemm, BitwiseRepeatable) {
    SCMOE_REQUIRE_CUTLASS();
    Backends be;
    Problem p = make_problem(be, GetParam(), loads()[1], 136, 264, 77);
    const F first = run(be, p.args, p.c_elems, GroupedGemmProvider::kCutlassGrouped);
    const F second = run(be, p.args, p.c_elems, GroupedGemmProvider::kCutlassGrouped);
    expect_bitwise_equal(first, second, "cutlass-grouped twice");
}

INSTANTIATE_TEST_SUITE_P(Gpu, GpuCutlassGroupedGemm,
                         ::testing::Values(GroupedGemmKind::kForward, GroupedGemmKind::kGradInput,
                                           GroupedGemmKind::kGradWeight),
                         [](const ::testing::TestParamInfo<GroupedGemmKind>& param_info) {
                             return std::string(kind_name(param_info.param));
                         });

TEST(GpuCutlassGroupedGemmArgs, RefusalsNameTheAlternativeAndAutoFallsBack) {
    SCMOE_REQUIRE_CUTLASS();
    Backends be;
    // k = 36: rows of 72 bytes, not 16-byte aligned per group.
    Problem p = make_problem(be, GroupedGemmKind::kForward, loads()[0], 36, 64, 5);
    try {
        run(be, p.args, p.c_elems, GroupedGemmProvider::kCutlassGrouped);
        FAIL() << "cutlass-grouped took k = 36";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("use device-grouped"), std::string::npos) << e.what();
    }
    // auto picks another provider for it and still matches the loop.
    expect_close(run(be, p.args, p.c_elems, GroupedGemmProvider::kAuto),
                 run(be, p.args, p.c_elems, GroupedGemmProvider::kLoop), 1e-2f, "auto vs loop, k = 36");
    // f32 output of kForward is not instantiated.
    p.args.c_dtype = DType::kF32;
    EXPECT_THROW(run(be, p.args, p.c_elems, GroupedGemmProvider::kCutlassGrouped), Error);
}

}  // namespace
}  // namespace scmoe
