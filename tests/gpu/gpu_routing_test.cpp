// CUDA router, layout, permute and combine against the CPU versions.
//
// Tolerances: f32 softmax probabilities, gate weights, logsumexp and router gradients 1e-5
// (absolute, scaled by max(1, |cpu|)); aux and z losses 1e-5 relative; expert indices, layout
// (counts, offsets, slots, rows) and dropped counts exactly equal; permute (a copy) and the
// bf16 sums of permute_backward / combine_backward's grad_yp bitwise equal to the rounded CPU f32
// result (same fp32 operations in the same order); combine 1e-2 (bf16, a multiply-add may fuse);
// grad_gate_weight (f32 dot product, other summation order) 1e-4.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "gpu_test_util.h"
#include "scmoe/kernels/error.h"
#include "scmoe/kernels/layout.h"
#include "scmoe/kernels/permute.h"
#include "scmoe/kernels/router.h"

namespace scmoe {
namespace {

using namespace gpu_testing;

struct RouterResult {
    F probs, lse, gate_weight, expert_fraction, losses, grad_logits;
    I expert_index;
};

RouterResult run_router_gpu(Backends& b, const F& logits, std::int64_t T, int E, int K, float noise, const F& grad_gw,
                            DType grad_dtype) {
    DeviceBuffer dl = upload(b, logits, DType::kF32), dggw = upload(b, grad_gw, DType::kF32);
    DeviceBuffer probs(*b.gpu, static_cast<std::size_t>(T * E) * 4 + 4),
        lse(*b.gpu, static_cast<std::size_t>(T) * 4 + 4), idx(*b.gpu, static_cast<std::size_t>(T * K) * 4 + 4),
        gw(*b.gpu, static_cast<std::size_t>(T * K) * 4 + 4), frac(*b.gpu, static_cast<std::size_t>(E) * 4),
        losses(*b.gpu, 8), grad(*b.gpu, static_cast<std::size_t>(T * E) * 4 + 4);
    RouterForwardArgs f;
    f.tokens = T;
    f.num_experts = E;
    f.top_k = K;
    f.noise_std = noise;
    f.noise_seed = 1234;
    f.logits = dl.as<float>();
    f.probs = probs.as<float>();
    f.logsumexp = lse.as<float>();
    f.expert_index = idx.as<std::int32_t>();
    f.gate_weight = gw.as<float>();
    f.expert_fraction = frac.as<float>();
    f.losses = losses.as<float>();
    router_forward(f, *b.gpu_stream);
    RouterBackwardArgs r;
    r.tokens = T;
    r.num_experts = E;
    r.top_k = K;
    r.aux_loss_coef = 0.01f;
    r.z_loss_coef = 0.001f;
    r.probs = f.probs;
    r.logsumexp = f.logsumexp;
    r.expert_index = f.expert_index;
    r.expert_fraction = f.expert_fraction;
    r.grad_gate_weight = dggw.as<float>();
    r.grad_logits = grad.data();
    r.grad_dtype = grad_dtype;
    router_backward(r, *b.gpu_stream);
    RouterResult out;
    out.probs = download(b, probs.data(), T * E, DType::kF32);
    out.lse = download(b, lse.data(), T, DType::kF32);
    out.expert_index = download_i32(b, idx.data(), T * K);
    out.gate_weight = download(b, gw.data(), T * K, DType::kF32);
    out.expert_fraction = download(b, frac.data(), E, DType::kF32);
    out.losses = download(b, losses.data(), 2, DType::kF32);
    out.grad_logits = download(b, grad.data(), T * E, grad_dtype);
    return out;
}

RouterResult run_router_cpu(Backends& b, const F& logits, std::int64_t T, int E, int K, float noise, const F& grad_gw) {
    RouterResult out;
    out.probs.resize(static_cast<std::size_t>(T * E));
    out.lse.resize(static_cast<std::size_t>(T));
    out.expert_index.resize(static_cast<std::size_t>(T * K));
    out.gate_weight.resize(static_cast<std::size_t>(T * K));
    out.expert_fraction.resize(static_cast<std::size_t>(E));
    out.losses.resize(2);
    out.grad_logits.resize(static_cast<std::size_t>(T * E));
    RouterForwardArgs f;
    f.tokens = T;
    f.num_experts = E;
    f.top_k = K;
    f.noise_std = noise;
    f.noise_seed = 1234;
    f.logits = logits.data();
    f.probs = out.probs.data();
    f.logsumexp = out.lse.data();
    f.expert_index = out.expert_index.data();
    f.gate_weight = out.gate_weight.data();
    f.expert_fraction = out.expert_fraction.data();
    f.losses = out.losses.data();
    router_forward(f, *b.cpu_stream);
    RouterBackwardArgs r;
    r.tokens = T;
    r.num_experts = E;
    r.top_k = K;
    r.aux_loss_coef = 0.01f;
    r.z_loss_coef = 0.001f;
    r.probs = f.probs;
    r.logsumexp = f.logsumexp;
    r.expert_index = f.expert_index;
    r.expert_fraction = f.expert_fraction;
    r.grad_gate_weight = grad_gw.data();
    r.grad_logits = out.grad_logits.data();
    r.grad_dtype = DType::kF32;
    router_backward(r, *b.cpu_stream);
    b.cpu_stream->synchronize();
    return out;
}

TEST(GpuRouting, RouterForwardBackwardMatchesCpu) {
    SCMOE_REQUIRE_GPU();
    Backends b;
    const std::int64_t T = 300;
    const int E = 8;
    std::uint64_t seed = 1;
    for (int K : {1, 2, 3, kMaxTopK}) {
        for (float noise : {0.0f, 0.5f}) {
            for (DType grad_dtype : {DType::kF32, DType::kBF16}) {
                SCOPED_TRACE("k=" + std::to_string(K) + " noise=" + std::to_string(noise) + " grad " +
                             dtype_name(grad_dtype));
                F logits = random_uniform(T * E, 3.0f, seed++);
                // Ties: a row of equal logits (-> experts 0, 1) and a row with a tie for first place.
                for (int e = 0; e < E; ++e) logits[static_cast<std::size_t>(5 * E + e)] = 0.25f;
                logits[7 * E + 3] = logits[7 * E + 6] = 9.0f;
                const F ggw = random_uniform(T * K, 1.0f, seed++);
                const RouterResult g = run_router_gpu(b, logits, T, E, K, noise, ggw, grad_dtype);
                const RouterResult c = run_router_cpu(b, logits, T, E, K, noise, ggw);
                EXPECT_EQ(g.expert_index, c.expert_index);
                expect_close(g.probs, c.probs, 1e-5f, "probs");
                expect_close(g.lse, c.lse, 1e-5f, "logsumexp");
                expect_close(g.gate_weight, c.gate_weight, 1e-5f, "gate_weight");
                EXPECT_EQ(g.expert_fraction, c.expert_fraction);
                EXPECT_NEAR(g.losses[0], c.losses[0], 1e-5f * std::abs(c.losses[0])) << "aux loss";
                EXPECT_NEAR(g.losses[1], c.losses[1], 1e-5f * std::abs(c.losses[1])) << "z loss";
                expect_close(g.grad_logits, c.grad_logits, grad_dtype == DType::kF32 ? 1e-5f : 1e-2f, "grad_logits");
                if (noise == 0.0f) {
                    // All tied: experts 0 .. K-1 in order.
                    for (int j = 0; j < K; ++j)
                        EXPECT_EQ(g.expert_index[static_cast<std::size_t>(5 * K + j)], j) << "choice " << j;
                    EXPECT_EQ(g.expert_index[static_cast<std::size_t>(7 * K)], 3);
                    if (K >= 2) {
                        EXPECT_EQ(g.expert_index[static_cast<std::size_t>(7 * K + 1)], 6);
                    }
                }
            }
        }
    }
}

TEST(GpuRouting, TopKBeyondTheKernelLimitIsNamed) {
    SCMOE_REQUIRE_GPU();
    Backends b;
    const std::int64_t T = 4;
    const int E = 16, K = kMaxTopK + 1;
    try {
        run_router_gpu(b, random_uniform(T * E, 1.0f, 3), T, E, K, 0.0f, random_uniform(T * K, 1.0f, 4), DType::kF32);
        ADD_FAILURE() << "the CUDA router accepted top_k " << K;
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("router: top_k = 9 outside [1, 8]"), std::string::npos) << e.what();
    }
}

struct LayoutResult {
    I counts, offsets, slots, rows, dropped;
};

LayoutResult layout_gpu(Backends& b, const I& idx, std::int64_t T, int E, int K, std::int64_t C) {
    const std::int64_t R = permuted_rows(T, E, K, C);
    DeviceBuffer di = upload_i32(b, idx);
    DeviceBuffer counts(*b.gpu, static_cast<std::size_t>(E) * 4), offsets(*b.gpu, static_cast<std::size_t>(E + 1) * 4),
        slots(*b.gpu, static_cast<std::size_t>(T * K) * 4 + 4), rows(*b.gpu, static_cast<std::size_t>(R) * 4 + 4),
        dropped(*b.gpu, 4);
    LayoutArgs a;
    a.tokens = T;
    a.num_experts = E;
    a.top_k = K;
    a.capacity = C;
    a.expert_index = di.as<std::int32_t>();
    a.expert_counts = counts.as<std::int32_t>();
    a.group_offsets = offsets.as<std::int32_t>();
    a.slot_of_choice = slots.as<std::int32_t>();
    a.choice_of_row = rows.as<std::int32_t>();
    a.dropped = dropped.as<std::int32_t>();
    compute_layout(a, *b.gpu_stream);
    return {download_i32(b, counts.data(), E), download_i32(b, offsets.data(), E + 1),
            download_i32(b, slots.data(), T * K), download_i32(b, rows.data(), R), download_i32(b, dropped.data(), 1)};
}

LayoutResult layout_cpu(Backends& b, const I& idx, std::int64_t T, int E, int K, std::int64_t C) {
    LayoutResult r{I(static_cast<std::size_t>(E)), I(static_cast<std::size_t>(E + 1)),
                   I(static_cast<std::size_t>(T * K)), I(static_cast<std::size_t>(permuted_rows(T, E, K, C))), I(1)};
    LayoutArgs a;
    a.tokens = T;
    a.num_experts = E;
    a.top_k = K;
    a.capacity = C;
    a.expert_index = idx.data();
    a.expert_counts = r.counts.data();
    a.group_offsets = r.offsets.data();
    a.slot_of_choice = r.slots.data();
    a.choice_of_row = r.rows.data();
    a.dropped = r.dropped.data();
    compute_layout(a, *b.cpu_stream);
    b.cpu_stream->synchronize();
    return r;
}

// Expert choices skewed towards expert 0 (so capacity drops happen), distinct per token for any k.
I skewed_choices(std::int64_t T, int E, int K, std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    I idx(static_cast<std::size_t>(T * K));
    for (std::int64_t t = 0; t < T; ++t) {
        std::int32_t* mine = idx.data() + t * K;
        mine[0] = rng() % 3 == 0 ? 0 : static_cast<int>(rng() % static_cast<std::uint64_t>(E));
        for (int j = 1; j < K; ++j) {
            bool taken = true;
            while (taken) {
                mine[j] = static_cast<int>(rng() % static_cast<std::uint64_t>(E));
                taken = std::find(mine, mine + j, mine[j]) != mine + j;
            }
        }
    }
    return idx;
}

TEST(GpuRouting, LayoutMatchesCpuExactly) {
    SCMOE_REQUIRE_GPU();
    Backends b;
    const int E = 8;
    // 4096 x top-1: exactly one chunk of layout_assign_kernel; 5000 x top-8: 10 chunks, the last short.
    for (const std::int64_t T : std::vector<std::int64_t>{1, 37, 1000, 4096, 5000}) {
        for (int K : {1, 2, 3, E}) {
            for (float cf : {0.0f, 1.0f, 1.25f}) {  // 0 = dropless
                const std::int64_t C = cf > 0.0f ? expert_capacity(T, E, K, cf) : 0;
                SCOPED_TRACE("T=" + std::to_string(T) + " k=" + std::to_string(K) + " capacity=" + std::to_string(C));
                const I idx = skewed_choices(T, E, K, static_cast<std::uint64_t>(T * 10 + K));
                const LayoutResult g = layout_gpu(b, idx, T, E, K, C), c = layout_cpu(b, idx, T, E, K, C);
                EXPECT_EQ(g.counts, c.counts);
                EXPECT_EQ(g.offsets, c.offsets);
                EXPECT_EQ(g.slots, c.slots);
                EXPECT_EQ(g.rows, c.rows);
                EXPECT_EQ(g.dropped, c.dropped);
                if (C > 0 && T >= 1000 && K < E) {
                    EXPECT_GT(c.dropped[0], 0) << "the skewed load should overflow expert 0";
                }
            }
        }
    }
}

TEST(GpuRouting, PermuteCombineAndBackwardMatchCpu) {
    SCMOE_REQUIRE_GPU();
    Backends b;
    const int E = 4;
    const std::int64_t T = 200, H = 72;
    for (int K : {2, 3}) {
        for (float cf : {0.0f, 1.0f}) {
            const std::int64_t C = cf > 0.0f ? expert_capacity(T, E, K, cf) : 0;
            const std::int64_t R = permuted_rows(T, E, K, C);
            SCOPED_TRACE("k=" + std::to_string(K) + " capacity=" + std::to_string(C));
            const I idx = skewed_choices(T, E, K, 99);
            const LayoutResult lay = layout_cpu(b, idx, T, E, K, C);
            const F x = round_bf16(random_uniform(T * H, 1.0f, 1));
            const F yp = round_bf16(random_uniform(R * H, 1.0f, 2));
            const F gy = round_bf16(random_uniform(T * H, 1.0f, 3));
            const F gxp = round_bf16(random_uniform(R * H, 1.0f, 4));
            const F y0 = round_bf16(random_uniform(T * H, 1.0f, 5));
            const F gw = random_uniform(T * K, 1.0f, 6);
            DeviceBuffer dx = upload(b, x, DType::kBF16), dyp = upload(b, yp, DType::kBF16),
                         dgy = upload(b, gy, DType::kBF16), dgxp = upload(b, gxp, DType::kBF16),
                         dgw = upload(b, gw, DType::kF32);
            DeviceBuffer dslots = upload_i32(b, lay.slots), drows = upload_i32(b, lay.rows);
            DeviceBuffer dxp(*b.gpu, static_cast<std::size_t>(R * H) * 2),
                dgyp(*b.gpu, static_cast<std::size_t>(R * H) * 2), dggw(*b.gpu, static_cast<std::size_t>(T * K) * 4);

            for (bool accumulate : {false, true}) {
                SCOPED_TRACE(accumulate ? "accumulate" : "overwrite");
                DeviceBuffer dy = upload(b, y0, DType::kBF16), dgx = upload(b, y0, DType::kBF16);
                permute({R, H, K, DType::kBF16, dx.data(), drows.as<std::int32_t>(), dxp.data()}, *b.gpu_stream);
                permute_backward({T, H, K, accumulate, DType::kBF16, dgxp.data(), dslots.as<std::int32_t>(), dgx.data()},
                                 *b.gpu_stream);
                combine(
                    {T, H, K, accumulate, DType::kBF16, dyp.data(), dslots.as<std::int32_t>(), dgw.as<float>(), dy.data()},
                    *b.gpu_stream);
                combine_backward({T, R, H, K, DType::kBF16, dgy.data(), dyp.data(), dslots.as<std::int32_t>(),
                                  drows.as<std::int32_t>(), dgw.as<float>(), dgyp.data(), dggw.as<float>()},
                                 *b.gpu_stream);

                F xp(static_cast<std::size_t>(R * H)), gx = y0, y = y0, gyp(static_cast<std::size_t>(R * H)),
                                                       ggw(static_cast<std::size_t>(T * K));
                permute({R, H, K, DType::kF32, x.data(), lay.rows.data(), xp.data()}, *b.cpu_stream);
                permute_backward({T, H, K, accumulate, DType::kF32, gxp.data(), lay.slots.data(), gx.data()},
                                 *b.cpu_stream);
                combine({T, H, K, accumulate, DType::kF32, yp.data(), lay.slots.data(), gw.data(), y.data()},
                        *b.cpu_stream);
                combine_backward({T, R, H, K, DType::kF32, gy.data(), yp.data(), lay.slots.data(), lay.rows.data(),
                                  gw.data(), gyp.data(), ggw.data()},
                                 *b.cpu_stream);
                b.cpu_stream->synchronize();

                EXPECT_EQ(download(b, dxp.data(), R * H, DType::kBF16), xp) << "permute is a copy";
                EXPECT_EQ(download(b, dgx.data(), T * H, DType::kBF16), round_bf16(gx)) << "permute_backward";
                expect_close(download(b, dy.data(), T * H, DType::kBF16), y, 1e-2f, "combine");
                EXPECT_EQ(download(b, dgyp.data(), R * H, DType::kBF16), round_bf16(gyp)) << "combine_backward grad_yp";
                expect_close(download(b, dggw.data(), T * K, DType::kF32), ggw, 1e-4f, "grad_gate_weight");
            }
        }
    }
}

}  // namespace
}  // namespace scmoe
