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
#include <cstdlib>
#include <string>
#include <vector>

#include "gpu_test_util.h"
#include "scmoe/kernels/error.h"
#include "scmoe/kernels/grouped_gemm.h"

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

// The tiles of one CUTLASS call: 128 x 128 output tiles per group (both paths' tile), counting the
// groups with rows only (an empty group has no tiles).
std::int64_t output_tiles(GroupedGemmKind kind, const I& rows, std::int64_t k, std::int64_t n) {
    auto tiles = [](std::int64_t x) { return (x + 127) / 128; };
    std::int64_t t = 0;
    for (std::int32_t r : rows) {
        if (r == 0) continue;
        switch (kind) {
            case GroupedGemmKind::kForward: t += tiles(r) * tiles(n); break;
            case GroupedGemmKind::kGradInput: t += tiles(r) * tiles(k); break;
            case GroupedGemmKind::kGradWeight: t += tiles(k) * tiles(n); break;
        }
    }
    return t;
}

// 40 groups of 400 rows (4 row tiles, the last partial) with every 7th group empty, k = 512,
// n = 1024: at least 4 tiles per SM for every kind on an H100 (132 SMs), so each persistent block
// walks several tiles and switches groups inside the block (the sm90 kernel's tensormap update, the
// sm80 problem visitor's loop); then the same on a grid of 2 SMs, where each block walks hundreds
// of tiles over every group. Bitwise equal to the full grid: a tile is computed by one block in the
// same order whichever block it is.
TEST_P(GpuCutlassGroupedGemm, ManyTilesPerBlockOverManyGroups) {
    SCMOE_REQUIRE_CUTLASS();
    const GroupedGemmKind kind = GetParam();
    Backends be;
    Load load{"many", I(40, 400), 0};
    for (std::size_t g = 0; g < load.rows.size(); g += 7) load.rows[g] = 0;
    constexpr std::int64_t k = 512, n = 1024;
    Problem p = make_problem(be, kind, load, k, n, 4242);
    const F want = run(be, p.args, p.c_elems, GroupedGemmProvider::kLoop);
    const F full = run(be, p.args, p.c_elems, GroupedGemmProvider::kCutlassGrouped);
    const CutlassGroupedStats stats = cutlass_grouped_stats();
    ASSERT_GT(stats.device_sms, 0);
    const std::int64_t tiles = output_tiles(kind, load.rows, k, n);
    ASSERT_GE(tiles, 4LL * stats.device_sms) << "the case must give every SM several tiles";
    expect_close(full, want, layer_c_dtype(kind) == DType::kBF16 ? 1e-2f : 1e-3f, "cutlass-grouped vs loop");

    p.args.sm_limit = 2;
    const F narrow = run(be, p.args, p.c_elems, GroupedGemmProvider::kCutlassGrouped);
    const CutlassGroupedStats after = cutlass_grouped_stats();
    EXPECT_LT(after.last_grid, stats.last_grid) << "sm_limit 2 must shrink the persistent grid";
    EXPECT_LE(after.last_grid, 2 * 8) << "at most 8 resident blocks on each of 2 SMs";
    expect_bitwise_equal(narrow, full, "grid of 2 SMs vs every SM");
}

// The stream's SM budget (Stream::set_sm_budget, which the LayerScheduler sets beside an exchange,
// review 2 #6) sizes the persistent grid: sm_90's one block per SM of SMs - 32, the sm_80 path's
// resident blocks per SM times that; bitwise the result of every SM; every SM again at budget 0.
TEST_P(GpuCutlassGroupedGemm, TheStreamsSmBudgetSizesThePersistentGrid) {
    SCMOE_REQUIRE_CUTLASS();
    const GroupedGemmKind kind = GetParam();
    Backends be;
    Load load{"many", I(40, 400), 0};
    Problem p = make_problem(be, kind, load, 512, 1024, 777);
    const F full = run(be, p.args, p.c_elems, GroupedGemmProvider::kCutlassGrouped);
    const CutlassGroupedStats all = cutlass_grouped_stats();
    ASSERT_GT(all.device_sms, 32);
    be.gpu_stream->set_sm_budget(all.device_sms - 32);
    EXPECT_EQ(grouped_gemm_sm_limit(p.args, *be.gpu_stream), all.device_sms - 32);
    const F budgeted = run(be, p.args, p.c_elems, GroupedGemmProvider::kCutlassGrouped);
    const CutlassGroupedStats limited = cutlass_grouped_stats();
    be.gpu_stream->set_sm_budget(0);
    EXPECT_EQ(limited.last_grid * all.device_sms, all.last_grid * (all.device_sms - 32))
        << "the grid is blocks per SM x the SMs it may take";
    expect_bitwise_equal(budgeted, full, "SMs - 32 vs every SM");
    run(be, p.args, p.c_elems, GroupedGemmProvider::kCutlassGrouped);
    EXPECT_EQ(cutlass_grouped_stats().last_grid, all.last_grid) << "budget 0: every SM again";
}

