// cutlass-grouped on Hopper: CUTLASS 3.x grouped GEMM with a ptr-array problem shape whose sizes
// live in device memory (host sizes nullptr), TMA loads and stores, WGMMA, the cooperative
// warp-specialized persistent kernel. One tile configuration per kind: 128x128x64 tiles, 1x1x1
// clusters (a group's row tiles rarely pair up), stages sized by the builder.
//
// NOTES: built for sm_90a only (tensormap.replace and WGMMA are arch-specific features); CMake
// compiles this file alone with -gencode arch=compute_90a,code=sm_90a. The CUTLASS kernel body is
// empty unless __CUDA_ARCH_FEAT_SM90_ALL is defined, so any other device pass would still compile.
#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/device_kernel.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/operations.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "scmoe/kernels/cuda/check.cuh"
#include "scmoe/kernels/cuda/cutlass_grouped_gemm.cuh"

namespace scmoe::cuda::cutlass_grouped {
namespace {

using ProblemShape = cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>>;  // (M, N, K) per group
using Bf16 = cutlass::bfloat16_t;

template <class LayoutA, class LayoutB, class ElementD>
struct Sm90Gemm {
    using TileShape = cute::Shape<cute::_128, cute::_128, cute::_64>;
    using ClusterShape = cute::Shape<cute::_1, cute::_1, cute::_1>;
    static constexpr int kAlignAB = 8;                     // 16 bytes of bf16
    static constexpr int kAlignD = 16 / sizeof(ElementD);  // 16 bytes
    using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
        cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
        cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, cutlass::layout::RowMajor*,
        kAlignD,  // no source C: D = accumulator
        ElementD, cutlass::layout::RowMajor*, kAlignD, cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative,
        cutlass::epilogue::fusion::LinearCombination<ElementD, float, void, float>>::CollectiveOp;
    using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
        cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Bf16, LayoutA*, kAlignAB, Bf16, LayoutB*, kAlignAB, float,
        TileShape, ClusterShape,
        cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
        cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative>::CollectiveOp;
    using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, Mainloop, Epilogue>;
    using Device = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
    using StrideA = typename Kernel::InternalStrideA;
    using StrideB = typename Kernel::InternalStrideB;
    using StrideD = typename Kernel::InternalStrideD;
};

// CUTLASS's A is (M, K), its B is (N, K): row-major A and column-major B are K-major.
using ForwardGemm = Sm90Gemm<cutlass::layout::RowMajor, cutlass::layout::RowMajor, Bf16>;
using GradInputGemm = Sm90Gemm<cutlass::layout::RowMajor, cutlass::layout::ColumnMajor, Bf16>;
using GradWeightGemm = Sm90Gemm<cutlass::layout::ColumnMajor, cutlass::layout::RowMajor, float>;

// A packed CUTLASS 3 stride has one dynamic component, the leading dimension; the others are static.
template <class Stride>
__device__ __forceinline__ Stride leading_dim_stride(long long ld) {
    Stride s{};
    if constexpr (cute::is_static<cute::remove_cvref_t<decltype(cute::get<0>(s))>>::value) {
        cute::get<1>(s) = ld;
    } else {
        cute::get<0>(s) = ld;
    }
    return s;
}

template <class G>
struct Arrays {
    typename ProblemShape::UnderlyingProblemShape* shapes;
    const Bf16** a;
    const Bf16** b;
    typename G::Kernel::CollectiveEpilogue::ElementD** d;
    typename G::StrideA* stride_a;
    typename G::StrideB* stride_b;
    typename G::StrideD* stride_d;
};

template <class G>
__global__ void build_sm90_arrays(Launch l, Arrays<G> arr) {
    const int g = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
    if (g >= l.num_groups) return;
    const Problem p = group_problem(l, g);
    using ElementD = typename G::Kernel::CollectiveEpilogue::ElementD;
    arr.shapes[g] = cute::make_shape(p.m, p.n, p.k);
    arr.a[g] = static_cast<const Bf16*>(p.a);
    arr.b[g] = static_cast<const Bf16*>(p.b);
    arr.d[g] = static_cast<ElementD*>(p.d);
    arr.stride_a[g] = leading_dim_stride<typename G::StrideA>(p.lda);
    arr.stride_b[g] = leading_dim_stride<typename G::StrideB>(p.ldb);
    arr.stride_d[g] = leading_dim_stride<typename G::StrideD>(p.ldd);
}

template <class G>
void run(const Launch& l, StreamResources& res, cudaStream_t stream) {
    using ElementD = typename G::Kernel::CollectiveEpilogue::ElementD;
    const auto groups = static_cast<std::size_t>(l.num_groups);
    ScratchCarver carve(res.scratch, kScratchBytes);
    Arrays<G> arr;
    arr.shapes = carve.take<typename ProblemShape::UnderlyingProblemShape>(groups, "problem shapes");
    arr.a = carve.take<const Bf16*>(groups, "A pointers");
    arr.b = carve.take<const Bf16*>(groups, "B pointers");
    arr.d = carve.take<ElementD*>(groups, "D pointers");
    arr.stride_a = carve.take<typename G::StrideA>(groups, "A strides");
    arr.stride_b = carve.take<typename G::StrideB>(groups, "B strides");
    arr.stride_d = carve.take<typename G::StrideD>(groups, "D strides");
    constexpr int kThreads = 128;
    build_sm90_arrays<G><<<(l.num_groups + kThreads - 1) / kThreads, kThreads, 0, stream>>>(l, arr);
    SCMOE_CUDA_CHECK_LAUNCH("build_sm90_arrays");

    // One CTA per SM the call may take: the grid CUTLASS's persistent scheduler uses when the problem
    // sizes are on the device only.
    const std::array<int, 4> key{90, static_cast<int>(l.kind), l.num_groups, l.sm_count};
    GemmCache& cache = gemm_cache(res);
    auto it = cache.gemms.find(key);
    const bool initialize = it == cache.gemms.end();
    if (initialize) {
        typename G::Device::Arguments args;
        args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
        args.problem_shape = {l.num_groups, arr.shapes, nullptr};  // sizes on the device only
        args.mainloop.ptr_A = arr.a;
        args.mainloop.dA = arr.stride_a;
        args.mainloop.ptr_B = arr.b;
        args.mainloop.dB = arr.stride_b;
        args.epilogue.thread.alpha = 1.0f;
        args.epilogue.thread.beta = 0.0f;
        args.epilogue.ptr_C = nullptr;
        args.epilogue.dC = nullptr;
        args.epilogue.ptr_D = arr.d;
        args.epilogue.dD = arr.stride_d;
        args.hw_info.device_id = l.device;
        args.hw_info.sm_count = l.sm_count;

        const std::size_t workspace_bytes = G::Device::get_workspace_size(args);
        void* workspace = workspace_bytes > 0 ? carve.take<char>(workspace_bytes, "CUTLASS workspace") : nullptr;
        auto entry = std::make_unique<CachedGemmOf<typename G::Device>>();
        cutlass::Status st = entry->gemm.can_implement(args);
        SCMOE_CHECK(st == cutlass::Status::kSuccess, "grouped gemm provider cutlass-grouped (sm90): can_implement: "
                                                         << cutlass::cutlassGetStatusString(st)
                                                         << "; use device-grouped");
        check_launchable(&cutlass::device_kernel<typename G::Kernel>, static_cast<int>(G::Kernel::MaxThreadsPerBlock),
                         static_cast<int>(G::Kernel::SharedStorageSize), "sm90");
        st = entry->gemm.initialize(args, workspace, stream);
        SCMOE_CHECK(st == cutlass::Status::kSuccess,
                    "grouped gemm provider cutlass-grouped (sm90): initialize: " << cutlass::cutlassGetStatusString(st));
        entry->grid = l.sm_count;
        it = cache.gemms.emplace(key, std::move(entry)).first;
    }
    trace_call(l, "sm90", it->second->grid, initialize);
    const cutlass::Status st = static_cast<CachedGemmOf<typename G::Device>&>(*it->second).gemm.run(stream);
    SCMOE_CUDA_CHECK_LAUNCH("cutlass sm90 grouped gemm");
    SCMOE_CHECK(st == cutlass::Status::kSuccess,
                "grouped gemm provider cutlass-grouped (sm90): run: " << cutlass::cutlassGetStatusString(st));
    detail::note_cutlass_grouped_call(true, initialize, l.sm_count, l.device_sms);
}

}  // namespace

void run_sm90(const Launch& l, StreamResources& res, cudaStream_t stream) {
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
