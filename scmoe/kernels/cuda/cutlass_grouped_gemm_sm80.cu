// cutlass-grouped on sm_80..sm_89 (and the fallback elsewhere): CUTLASS 2.x GemmGrouped with the
// device-only schedule, so the problem visitor reads each group's size from device memory. One tile
// configuration per kind: 128x128x32 block tiles, 64x64x32 warp tiles, mma.sync 16x8x16, 4 stages
// (64 KiB of shared memory), bf16 inputs, fp32 accumulation; the epilogue writes the accumulator
// converted to the output type (no source C is read).
#include <utility>

#include "cutlass/cutlass.h"
#include "cutlass/device_kernel.h"
#include "cutlass/epilogue/thread/linear_combination.h"
#include "cutlass/gemm/device/gemm_grouped.h"
#include "cutlass/gemm/kernel/default_gemm_grouped.h"
#include "cutlass/gemm/threadblock/threadblock_swizzle.h"
#include "scmoe/kernels/cuda/check.cuh"
#include "scmoe/kernels/cuda/cutlass_grouped_gemm.cuh"

namespace scmoe::cuda::cutlass_grouped {
namespace {

using Bf16 = cutlass::bfloat16_t;

template <class LayoutA, class LayoutB, class ElementD>
struct Sm80Gemm {
    static constexpr int kAlignAB = 8;                                           // 16 bytes of bf16
    static constexpr int kAlignD = 128 / cutlass::sizeof_bits<ElementD>::value;  // 16 bytes
    using Output = cutlass::epilogue::thread::LinearCombination<ElementD, kAlignD, float, float,
                                                                cutlass::epilogue::thread::ScaleType::Nothing>;
    using Kernel = typename cutlass::gemm::kernel::DefaultGemmGrouped<
        Bf16, LayoutA, cutlass::ComplexTransform::kNone, kAlignAB, Bf16, LayoutB, cutlass::ComplexTransform::kNone,
        kAlignAB, ElementD, cutlass::layout::RowMajor, float, cutlass::arch::OpClassTensorOp, cutlass::arch::Sm80,
        cutlass::gemm::GemmShape<128, 128, 32>, cutlass::gemm::GemmShape<64, 64, 32>,
        cutlass::gemm::GemmShape<16, 8, 16>, Output,
        cutlass::gemm::threadblock::GemmBatchedIdentityThreadblockSwizzle,  // unused by grouped kernels
        4, cutlass::gemm::kernel::GroupScheduleMode::kDeviceOnly>::GemmKernel;
    using Device = cutlass::gemm::device::GemmGrouped<Kernel>;
    using ElementA = typename Kernel::ElementA;
    using ElementB = typename Kernel::ElementB;
    using LdA = typename Kernel::LayoutA::Stride::LongIndex;
    using LdB = typename Kernel::LayoutB::Stride::LongIndex;
    using LdC = typename Kernel::LayoutC::Stride::LongIndex;
};

using ForwardGemm = Sm80Gemm<cutlass::layout::RowMajor, cutlass::layout::RowMajor, Bf16>;
using GradInputGemm = Sm80Gemm<cutlass::layout::RowMajor, cutlass::layout::ColumnMajor, Bf16>;
using GradWeightGemm = Sm80Gemm<cutlass::layout::ColumnMajor, cutlass::layout::RowMajor, float>;

template <class G>
struct Arrays {
    cutlass::gemm::GemmCoord* shapes;
    typename G::ElementA** a;
    typename G::ElementB** b;
    typename G::Kernel::ElementC** d;  // also passed as C: never read (ScaleType::Nothing)
    typename G::LdA* lda;
    typename G::LdB* ldb;
    typename G::LdC* ldd;
};

template <class G>
__global__ void build_sm80_arrays(Launch l, Arrays<G> arr) {
    const int g = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
    if (g >= l.num_groups) return;
    const Problem p = group_problem(l, g);
    arr.shapes[g] = cutlass::gemm::GemmCoord(p.m, p.n, p.k);
    arr.a[g] = static_cast<typename G::ElementA*>(const_cast<void*>(p.a));
    arr.b[g] = static_cast<typename G::ElementB*>(const_cast<void*>(p.b));
    arr.d[g] = static_cast<typename G::Kernel::ElementC*>(p.d);
    arr.lda[g] = p.lda;
    arr.ldb[g] = p.ldb;
    arr.ldd[g] = p.ldd;
}

// Persistent grid: one full wave (resident blocks per SM x the SMs the call may take).
template <class G>
int threadblock_count(const Launch& l) {
    const int per_sm = G::Device::maximum_active_blocks();  // the current device: the stream's (StreamDeviceGuard)
    SCMOE_CHECK(per_sm > 0, "grouped gemm provider cutlass-grouped (sm80): no resident block fits on device "
                                << l.device << " (shared memory); use device-grouped");
    return per_sm * l.sm_count;
}

template <class G>
void run(const Launch& l, StreamResources& res, cudaStream_t stream) {
    const auto groups = static_cast<std::size_t>(l.num_groups);
    ScratchCarver carve(res.scratch, kScratchBytes);
    Arrays<G> arr;
    arr.shapes = carve.take<cutlass::gemm::GemmCoord>(groups, "problem shapes");
    arr.a = carve.take<typename G::ElementA*>(groups, "A pointers");
    arr.b = carve.take<typename G::ElementB*>(groups, "B pointers");
    arr.d = carve.take<typename G::Kernel::ElementC*>(groups, "D pointers");
    arr.lda = carve.take<typename G::LdA>(groups, "A leading dimensions");
    arr.ldb = carve.take<typename G::LdB>(groups, "B leading dimensions");
    arr.ldd = carve.take<typename G::LdC>(groups, "D leading dimensions");
    constexpr int kThreads = 128;
    build_sm80_arrays<G><<<(l.num_groups + kThreads - 1) / kThreads, kThreads, 0, stream>>>(l, arr);
    SCMOE_CUDA_CHECK_LAUNCH("build_sm80_arrays");

    const std::array<int, 4> key{80, static_cast<int>(l.kind), l.num_groups, l.sm_count};
    GemmCache& cache = gemm_cache(res);
    auto it = cache.gemms.find(key);
    const bool initialize = it == cache.gemms.end();
    if (initialize) {
        check_launchable(&cutlass::Kernel<typename G::Kernel>, G::Kernel::kThreadCount,
                         static_cast<int>(sizeof(typename G::Kernel::SharedStorage)), "sm80");
        typename G::Device::Arguments args(arr.shapes, l.num_groups, threadblock_count<G>(l),
                                           typename G::Output::Params(), arr.a, arr.b, arr.d, arr.d, arr.lda, arr.ldb,
                                           arr.ldd, arr.ldd, /*host_problem_sizes=*/nullptr);
        // The device-only schedule needs no workspace (the precomputed schedule would need host sizes).
        static_assert(!G::Kernel::ProblemVisitor::kRequiresPrecomputation, "device-only schedule expected");
        auto entry = std::make_unique<CachedGemmOf<typename G::Device>>();
        entry->grid = args.threadblock_count;
        const cutlass::Status st = entry->gemm.initialize(args, nullptr, stream);
        SCMOE_CHECK(st == cutlass::Status::kSuccess,
                    "grouped gemm provider cutlass-grouped (sm80): initialize: " << cutlass::cutlassGetStatusString(st));
        it = cache.gemms.emplace(key, std::move(entry)).first;
    }
    const int grid = it->second->grid;
    trace_call(l, "sm80", grid, initialize);
    const cutlass::Status st = static_cast<CachedGemmOf<typename G::Device>&>(*it->second).gemm.run(stream);
    SCMOE_CUDA_CHECK_LAUNCH("cutlass sm80 grouped gemm");
    SCMOE_CHECK(st == cutlass::Status::kSuccess,
                "grouped gemm provider cutlass-grouped (sm80): run: " << cutlass::cutlassGetStatusString(st));
    detail::note_cutlass_grouped_call(false, initialize, grid, l.device_sms);
}

}  // namespace

void run_sm80(const Launch& l, StreamResources& res, cudaStream_t stream) {
    switch (l.kind) {
        case GroupedGemmKind::kForward:
            run<ForwardGemm>(l, res, stream);
            return;
        case GroupedGemmKind::kGradInput:
            run<GradInputGemm>(l, res, stream);
            return;
        case GroupedGemmKind::kGradWeight:
            run<GradWeightGemm>(l, res, stream);
            return;
    }
}

}  // namespace scmoe::cuda::cutlass_grouped