// Every call with the same (kind, groups, grid) on a stream reuses the GEMM initialized by the first
// one (no TMA descriptor encoding per call), and stays correct with other buffers, offsets and rows
// (nothing of a call's data is baked into the cached parameters).
TEST_P(GpuCutlassGroupedGemm, InitializesOncePerStreamAndShape) {
    SCMOE_REQUIRE_CUTLASS();
    const GroupedGemmKind kind = GetParam();
    Backends be;  // a new stream: nothing initialized on it yet
    const float tol = layer_c_dtype(kind) == DType::kBF16 ? 1e-2f : 1e-3f;
    const long long before = cutlass_grouped_stats().initializations;
    const Load loads_of_4[] = {{"a", {64, 0, 200, 31}, 0}, {"b", {5, 300, 17, 0}, 0}, {"c", {128, 128, 128, 128}, 0}};
    std::uint64_t seed = 90;
    for (const Load& load : loads_of_4) {
        Problem p = make_problem(be, kind, load, 136, 264, seed += 2);
        expect_close(run(be, p.args, p.c_elems, GroupedGemmProvider::kCutlassGrouped),
                     run(be, p.args, p.c_elems, GroupedGemmProvider::kLoop), tol, ("cached call vs loop: " + load.name).c_str());
    }
    EXPECT_EQ(cutlass_grouped_stats().initializations - before, 1) << "three calls of 4 groups: one initialization";
    Problem other = make_problem(be, kind, {"five", {10, 20, 30, 40, 50}, 0}, 136, 264, 7);
    run(be, other.args, other.c_elems, GroupedGemmProvider::kCutlassGrouped);
    EXPECT_EQ(cutlass_grouped_stats().initializations - before, 2) << "5 groups: a second GEMM";
}

// The CUTLASS 2.x path (what an A100 runs) on this GPU too: SCMOE_CUTLASS_ARCH=sm80 makes an sm_90
// device run it, so one Hopper run covers both kernels. The path that ran is counted.
TEST_P(GpuCutlassGroupedGemm, Sm80PathMatchesTheLoopProvider) {
    SCMOE_REQUIRE_CUTLASS();
    const GroupedGemmKind kind = GetParam();
    ScopedEnv arch("SCMOE_CUTLASS_ARCH", "sm80");
    Backends be;
    const float tol = layer_c_dtype(kind) == DType::kBF16 ? 1e-2f : 1e-3f;
    const CutlassGroupedStats before = cutlass_grouped_stats();
    std::uint64_t seed = 3000;
    Load many{"many", I(40, 400), 0};
    for (std::size_t g = 0; g < many.rows.size(); g += 7) many.rows[g] = 0;
    std::vector<Load> cases = loads();
    cases.push_back(many);
    for (const Load& load : cases) {
        SCOPED_TRACE(std::string(kind_name(kind)) + " sm80 load=" + load.name);
        Problem p = make_problem(be, kind, load, load.name == "many" ? 512 : 136, load.name == "many" ? 1024 : 264,
                                 seed += 2);
        expect_close(run(be, p.args, p.c_elems, GroupedGemmProvider::kCutlassGrouped),
                     run(be, p.args, p.c_elems, GroupedGemmProvider::kLoop), tol, "sm80 path vs loop");
    }
    const CutlassGroupedStats after = cutlass_grouped_stats();
    EXPECT_GT(after.sm80_calls, before.sm80_calls);
    EXPECT_EQ(after.sm90_calls, before.sm90_calls) << "SCMOE_CUTLASS_ARCH=sm80 still ran the sm90 path";
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
