// Grouped GEMM provider choice, host-side only (no GPU needed): names and parsing, which providers
// this build has, when cutlass-grouped takes the arguments (and that every refusal says what to use
// instead), and what auto resolves to for each (backend, built, compute capability, dtype, shape).
#include <gtest/gtest.h>

#include <climits>
#include <string>
#include <vector>

#include "scmoe/kernels/device.h"
#include "scmoe/kernels/error.h"
#include "scmoe/kernels/grouped_gemm.h"
#include "test_util.h"

namespace scmoe {
namespace {

using P = GroupedGemmProvider;
using K = GroupedGemmKind;

constexpr P kAllProviders[] = {P::kAuto, P::kLoop, P::kCublasStridedBatched, P::kDeviceGrouped, P::kCutlassGrouped};

// Storage for fake operand pointers: the choice reads only their addresses (16-byte alignment).
alignas(16) char g_storage[256];

// Arguments cutlass-grouped takes: bf16 in, the MoE layer's output dtype for `kind`, k, n % 8 == 0.
GroupedGemmArgs supported_args(K kind, std::int64_t rows_per_group = 0) {
    GroupedGemmArgs a;
    a.kind = kind;
    a.num_groups = 8;
    a.k = 64;
    a.n = 128;
    a.max_rows = 1024;
    a.rows_per_group = rows_per_group;
    a.a = g_storage;
    a.b = g_storage + 32;
    a.c = g_storage + 64;
    a.ab_dtype = DType::kBF16;
    a.c_dtype = kind == K::kGradWeight ? DType::kF32 : DType::kBF16;
    return a;
}

GroupedGemmTarget cuda(int major, int minor, bool built = true) {
    GroupedGemmTarget t;
    t.backend = Backend::kCuda;
    t.cc_major = major;
    t.cc_minor = minor;
    t.cutlass_built = built;
    return t;
}

const char* name(P p) { return grouped_gemm_provider_name(p, Backend::kCuda); }

TEST(GroupedGemmProvider, NamesParseBackOnEveryBackend) {
    for (Backend backend : {Backend::kCpu, Backend::kCuda, Backend::kEmu})
        for (P p : kAllProviders) {
            const std::string n = grouped_gemm_provider_name(p, backend);
            EXPECT_EQ(parse_grouped_gemm_provider(n.c_str()), p) << n;
        }
    EXPECT_STREQ(grouped_gemm_provider_name(P::kCutlassGrouped, Backend::kCuda), "cutlass-grouped");
    EXPECT_EQ(parse_grouped_gemm_provider("loop"), P::kLoop);
}

TEST(GroupedGemmProvider, UnknownNameListsEveryProvider) {
    try {
        parse_grouped_gemm_provider("cutlass");
        FAIL() << "no error for an unknown provider";
    } catch (const Error& e) {
        const std::string what = e.what();
        for (P p : kAllProviders)
            if (p != P::kLoop) {
                EXPECT_NE(what.find(name(p)), std::string::npos) << what;
            }
        EXPECT_NE(what.find("loop"), std::string::npos) << what;
    }
}

TEST(GroupedGemmProvider, BuiltFollowsTheBackend) {
    EXPECT_TRUE(grouped_gemm_provider_built(P::kAuto));
    EXPECT_TRUE(grouped_gemm_provider_built(P::kLoop));
    EXPECT_EQ(grouped_gemm_provider_built(P::kDeviceGrouped), cuda_backend_built());
    EXPECT_EQ(grouped_gemm_provider_built(P::kCublasStridedBatched), cuda_backend_built());
    if (!cuda_backend_built()) {
        EXPECT_FALSE(grouped_gemm_provider_built(P::kCutlassGrouped));
    }
}

TEST(GroupedGemmProvider, CutlassTakesTheMoeLayersCallsOnSm80AndSm90) {
    for (K kind : {K::kForward, K::kGradInput, K::kGradWeight})
        for (auto [major, minor] : {std::pair{8, 0}, std::pair{8, 6}, std::pair{8, 9}, std::pair{9, 0}}) {
            EXPECT_EQ(cutlass_grouped_gemm_unsupported(supported_args(kind), cuda(major, minor)), "");
            EXPECT_EQ(cutlass_grouped_gemm_unsupported(supported_args(kind, 128), cuda(major, minor)), "");
        }
    // Newer devices: explicitly requested it runs (PTX of the sm80 kernel).
    EXPECT_EQ(cutlass_grouped_gemm_unsupported(supported_args(K::kForward), cuda(10, 0)), "");
}

// Every refusal names the reason and what to use instead.
void expect_refused(const GroupedGemmArgs& a, const GroupedGemmTarget& t, const std::string& reason) {
    const std::string why = cutlass_grouped_gemm_unsupported(a, t);
    EXPECT_NE(why.find(reason), std::string::npos) << "expected '" << reason << "' in: " << why;
    if (t.backend == Backend::kCuda) {
        EXPECT_NE(why.find("use device-grouped"), std::string::npos) << why;
    }
}

TEST(GroupedGemmProvider, CutlassRefusesWithAReasonAndAnAlternative) {
    GroupedGemmTarget cpu;
    expect_refused(supported_args(K::kForward), cpu, "needs the CUDA backend");
    expect_refused(supported_args(K::kForward), cuda(9, 0, /*built=*/false), "not built");
    expect_refused(supported_args(K::kForward), cuda(7, 5), "compute capability 8.0");

    GroupedGemmArgs a = supported_args(K::kForward);
    a.ab_dtype = a.c_dtype = DType::kF32;
    expect_refused(a, cuda(9, 0), "bf16 inputs");
    a = supported_args(K::kForward);
    a.c_dtype = DType::kF32;  // only the layer's bf16 activations are instantiated
    expect_refused(a, cuda(9, 0), "c_dtype f32");
    a = supported_args(K::kGradInput);
    a.c_dtype = DType::kF32;
    expect_refused(a, cuda(9, 0), "c_dtype f32");
    a = supported_args(K::kGradWeight);
    a.c_dtype = DType::kBF16;  // weight gradients are f32
    expect_refused(a, cuda(9, 0), "f32 weight gradients");

    for (auto [k, n] : {std::pair<std::int64_t, std::int64_t>{36, 64}, {64, 20}, {0, 64}, {64, 0}, {4, 4}}) {
        a = supported_args(K::kGradInput);
        a.k = k;
        a.n = n;
        expect_refused(a, cuda(9, 0), "multiples of 8");
    }
    a = supported_args(K::kForward);
    a.b = g_storage + 2;  // a bf16 offset that breaks 16-byte alignment
    expect_refused(a, cuda(8, 0), "16-byte aligned");
    a = supported_args(K::kForward);
    a.max_rows = std::int64_t{INT_MAX} + 1;
    expect_refused(a, cuda(8, 0), "below 2^31");
    a = supported_args(K::kForward);
    a.num_groups = kCutlassGroupedMaxGroups + 1;
    expect_refused(a, cuda(8, 0), "groups");
    a.num_groups = kCutlassGroupedMaxGroups;
    EXPECT_EQ(cutlass_grouped_gemm_unsupported(a, cuda(8, 0)), "");
    a.sm_limit = -1;
    EXPECT_NE(cutlass_grouped_gemm_unsupported(a, cuda(9, 0)).find("sm_limit -1 is negative"), std::string::npos);
    a.sm_limit = 4;  // a grid of 4 SMs: taken
    EXPECT_EQ(cutlass_grouped_gemm_unsupported(a, cuda(9, 0)), "");
}

TEST(GroupedGemmProvider, AutoPrefersCutlassWhereItIsNativeAndSupported) {
    for (K kind : {K::kForward, K::kGradInput, K::kGradWeight}) {
        for (std::int64_t rows_per_group : {0, 64}) {
            const GroupedGemmArgs a = supported_args(kind, rows_per_group);
            const P before = rows_per_group > 0 ? P::kCublasStridedBatched : P::kDeviceGrouped;
            EXPECT_EQ(resolve_grouped_gemm_provider(a, P::kAuto, cuda(9, 0)), P::kCutlassGrouped);
            EXPECT_EQ(resolve_grouped_gemm_provider(a, P::kAuto, cuda(8, 0)), P::kCutlassGrouped);
            EXPECT_EQ(resolve_grouped_gemm_provider(a, P::kAuto, cuda(8, 9)), P::kCutlassGrouped);
            // Not built, not native (JIT on newer devices), too old: the choice before cutlass-grouped.
            EXPECT_EQ(resolve_grouped_gemm_provider(a, P::kAuto, cuda(9, 0, false)), before);
            EXPECT_EQ(resolve_grouped_gemm_provider(a, P::kAuto, cuda(10, 0)), before);
            EXPECT_EQ(resolve_grouped_gemm_provider(a, P::kAuto, cuda(7, 5)), before);
        }
    }
}

TEST(GroupedGemmProvider, AutoFallsBackForArgumentsCutlassRefuses) {
    GroupedGemmArgs a = supported_args(K::kForward);
    a.k = 36;  // not a multiple of 8
    EXPECT_EQ(resolve_grouped_gemm_provider(a, P::kAuto, cuda(9, 0)), P::kDeviceGrouped);
    a.rows_per_group = 16;
    EXPECT_EQ(resolve_grouped_gemm_provider(a, P::kAuto, cuda(9, 0)), P::kCublasStridedBatched);
    a = supported_args(K::kForward);
    a.c_dtype = DType::kF32;
    EXPECT_EQ(resolve_grouped_gemm_provider(a, P::kAuto, cuda(9, 0)), P::kDeviceGrouped);
    a.ab_dtype = DType::kF32;
    EXPECT_EQ(resolve_grouped_gemm_provider(a, P::kAuto, cuda(9, 0)), P::kLoop);
    a.rows_per_group = 16;
    EXPECT_EQ(resolve_grouped_gemm_provider(a, P::kAuto, cuda(9, 0)), P::kCublasStridedBatched);
}

// Gradient accumulation: cutlass-grouped overwrites C, so auto runs accumulating weight gradients
// on the provider it would pick without CUTLASS.
TEST(GroupedGemmProvider, AccumulatingWeightGradientsAvoidCutlass) {
    for (std::int64_t rows_per_group : {0, 64}) {
        GroupedGemmArgs a = supported_args(K::kGradWeight, rows_per_group);
        a.accumulate = true;
        expect_refused(a, cuda(9, 0), "accumulate");
        EXPECT_EQ(resolve_grouped_gemm_provider(a, P::kAuto, cuda(9, 0)),
                  rows_per_group > 0 ? P::kCublasStridedBatched : P::kDeviceGrouped);
    }
}

TEST(GroupedGemmProvider, AutoIsTheLoopOffCuda) {
    for (Backend backend : {Backend::kCpu, Backend::kEmu}) {
        GroupedGemmTarget t;
        t.backend = backend;
        t.cutlass_built = true;
        EXPECT_EQ(resolve_grouped_gemm_provider(supported_args(K::kForward), P::kAuto, t), P::kLoop);
    }
}

TEST(GroupedGemmProvider, ExplicitRequestsAreKept) {
    // An explicit request is never swapped; an unsupported one fails in the provider with the reason.
    GroupedGemmArgs a = supported_args(K::kForward);
    a.k = 36;
    for (P p : kAllProviders)
        if (p != P::kAuto) {
            EXPECT_EQ(resolve_grouped_gemm_provider(a, p, cuda(9, 0)), p) << name(p);
        }
}

// The grid limit a grouped GEMM runs with: the stream's SM budget (set by the LayerScheduler while an
// exchange overlaps), the args' own sm_limit where smaller, 0 (every SM) when neither limits it.
TEST(GroupedGemmProvider, SmLimitIsTheStreamsBudgetOrTheArgsLimitWhicheverIsSmaller) {
    testing::Cpu cpu;
    GroupedGemmArgs a = supported_args(K::kForward);
    EXPECT_EQ(grouped_gemm_sm_limit(a, *cpu.stream), 0);
    cpu.stream->set_sm_budget(100);
    EXPECT_EQ(grouped_gemm_sm_limit(a, *cpu.stream), 100);
    a.sm_limit = 60;
    EXPECT_EQ(grouped_gemm_sm_limit(a, *cpu.stream), 60);
    a.sm_limit = 120;
    EXPECT_EQ(grouped_gemm_sm_limit(a, *cpu.stream), 100);
    cpu.stream->set_sm_budget(0);
    EXPECT_EQ(grouped_gemm_sm_limit(a, *cpu.stream), 120);
    a.sm_limit = -1;  // refused by the provider (cutlass_grouped_gemm_unsupported), not hidden here
    cpu.stream->set_sm_budget(100);
    EXPECT_EQ(grouped_gemm_sm_limit(a, *cpu.stream), -1);
    EXPECT_NE(cutlass_grouped_gemm_unsupported(a, cuda(9, 0)).find("sm_limit"), std::string::npos);
}

TEST(GroupedGemmProvider, CpuStreamRefusesCutlassGrouped) {
    testing::Cpu cpu;
    GroupedGemmArgs a;
    a.num_groups = 1;
    EXPECT_THROW(grouped_gemm(a, *cpu.stream, P::kCutlassGrouped), Error);
}

// accumulate: C[g] += A^T B for every group with rows; an empty group's C[g] is left as it was.
// Without it the same call overwrites, an empty group with zeros. Forward GEMMs refuse it.
TEST(GroupedGemmProvider, CpuWeightGradientAccumulatesAndLeavesEmptyGroups) {
    testing::Cpu cpu;
    constexpr std::int64_t k = 3, n = 2;
    const std::vector<std::int32_t> offsets{0, 2, 2, 5};  // group 1 is empty
    std::vector<float> x = testing::random_floats(5 * k, 1), dy = testing::random_floats(5 * n, 2);
    const std::vector<float> before = testing::random_floats(3 * k * n, 3);
    GroupedGemmArgs a;
    a.kind = K::kGradWeight;
    a.num_groups = 3;
    a.k = k;
    a.n = n;
    a.max_rows = 5;
    a.group_offsets = offsets.data();
    a.a = x.data();
    a.b = dy.data();
    std::vector<float> written = before, accumulated = before;
    a.c = written.data();
    grouped_gemm(a, *cpu.stream);
    a.c = accumulated.data();
    a.accumulate = true;
    grouped_gemm(a, *cpu.stream);
    cpu.stream->synchronize();
    for (int g = 0; g < 3; ++g)
        for (std::int64_t i = 0; i < k * n; ++i) {
            const std::size_t at = testing::sz(g * k * n + i);
            if (g == 1) {
                EXPECT_EQ(written[at], 0.0f);
                EXPECT_EQ(accumulated[at], before[at]);
            } else {
                EXPECT_NEAR(accumulated[at], before[at] + written[at], 1e-6f);
                EXPECT_NE(written[at], 0.0f);
            }
        }
    a.kind = K::kForward;
    EXPECT_THROW(grouped_gemm(a, *cpu.stream), Error);
}

}  // namespace
}  // namespace scmoe
