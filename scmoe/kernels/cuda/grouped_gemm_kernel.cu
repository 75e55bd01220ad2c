// scmoe's own grouped GEMM: bf16 tensor cores (WMMA 16x16x16, fp32 accumulate), 128x128x32 block
// tiles, 8 warps of 64x32, cp.async double buffering, and a device-side tile scheduler that reads
// the group offsets on the device (no host sync).
//
// Every kind is one GEMM per group C[M, Nout] = Aop[M, Kr] * Bop[Kr, Nout] over strided operands:
//   kForward:    M = rows_g, Nout = n, Kr = k;    A row-major [rows, k],  B row-major [k, n]
//   kGradInput:  M = rows_g, Nout = k, Kr = n;    A row-major [rows, n],  B = W_g^T, W_g row-major [k, n]
//   kGradWeight: M = k, Nout = n, Kr = rows_g;    A = X_g^T, X_g row-major [rows, k];  B row-major [rows, n]
// Shared-memory tiles keep the global layout (contiguous dimension innermost, so global->shared
// copies are 16-byte chunks) and WMMA fragments are loaded row- or column-major to match.
#include <mma.h>

#include <climits>
#include <type_traits>

#include "scmoe/kernels/cuda/check.cuh"
#include "scmoe/kernels/cuda/grouped_gemm_kernel.cuh"

namespace scmoe::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kBM = 128, kBN = 128, kBK = 32;
constexpr int kThreads = 256;            // 8 warps: 2 (M) x 4 (N)
constexpr int kWarpM = 64, kWarpN = 32;  // warp tile
constexpr int kFragM = kWarpM / 16, kFragN = kWarpN / 16;
constexpr int kPad = 8;  // bf16 elements: keeps rows 16-byte aligned, breaks bank conflicts
constexpr int kStageElems = (kBM * (kBK + kPad) > kBK * (kBN + kPad)) ? kBM * (kBK + kPad) : kBK * (kBN + kPad);
constexpr int kSmemBytes = 2 /*operands*/ * 2 /*stages*/ * kStageElems * 2 /*bytes*/;
static_assert(kBM == kBN, "stage sizing assumes square block tiles");
static_assert(8 * 16 * 16 * 4 <= kSmemBytes, "epilogue staging must fit in the tile buffers");
static_assert((kStageElems * 2) % 128 == 0, "stage buffers stay 128-byte aligned");

struct Params {
    const bf16* a = nullptr;
    const bf16* b = nullptr;
    void* c = nullptr;
    const std::int32_t* offsets = nullptr;
    int num_groups = 0;
    long long k = 0, n = 0, max_rows = 0;
    bool accumulate = false;  // kGradWeight: C += A^T B (C is f32 there)
};

// 16-byte global->shared copy, zero-filled when !valid (src is then not read).
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
    const int src_bytes = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(src_bytes) : "memory");
#else
    *static_cast<uint4*>(smem) = valid ? *static_cast<const uint4*>(gmem) : make_uint4(0, 0, 0, 0);
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
#endif
}

// Loads the [rows_tile x cols_tile] tile whose inner (contiguous) dimension has `inner_tile`
// elements: element (outer o, inner i) of the tile is src[(outer0 + o) * ld + inner0 + i], valid
// when outer0 + o < outer_size and inner0 + i < inner_size; stored at dst[o * (inner_tile + kPad) + i].
// kVec: inner_size, ld and src are multiples of 8 elements / 16 bytes, so a chunk is all in or all out.
template <int kOuterTile, int kInnerTile, bool kVec>
__device__ __forceinline__ void load_tile(bf16* dst, const bf16* src, long long ld, long long outer0,
                                          long long outer_size, long long inner0, long long inner_size) {
    constexpr int kChunksPerRow = kInnerTile / 8;
    constexpr int kChunks = kOuterTile * kChunksPerRow;
    static_assert(kChunks % kThreads == 0, "tile chunks divide evenly among the threads");
    for (int c = threadIdx.x; c < kChunks; c += kThreads) {
        const int o = c / kChunksPerRow;
        const int i = (c % kChunksPerRow) * 8;
        const long long go = outer0 + o, gi = inner0 + i;
        bf16* d = dst + o * (kInnerTile + kPad) + i;
        if constexpr (kVec) {
            const bool valid = go < outer_size && gi < inner_size;
            cp_async16(d, valid ? src + go * ld + gi : src, valid);
        } else {
            const bool row_ok = go < outer_size;
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                d[e] = (row_ok && gi + e < inner_size) ? src[go * ld + gi + e] : __float2bfloat16_rn(0.0f);
            }
        }
    }
}

