// The expert-parallel MoeLayer on one GPU: 4 LocalCommunicator ranks as threads, each with its own
// CUDA stream and bf16 buffers, against the CPU reference: the single-rank CPU f32 layer run on
// each rank's tokens with the same bf16-rounded parameters and inputs. Capacity and dropless,
// top-1 and top-2, uneven token counts; forward, the dropped count and every gradient (an
// expert's weight gradient is the sum of the references of the 4 ranks feeding it). A second pass
// must repeat the first bitwise. Skips with a message where no CUDA device answers.
//
// Tolerances (as tests/gpu/gpu_moe_layer_test.cpp; bf16 storage rounds every intermediate to 8
// significant bits): routing counts and dropped tokens exactly equal; y, grad_x and every gradient
// ||gpu - ref||_2 <= 3e-2 ||ref||_2 and max |gpu - ref| <= 1e-1 max |ref|.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "scmoe/comm/local_communicator.h"
#include "ep_reference.h"
#include "gpu/gpu_test_util.h"
#include "scmoe/kernels/math.h"

namespace scmoe {
namespace {

using gpu_testing::F;

constexpr int kRanks = 4;
const std::vector<std::int64_t> kTokens = {48, 16, 40, 24};

struct GpuEpCase {
    const char* name;
    DispatchMode dispatch;
    int top_k;
    bool shared;
    int experts = 8;  // 2 per rank; 4: one per rank (its rows on the chunked pipeline's slice layout)
};

void PrintTo(const GpuEpCase& c, std::ostream* os) { *os << c.name; }

MoeConfig case_config(const GpuEpCase& c, DType dtype) {
    MoeConfig m;
    m.hidden = 64;
    m.ffn = 64;
    m.num_experts = c.experts;
    m.top_k = c.top_k;
    m.capacity_factor = 1.0f;  // capacity mode drops some assignments: drops must match too
    m.dispatch = c.dispatch;
    m.activation = Activation::kSwiGLU;
    m.dtype = dtype;
    m.shared_expert = c.shared;
    m.coefficient_gate = c.shared;
    m.noise_std = 0.0f;
    m.aux_loss_coef = 0.01f;
    m.z_loss_coef = 0.001f;
    return m;
}

struct RankOutputs {
    F y, grad_x, grads;  // grads: MoeParamStore order (reference: all E experts; GPU: this rank's)
    std::int64_t dropped = 0;
    std::vector<std::int32_t> expert_counts;
};

struct RankInputs {
    F x, grad_y;
};

RankInputs rank_inputs(const MoeConfig& c, int r) {
    const std::int64_t n = kTokens[static_cast<std::size_t>(r)] * c.hidden;
    return {gpu_testing::round_bf16(gpu_testing::random_uniform(n, 1.0f, 100 + static_cast<std::uint64_t>(r))),
            gpu_testing::round_bf16(gpu_testing::random_uniform(n, 1.0f, 200 + static_cast<std::uint64_t>(r)))};
}

F full_params_bf16(const MoeConfig& c) {
    std::int64_t numel = 0;
    for (const ParamSpec& p : moe_param_specs(c)) numel += p.numel();
    return gpu_testing::round_bf16(gpu_testing::random_uniform(numel, 0.1f, 21));
}

RankOutputs cpu_reference(const MoeConfig& c, const F& params_full, const RankInputs& in, std::int64_t T) {
    auto device = make_device("cpu");
    auto stream = device->create_stream();
    MoeLayer layer(c, *device, T);
    layer.set_grouped_gemm_provider(GroupedGemmProvider::kAuto);
    MoeParamStore params(*device, c, DType::kF32), grads(*device, c, DType::kF32);
    std::copy(params_full.begin(), params_full.end(), static_cast<float*>(params.data()));
    F x = in.x, gy = in.grad_y;
    RankOutputs out;
    out.y.resize(x.size());
    out.grad_x.resize(x.size());
    const std::int64_t H = c.hidden;
    layer.forward(Tensor(x.data(), DType::kF32, {T, H}), Tensor(), params.view(),
                  Tensor(out.y.data(), DType::kF32, {T, H}), *stream);
    const MoeStats stats = layer.stats(*stream);
    out.dropped = stats.dropped_tokens;
    out.expert_counts = stats.expert_counts;
    layer.backward(Tensor(gy.data(), DType::kF32, {T, H}), params.view(), grads.view(),
                   Tensor(out.grad_x.data(), DType::kF32, {T, H}), Tensor(), *stream);
    stream->synchronize();
    const auto* g = static_cast<const float*>(grads.data());
    out.grads.assign(g, g + grads.numel());
    return out;
}

void upload_bf16(Stream& stream, void* dst, const F& host) {
    std::vector<std::uint16_t> bits(host.size());
    for (std::size_t i = 0; i < host.size(); ++i) bits[i] = math::f32_to_bf16_bits(host[i]);
    if (!bits.empty()) stream.copy(dst, bits.data(), bits.size() * sizeof(std::uint16_t));
    stream.synchronize();
}

F download(Stream& stream, const void* src, std::int64_t n, DType dtype) {
    F out(static_cast<std::size_t>(n));
    if (dtype == DType::kBF16) {
        std::vector<std::uint16_t> bits(out.size());
        if (n > 0) stream.copy(bits.data(), src, bits.size() * sizeof(std::uint16_t));
        stream.synchronize();
        for (std::size_t i = 0; i < out.size(); ++i) out[i] = math::bf16_bits_to_f32(bits[i]);
    } else {
        if (n > 0) stream.copy(out.data(), src, out.size() * sizeof(float));
        stream.synchronize();
    }
    return out;
}

// One rank on the GPU: two forward+backward passes (the second must repeat the first bitwise).
std::vector<RankOutputs> run_gpu_rank(const MoeConfig& c, Communicator& comm, const F& params_full,
                                      const RankInputs& in) {
    const int r = comm.rank();
    const std::int64_t T = kTokens[static_cast<std::size_t>(r)], H = c.hidden;
    auto device = make_device("cuda");
    auto stream = device->create_stream();
    MoeLayer layer(c, *device, *std::max_element(kTokens.begin(), kTokens.end()), &comm);
    MoeParamStore params(*device, c, DType::kBF16, kRanks), grads(*device, c, DType::kF32, kRanks);
    F local(static_cast<std::size_t>(params.numel()));
    testing::slice_params(c, kRanks, r, {params_full.data()}, local.data());
    upload_bf16(*stream, params.data(), local);
    const std::size_t bytes = static_cast<std::size_t>(std::max<std::int64_t>(T * H, 1)) * 2;
    DeviceBuffer x(*device, bytes), gy(*device, bytes), y(*device, bytes), gx(*device, bytes);
    upload_bf16(*stream, x.data(), in.x);
    upload_bf16(*stream, gy.data(), in.grad_y);
    auto t = [&](const DeviceBuffer& b) { return Tensor(b.data(), DType::kBF16, {T, H}); };
    std::vector<RankOutputs> passes;
    for (int pass = 0; pass < 2; ++pass) {
        RankOutputs out;
        layer.forward(t(x), Tensor(), params.view(), t(y), *stream);
        const MoeStats stats = layer.stats(*stream);
        out.dropped = stats.dropped_tokens;
        out.expert_counts = stats.expert_counts;
        layer.backward(t(gy), params.view(), grads.view(), t(gx), Tensor(), *stream);
        out.y = download(*stream, y.data(), T * H, DType::kBF16);
        out.grad_x = download(*stream, gx.data(), T * H, DType::kBF16);
        out.grads = download(*stream, grads.data(), grads.numel(), DType::kF32);
        passes.push_back(std::move(out));
    }
    return passes;
}

void expect_near_field(const F& got, const F& want, const std::string& what) {
    gpu_testing::expect_rel_l2(got, want, 3e-2, what.c_str());
    float max_ref = 0.0f, max_diff = 0.0f;
    for (std::size_t i = 0; i < want.size(); ++i) {
        max_ref = std::max(max_ref, std::abs(want[i]));
        max_diff = std::max(max_diff, std::abs(got[i] - want[i]));
    }
    EXPECT_LE(max_diff, 1e-1f * max_ref) << what << ": largest elementwise difference";
}

class GpuMoeEpLocalRanks : public ::testing::TestWithParam<GpuEpCase> {};

TEST_P(GpuMoeEpLocalRanks, FourRanksOnOneGpuEqualCpuReference) {
    SCMOE_REQUIRE_GPU();
    const GpuEpCase& ec = GetParam();
    const MoeConfig cpu_config = case_config(ec, DType::kF32), gpu_config = case_config(ec, DType::kBF16);
    const F params_full = full_params_bf16(cpu_config);
    std::vector<RankInputs> inputs;
    std::vector<RankOutputs> refs;
    for (int r = 0; r < kRanks; ++r) {
        inputs.push_back(rank_inputs(cpu_config, r));
        refs.push_back(cpu_reference(cpu_config, params_full, inputs.back(), kTokens[static_cast<std::size_t>(r)]));
    }

    auto group = LocalGroup::create(kRanks, 120.0);
    std::vector<std::unique_ptr<Communicator>> comms;
    for (int r = 0; r < kRanks; ++r) comms.push_back(group->communicator(r));
    std::vector<std::vector<RankOutputs>> got(kRanks);
    std::vector<std::string> errors(kRanks);
    std::vector<std::thread> threads;
    for (int r = 0; r < kRanks; ++r) {
        threads.emplace_back([&, r] {
            const auto i = static_cast<std::size_t>(r);
            try {
                got[i] = run_gpu_rank(gpu_config, *comms[i], params_full, inputs[i]);
            } catch (const std::exception& e) {
                errors[i] = std::string("rank ") + std::to_string(r) + " threw: " + e.what();
            }
        });
    }
    for (auto& t : threads) t.join();
    for (const std::string& e : errors) ASSERT_EQ(e, "");

    const auto specs = moe_param_specs(cpu_config, kRanks);
    std::vector<const float*> all_ref_grads;
    for (const RankOutputs& ref : refs) all_ref_grads.push_back(ref.grads.data());
    for (int r = 0; r < kRanks; ++r) {
        SCOPED_TRACE("rank " + std::to_string(r));
        const RankOutputs& ref = refs[static_cast<std::size_t>(r)];
        const RankOutputs& gpu = got[static_cast<std::size_t>(r)][0];
        EXPECT_EQ(gpu.expert_counts, ref.expert_counts) << "routing differs";
        EXPECT_EQ(gpu.dropped, ref.dropped);
        expect_near_field(gpu.y, ref.y, "y");
        expect_near_field(gpu.grad_x, ref.grad_x, "grad_x");
        // Non-expert gradients are this rank's own; an expert's slice sums every rank's reference.
        F summed(gpu.grads.size()), own(gpu.grads.size());
        testing::slice_params(cpu_config, kRanks, r, all_ref_grads, summed.data());
        testing::slice_params(cpu_config, kRanks, r, {ref.grads.data()}, own.data());
        std::size_t off = 0;
        for (const ParamSpec& s : specs) {
            const auto n = static_cast<std::size_t>(s.numel());
            if (n == 0) continue;
            const bool expert = s.name == "expert_w1" || s.name == "expert_w2";
            const F& want_all = expert ? summed : own;
            const auto at = [&](const F& v) {
                return F(v.begin() + static_cast<std::ptrdiff_t>(off),
                         v.begin() + static_cast<std::ptrdiff_t>(off + n));
            };
            expect_near_field(at(gpu.grads), at(want_all), "grad " + s.name);
            off += n;
        }
        const RankOutputs& again = got[static_cast<std::size_t>(r)][1];
        gpu_testing::expect_bitwise_equal(again.y, gpu.y, "y (second pass)");
        gpu_testing::expect_bitwise_equal(again.grad_x, gpu.grad_x, "grad_x (second pass)");
        gpu_testing::expect_bitwise_equal(again.grads, gpu.grads, "weight grads (second pass)");
    }
}

INSTANTIATE_TEST_SUITE_P(Bf16, GpuMoeEpLocalRanks,
                         ::testing::Values(GpuEpCase{"capacity_top1", DispatchMode::kCapacity, 1, false},
                                           GpuEpCase{"capacity_top2_shared", DispatchMode::kCapacity, 2, true},
                                           GpuEpCase{"dropless_top1", DispatchMode::kDropless, 1, false},
                                           GpuEpCase{"dropless_top2_shared", DispatchMode::kDropless, 2, true},
                                           GpuEpCase{"capacity_top3", DispatchMode::kCapacity, 3, false},
                                           GpuEpCase{"dropless_top3_shared", DispatchMode::kDropless, 3, true},
                                           GpuEpCase{"capacity_top1_one_expert_per_rank", DispatchMode::kCapacity, 1,
                                                     false, 4},
                                           GpuEpCase{"dropless_top2_shared_one_expert_per_rank",
                                                     DispatchMode::kDropless, 2, true, 4}),
                         [](const ::testing::TestParamInfo<GpuEpCase>& p) { return std::string(p.param.name); });

}  // namespace
}  // namespace scmoe
