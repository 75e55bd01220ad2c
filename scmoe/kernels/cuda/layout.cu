// Layout on CUDA: one CTA per expert scans the T*k assignments in (choice j, token t) order with a
// block-wide prefix sum, so positions inside an expert follow the CPU order exactly (first choices
// in token order, then second choices, and so on for any k) and the result is deterministic.
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "scmoe/kernels/cuda/check.cuh"
#include "scmoe/kernels/cuda/cuda_ops.h"

namespace scmoe::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kItems = 16;  // layout_assign_kernel: consecutive positions per thread in one chunk

__device__ __forceinline__ bool valid_expert(std::int32_t e, int num_experts) { return e >= 0 && e < num_experts; }

// Block e < E counts the assignments routed to expert e; block E counts out-of-range indices.
__global__ void layout_count_kernel(LayoutArgs a, std::int32_t* invalid) {
    using Reduce = cub::BlockReduce<int, kThreads>;
    __shared__ typename Reduce::TempStorage temp;
    const long long n = a.tokens * a.top_k;
    const int e = blockIdx.x;
    int count = 0;
    for (long long i = threadIdx.x; i < n; i += kThreads) {
        const std::int32_t x = a.expert_index[i];
        count += e < a.num_experts ? (x == e) : !valid_expert(x, a.num_experts);
    }
    const int total = Reduce(temp).Sum(count);
    if (threadIdx.x == 0) {
        if (e < a.num_experts) {
            a.expert_counts[e] = total;
        } else {
            *invalid = total;
        }
    }
}

// NOTES: block e places expert e's assignments. Its offset is the sum of the counts before it
// (dropless) or e * C (capacity); rows of the expert past its fill get choice -1. Block 0 also
// writes group_offsets[0], the dropped total (per-expert overflow summed in expert order, plus
// out-of-range indices, which the CPU rejects with an error and the device cannot) and slot -1 for
// out-of-range indices.
__global__ void layout_assign_kernel(LayoutArgs a, const std::int32_t* invalid) {
    using Scan = cub::BlockScan<int, kThreads>;
    __shared__ typename Scan::TempStorage temp;
    const int E = a.num_experts, K = a.top_k, e = blockIdx.x;
    const long long T = a.tokens, n = T * K, C = a.capacity;

    long long offset = 0;
    if (C > 0) {
        offset = e * C;
    } else {
        for (int i = 0; i < e; ++i) offset += a.expert_counts[i];
    }
    const long long count = a.expert_counts[e];
    const long long num_invalid = *invalid;
    __syncthreads();  // `invalid` aliases `dropped`, which thread 0 of block 0 overwrites below
    if (threadIdx.x == 0) {
        a.group_offsets[e + 1] = static_cast<std::int32_t>(C > 0 ? offset + C : offset + count);
        if (e == 0) {
            a.group_offsets[0] = 0;
            long long dropped = num_invalid;
            if (C > 0) {
                for (int i = 0; i < E; ++i) dropped += a.expert_counts[i] > C ? a.expert_counts[i] - C : 0;
            }
            *a.dropped = static_cast<std::int32_t>(dropped);
        }
    }
    if (e == 0 && C == 0) {
        // Dropless rows never reached because of out-of-range indices stay empty.
        for (long long r = n - num_invalid + threadIdx.x; r < n; r += kThreads) a.choice_of_row[r] = -1;
    }

    // Chunks of kThreads * kItems positions; thread i holds kItems consecutive ones, so one block scan
    // per chunk orders them (a scan per kThreads positions left the block waiting on one load and one
    // scan after another: 64 rounds for 8192 tokens x top-2).
    long long filled = 0;  // assignments of expert e seen so far, kept or not
    for (long long base = 0; base < n; base += static_cast<long long>(kThreads) * kItems) {
        const long long first = base + static_cast<long long>(threadIdx.x) * kItems;  // position in (j, t) order
        // (j, t) of `first`, stepped with a wrap instead of a 64-bit division per position.
        const long long first_j = first / T, first_t = first % T;
        std::int32_t x[kItems];
        int mine = 0;
        long long j = first_j, t = first_t;
#pragma unroll
        for (int i = 0; i < kItems; ++i) {
            const long long pos = first + i;
            x[i] = -1;
            if (pos < n) x[i] = a.expert_index[t * K + j];
            mine += pos < n && x[i] == e ? 1 : 0;
            if (++t == T) t = 0, ++j;
        }
        int before = 0, chunk_total = 0;
        Scan(temp).ExclusiveSum(mine, before, chunk_total);
        __syncthreads();  // temp is reused by the next chunk
        long long p = filled + before;
        j = first_j, t = first_t;
#pragma unroll
        for (int i = 0; i < kItems; ++i) {
            const long long pos = first + i;
            if (pos >= n) break;
            const long long choice = t * K + j;
            if (++t == T) t = 0, ++j;
            if (x[i] == e) {
                if (C > 0 && p >= C) {
                    a.slot_of_choice[choice] = -1;
                } else {
                    const long long row = offset + p;
                    a.slot_of_choice[choice] = static_cast<std::int32_t>(row);
                    a.choice_of_row[row] = static_cast<std::int32_t>(choice);
                }
                ++p;
            } else if (e == 0 && !valid_expert(x[i], E)) {
                a.slot_of_choice[choice] = -1;
            }
        }
        filled += chunk_total;
    }
    if (C > 0) {
        for (long long r = (count < C ? count : C) + threadIdx.x; r < C; r += kThreads)
            a.choice_of_row[offset + r] = -1;
    }
}

}  // namespace

void compute_layout(const LayoutArgs& a, void* stream) {
    cudaStream_t s = as_stream(stream);
    StreamDeviceGuard guard(s);
    SCMOE_CHECK(a.top_k >= 1, "layout: top_k = " << a.top_k << ": must be >= 1");
    SCMOE_CHECK(a.num_experts > 0 && a.tokens >= 0 && a.capacity >= 0,
                "layout: experts " << a.num_experts << ", tokens " << a.tokens << ", capacity " << a.capacity);
    SCMOE_CHECK(permuted_rows(a.tokens, a.num_experts, a.top_k, a.capacity) <= INT32_MAX,
                "layout: permuted rows exceed int32 offsets");
    // The out-of-range count travels through `dropped` between the two kernels.
    layout_count_kernel<<<a.num_experts + 1, kThreads, 0, s>>>(a, a.dropped);
    SCMOE_CUDA_CHECK_LAUNCH("layout_count_kernel");
    layout_assign_kernel<<<a.num_experts, kThreads, 0, s>>>(a, a.dropped);
    SCMOE_CUDA_CHECK_LAUNCH("layout_assign_kernel");
}

}  // namespace scmoe::cuda