// NOTES: one CTA per output tile. blockIdx.x is a linear tile index over all groups; thread 0 maps
// it to (group, row tile, column tile) by scanning the E + 1 offsets; CTAs past the real tile
// count exit. Offsets are clamped to [0, max_rows] (the device cannot throw): malformed offsets
// give wrong results, never out-of-bounds accesses. Each output element is computed by one CTA in
// a fixed order, so results are deterministic.
template <GroupedGemmKind kKind, class OutT, bool kVec>
__global__ void __launch_bounds__(kThreads) grouped_gemm_kernel(Params p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    using namespace nvcuda;
    constexpr bool kAContigK = kKind != GroupedGemmKind::kGradWeight;  // else A is contiguous along M
    constexpr bool kBContigN = kKind != GroupedGemmKind::kGradInput;   // else B is contiguous along Kr
    using ALayout = std::conditional_t<kAContigK, wmma::row_major, wmma::col_major>;
    using BLayout = std::conditional_t<kBContigN, wmma::row_major, wmma::col_major>;

    __shared__ __align__(128) unsigned char smem[kSmemBytes];
    __shared__ long long s_row0, s_rows;
    __shared__ int s_group, s_tile_m, s_tile_n;

    const long long n_out = kKind == GroupedGemmKind::kGradInput ? p.k : p.n;
    const long long tiles_n = (n_out + kBN - 1) / kBN;
    if (threadIdx.x == 0) {
        long long remaining = blockIdx.x;
        int group = -1;
        long long row0 = 0, rows = 0, local = 0;
        if constexpr (kKind == GroupedGemmKind::kGradWeight) {
            const long long per_group = ((p.k + kBM - 1) / kBM) * tiles_n;
            if (per_group > 0 && remaining < per_group * p.num_groups) {
                group = static_cast<int>(remaining / per_group);
                local = remaining % per_group;
            }
        }
        for (int g = 0; g < p.num_groups; ++g) {
            if constexpr (kKind == GroupedGemmKind::kGradWeight) {
                if (g != group) continue;
            }
            long long r0 = p.offsets[g], r1 = p.offsets[g + 1];
            r0 = r0 < 0 ? 0 : (r0 > p.max_rows ? p.max_rows : r0);
            r1 = r1 < r0 ? r0 : (r1 > p.max_rows ? p.max_rows : r1);
            if constexpr (kKind == GroupedGemmKind::kGradWeight) {
                row0 = r0;
                rows = r1 - r0;
                break;
            } else {
                const long long tiles = ((r1 - r0 + kBM - 1) / kBM) * tiles_n;
                if (remaining < tiles) {
                    group = g;
                    local = remaining;
                    row0 = r0;
                    rows = r1 - r0;
                    break;
                }
                remaining -= tiles;
            }
        }
        s_group = group;
        s_row0 = row0;
        s_rows = rows;
        s_tile_m = static_cast<int>(local / tiles_n);
        s_tile_n = static_cast<int>(local % tiles_n);
    }
    __syncthreads();
    const int group = s_group;
    if (group < 0) return;  // uniform across the CTA
    const long long row0 = s_row0, rows = s_rows;
    const long long m0 = static_cast<long long>(s_tile_m) * kBM, n0 = static_cast<long long>(s_tile_n) * kBN;

    // This group's operands as strided matrices (see the table at the top of the file).
    const bf16* A;
    const bf16* B;
    OutT* C = static_cast<OutT*>(p.c);
    long long lda, ldb, ldc, M, Kr;
    if constexpr (kKind == GroupedGemmKind::kForward) {
        A = p.a + row0 * p.k, lda = p.k;
        B = p.b + group * p.k * p.n, ldb = p.n;
        C += row0 * p.n, ldc = p.n;
        M = rows, Kr = p.k;
    } else if constexpr (kKind == GroupedGemmKind::kGradInput) {
        A = p.a + row0 * p.n, lda = p.n;
        B = p.b + group * p.k * p.n, ldb = p.n;  // Bop(kk, j) = W[j * n + kk]
        C += row0 * p.k, ldc = p.k;
        M = rows, Kr = p.n;
    } else {
        A = p.a + row0 * p.k, lda = p.k;  // Aop(i, kk) = X[kk * k + i]
        B = p.b + row0 * p.n, ldb = p.n;
        C += group * p.k * p.n, ldc = p.n;
        M = p.k, Kr = rows;
    }

    bf16* tiles = reinterpret_cast<bf16*>(smem);
    auto a_stage = [&](int s) { return tiles + s * kStageElems; };
    auto b_stage = [&](int s) { return tiles + (2 + s) * kStageElems; };
    auto load_stage = [&](int s, long long k0) {
        if constexpr (kAContigK) {
            load_tile<kBM, kBK, kVec>(a_stage(s), A, lda, m0, M, k0, Kr);
        } else {
            load_tile<kBK, kBM, kVec>(a_stage(s), A, lda, k0, Kr, m0, M);
        }
        if constexpr (kBContigN) {
            load_tile<kBK, kBN, kVec>(b_stage(s), B, ldb, k0, Kr, n0, n_out);
        } else {
            load_tile<kBN, kBK, kVec>(b_stage(s), B, ldb, n0, n_out, k0, Kr);
        }
    };

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int wm = warp / (kBN / kWarpN), wn = warp % (kBN / kWarpN);
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[kFragM][kFragN];
#pragma unroll
    for (int i = 0; i < kFragM; ++i)
#pragma unroll
        for (int j = 0; j < kFragN; ++j) wmma::fill_fragment(acc[i][j], 0.0f);

    const long long num_k_tiles = (Kr + kBK - 1) / kBK;
    if (num_k_tiles > 0) {
        load_stage(0, 0);
        cp_async_commit();
    }
    for (long long kt = 0; kt < num_k_tiles; ++kt) {
        const int s = static_cast<int>(kt & 1);
        if (kt + 1 < num_k_tiles) {
            load_stage(s ^ 1, (kt + 1) * kBK);  // that stage was last read before the previous trailing barrier
            cp_async_commit();
            cp_async_wait<1>();  // this thread's copies of tile kt have landed
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();  // ... and every other thread's
        const bf16* sa = a_stage(s);
        const bf16* sb = b_stage(s);
#pragma unroll
        for (int kk = 0; kk < kBK; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, ALayout> fa[kFragM];
            wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, BLayout> fb[kFragN];
#pragma unroll
            for (int i = 0; i < kFragM; ++i) {
                const int mi = wm * kWarpM + i * 16;
                if constexpr (kAContigK) {
                    wmma::load_matrix_sync(fa[i], sa + mi * (kBK + kPad) + kk, kBK + kPad);
                } else {
                    wmma::load_matrix_sync(fa[i], sa + kk * (kBM + kPad) + mi, kBM + kPad);
                }
            }
#pragma unroll
            for (int j = 0; j < kFragN; ++j) {
                const int nj = wn * kWarpN + j * 16;
                if constexpr (kBContigN) {
                    wmma::load_matrix_sync(fb[j], sb + kk * (kBN + kPad) + nj, kBN + kPad);
                } else {
                    wmma::load_matrix_sync(fb[j], sb + nj * (kBK + kPad) + kk, kBK + kPad);
                }
            }
#pragma unroll
            for (int i = 0; i < kFragM; ++i)
#pragma unroll
                for (int j = 0; j < kFragN; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
        }
        __syncthreads();  // everyone is done with stage s before it is refilled
    }

    // Epilogue: each warp stages one 16x16 fp32 fragment at a time in its own slice of the (now
    // idle) tile buffers, then writes the in-range elements, rounded once to OutT.
    float* staging = reinterpret_cast<float*>(smem) + warp * 256;
#pragma unroll
    for (int i = 0; i < kFragM; ++i) {
#pragma unroll
        for (int j = 0; j < kFragN; ++j) {
            wmma::store_matrix_sync(staging, acc[i][j], 16, wmma::mem_row_major);
            __syncwarp();
            for (int e = lane; e < 256; e += 32) {
                const long long gm = m0 + wm * kWarpM + i * 16 + e / 16;
                const long long gn = n0 + wn * kWarpN + j * 16 + e % 16;
                if (gm < M && gn < n_out) {
                    float v = staging[e];
                    if (p.accumulate) v += load_f32(C + gm * ldc + gn);
                    store_f32(C + gm * ldc + gn, v);
                }
            }
            __syncwarp();
        }
    }
#else
    __trap();  // WMMA on bf16 needs sm_80 or newer
#endif
}

template <GroupedGemmKind kKind, class OutT>
void launch(const Params& p, bool vec, unsigned int grid, cudaStream_t stream) {
    if (vec) {
        grouped_gemm_kernel<kKind, OutT, true><<<grid, kThreads, 0, stream>>>(p);
    } else {
        grouped_gemm_kernel<kKind, OutT, false><<<grid, kThreads, 0, stream>>>(p);
    }
    SCMOE_CUDA_CHECK_LAUNCH("grouped_gemm_kernel");
}

template <class OutT>
void launch_kind(GroupedGemmKind kind, const Params& p, bool vec, unsigned int grid, cudaStream_t stream) {
    switch (kind) {
        case GroupedGemmKind::kForward:
            launch<GroupedGemmKind::kForward, OutT>(p, vec, grid, stream);
            return;
        case GroupedGemmKind::kGradInput:
            launch<GroupedGemmKind::kGradInput, OutT>(p, vec, grid, stream);
            return;
        case GroupedGemmKind::kGradWeight:
            launch<GroupedGemmKind::kGradWeight, OutT>(p, vec, grid, stream);
            return;
    }
}

}  // namespace

void device_grouped_gemm(const GroupedGemmArgs& a, cudaStream_t stream) {
    SCMOE_CHECK(a.ab_dtype == DType::kBF16, "grouped gemm provider device-grouped takes bf16 inputs, got "
                                                << dtype_name(a.ab_dtype) << " (use loop or cublas-batched)");
    SCMOE_CHECK(a.c_dtype == DType::kBF16 || a.c_dtype == DType::kF32,
                "grouped gemm provider device-grouped writes bf16 or f32, got " << dtype_name(a.c_dtype));
    if (a.num_groups == 0 || a.k == 0 || a.n == 0) {
        // Nothing to compute; kGradWeight still owes zeros for every group (none when accumulating).
        if (a.kind == GroupedGemmKind::kGradWeight && a.k * a.n > 0 && !a.accumulate) {
            SCMOE_CUDA_CHECK(cudaMemsetAsync(
                a.c, 0, static_cast<std::size_t>(a.num_groups * a.k * a.n) * dtype_size(a.c_dtype), stream));
        }
        return;
    }
    Params p;
    p.a = static_cast<const bf16*>(a.a);
    p.b = static_cast<const bf16*>(a.b);
    p.c = a.c;
    p.offsets = a.group_offsets;
    p.num_groups = a.num_groups;
    p.k = a.k;
    p.n = a.n;
    p.max_rows = a.max_rows;
    p.accumulate = a.accumulate;

    // Upper bound on the tiles: ragged groups add at most one partial row tile each.
    long long tiles;
    if (a.kind == GroupedGemmKind::kGradWeight) {
        tiles = static_cast<long long>(a.num_groups) * ((a.k + kBM - 1) / kBM) * ((a.n + kBN - 1) / kBN);
    } else {
        const long long n_out = a.kind == GroupedGemmKind::kGradInput ? a.k : a.n;
        tiles = ((a.max_rows + kBM - 1) / kBM + a.num_groups) * ((n_out + kBN - 1) / kBN);
    }
    SCMOE_CHECK(tiles <= INT_MAX, "grouped gemm: " << tiles << " tiles exceed the grid limit");
    if (tiles == 0) return;

    const bool vec = a.k % 8 == 0 && a.n % 8 == 0 && is_aligned(a.a, 16) && is_aligned(a.b, 16);
    const auto grid = static_cast<unsigned int>(tiles);
    if (a.c_dtype == DType::kBF16) {
        launch_kind<bf16>(a.kind, p, vec, grid, stream);
    } else {
        launch_kind<float>(a.kind, p, vec, grid, stream);
    }
}

}  // namespace scmoe::cuda
