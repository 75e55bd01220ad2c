// The emulated GPU behind the Device interface: ops take their modeled time and compute nothing,
// routing metadata is real, memory counts against the capacity, pageable copies block the host.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <numeric>
#include <vector>

#include "emu/emu_test_util.h"
#include "scmoe/kernels/emu/cost_model.h"
#include "scmoe/kernels/emu/emu_device.h"
#include "scmoe/kernels/emu/emu_ops.h"
#include "scmoe/kernels/error.h"
#include "scmoe/kernels/gemm.h"
#include "scmoe/kernels/grouped_gemm.h"
#include "scmoe/kernels/layout.h"
#include "scmoe/kernels/router.h"

namespace scmoe {
namespace {

std::unique_ptr<Device> round_device(emu::RoutingModel routing = {}) {
    emu::EmuOptions options;
    options.spec = test::round_spec();
    options.routing = std::move(routing);
    return emu::make_device(std::move(options));
}

// A bf16 GEMM [m, k] x [k, n] -> [m, n] over the three buffers.
GemmArgs bf16_gemm(std::int64_t m, std::int64_t n, std::int64_t k, DeviceBuffer& a, DeviceBuffer& b, DeviceBuffer& c) {
    GemmArgs g;
    g.m = m, g.n = n, g.k = k;
    g.a = a.data(), g.b = b.data(), g.c = c.data();
    g.ab_dtype = g.c_dtype = DType::kBF16;
    return g;
}

TEST(EmuCostModel, GemmTimeIsTheRooflineWithWaveQuantization) {
    const emu::GpuSpec spec = test::round_spec();
    GemmArgs g;
    g.m = 1280, g.n = 1280, g.k = 4096;  // 100 tiles of 128x128 = one full wave on 100 SMs
    g.ab_dtype = g.c_dtype = DType::kBF16;
    // 2 * 1280 * 1280 * 4096 FLOP at 1e8 FLOP/us.
    emu::KernelTime t = emu::model_kernel(op_cost(g), spec);
    EXPECT_NEAR(t.work_us, 2.0 * 1280 * 1280 * 4096 / 1e8, 1e-6);
    EXPECT_DOUBLE_EQ(t.demand, 1.0);
    // 11 x 10 = 110 tiles need two waves: the second leaves 90 SMs idle, efficiency 110 / 200.
    g.m = 1280 + 128;
    g.n = 1280;
    const double flops = 2.0 * 1408 * 1280 * 4096;
    t = emu::model_kernel(op_cost(g), spec);
    EXPECT_NEAR(t.work_us, flops / (1e8 * 110.0 / 200.0), 1e-6);  // 11 x 10 = 110 tiles
    // A thin GEMM is bound by memory: k = 8 reads little and writes a 1280 x 1280 bf16 result.
    g.m = 1280, g.k = 8;
    const double bytes = 2.0 * (1280 * 8 + 8 * 1280) + 2.0 * 1280 * 1280;
    EXPECT_NEAR(emu::model_kernel(op_cost(g), spec).work_us, bytes / 1e6, 1e-9);
}

// A kernel limited to S of the SMs (an SM budget, a grouped GEMM's sm_limit) runs on those: its
// waves over S SMs, S / SMs of the peak, a share of at most S / SMs.
TEST(EmuCostModel, AKernelLimitedToSomeSmsRunsOnThoseAlone) {
    const emu::GpuSpec spec = test::round_spec();  // 100 SMs
    GemmArgs g;
    g.m = 1280, g.n = 1280, g.k = 4096;  // 100 tiles: one wave on 100 SMs, two on 80 (the second 20 of 80)
    g.ab_dtype = g.c_dtype = DType::kBF16;
    const double flops = 2.0 * 1280 * 1280 * 4096;
    const emu::KernelTime all = emu::model_kernel(op_cost(g), spec, 0), limited = emu::model_kernel(op_cost(g), spec, 80);
    EXPECT_NEAR(all.work_us, flops / 1e8, 1e-6);
    EXPECT_NEAR(limited.work_us, flops / (1e8 * 0.8 * (100.0 / 160.0)), 1e-6);
    EXPECT_DOUBLE_EQ(limited.demand, 0.8);
    EXPECT_DOUBLE_EQ(emu::model_kernel(op_cost(g), spec, 100).work_us, all.work_us) << "a limit of every SM limits nothing";
    // Bound by memory: the SMs left still stream at the memory's rate.
    g.k = 8;
    EXPECT_DOUBLE_EQ(emu::model_kernel(op_cost(g), spec, 80).work_us, emu::model_kernel(op_cost(g), spec).work_us);
}

// The emulated grouped GEMM stands for cutlass-grouped: on sm_90 CUTLASS's persistent kernel with
// the block review 2 measured; on sm_80 an ordinary kernel (its registers were not measured).
TEST(EmuDevice, TheGroupedGemmIsPersistentOnSm90WithCutlasssBlock) {
    GroupedGemmArgs a;
    a.kind = GroupedGemmKind::kForward;
    a.sm_limit = 100;
    const emu::KernelShape h100 = emu::grouped_gemm_shape(a, emu::builtin_gpu_spec("h100"));
    EXPECT_TRUE(h100.persistent);
    EXPECT_EQ(h100.block.threads, 384);
    EXPECT_EQ(h100.block.registers_per_thread, 168);
    EXPECT_EQ(h100.block.shared_bytes, 215040);
    EXPECT_EQ(h100.sm_limit, 100);
    a.kind = GroupedGemmKind::kGradInput;
    EXPECT_EQ(emu::grouped_gemm_shape(a, emu::builtin_gpu_spec("h200")).block.shared_bytes, 215040);
    a.kind = GroupedGemmKind::kGradWeight;
    EXPECT_EQ(emu::grouped_gemm_shape(a, emu::builtin_gpu_spec("h100")).block.shared_bytes, 232448);
    EXPECT_FALSE(emu::grouped_gemm_shape(a, emu::builtin_gpu_spec("a800")).persistent);
    EXPECT_FALSE(emu::grouped_gemm_shape(a, test::round_spec()).persistent);
}

// A stream's SM budget is modeled as on CUDA: the grouped GEMMs enqueued while it is set run with
// sm_limit = the budget (0 again, every SM); other kernels (a cuBLAS GEMM) ignore it, as cuBLAS
// keeps its default SM count target (the bits must not depend on the overlap).
TEST(EmuDevice, AStreamsSmBudgetLimitsTheGroupedGemmsEnqueuedWhileItIsSet) {
    auto device = round_device();
    EXPECT_EQ(device->sm_count(), 100);
    auto stream = device->create_stream();
    const std::int64_t m = 1280, n = 1280, k = 4096;
    DeviceBuffer a(*device, m * k * 2), b(*device, k * n * 2), c(*device, m * n * 2);
    const GemmArgs g = bf16_gemm(m, n, k, a, b, c);
    auto timed = [&](int budget, const std::function<void()>& op) {
        auto start = device->create_event(), end = device->create_event();
        stream->set_sm_budget(budget);
        start->record(*stream);
        op();
        end->record(*stream);
        stream->set_sm_budget(0);
        end->synchronize();
        return end->elapsed_ms_since(*start) * 1000.0;
    };
    const emu::GpuSpec spec = test::round_spec();
    // launch 2 + gap 1 + the work on the SMs it may take
    EXPECT_NEAR(timed(0, [&] { gemm(g, *stream); }), 3.0 + emu::model_kernel(op_cost(g), spec).work_us, 1e-3);
    EXPECT_NEAR(timed(80, [&] { gemm(g, *stream); }), 3.0 + emu::model_kernel(op_cost(g), spec).work_us, 1e-3);
    EXPECT_GT(emu::model_kernel(op_cost(g), spec, 80).work_us, emu::model_kernel(op_cost(g), spec).work_us)
        << "the GEMM is large enough that 80 SMs would have been slower";
    GroupedGemmArgs gg;
    gg.num_groups = 2, gg.k = k, gg.n = n, gg.max_rows = 2 * m, gg.rows_per_group = m;
    gg.a = a.data(), gg.b = b.data(), gg.c = c.data();
    gg.ab_dtype = gg.c_dtype = DType::kBF16;
    EXPECT_EQ(grouped_gemm_sm_limit(gg, *stream), 0);
    const double alone = emu::model_kernel(op_cost(gg, 2 * m, 2), spec).work_us;
    const double on80 = emu::model_kernel(op_cost(gg, 2 * m, 2), spec, 80).work_us;
    EXPECT_GT(on80, alone);
    EXPECT_NEAR(timed(0, [&] { grouped_gemm(gg, *stream); }), 3.0 + alone, 1e-3);
    EXPECT_NEAR(timed(80, [&] { grouped_gemm(gg, *stream); }), 3.0 + on80, 1e-3);
    gg.sm_limit = 60;  // the args' own limit wins where it is smaller
    EXPECT_NEAR(timed(80, [&] { grouped_gemm(gg, *stream); }),
                3.0 + emu::model_kernel(op_cost(gg, 2 * m, 2), spec, 60).work_us, 1e-3);
    EXPECT_THROW(stream->set_sm_budget(-1), Error);
}

// GpuSpec::grouped_gemm_efficiency (cutlass-grouped over dense, measured): a grouped GEMM's compute runs
// at that fraction of the dense model's rate; a dense GEMM is untouched. The built-in GH100 specs carry
// their measurements.
TEST(EmuDevice, AGroupedGemmRunsAtTheSpecsGroupedFractionOfTheDenseRate) {
    emu::GpuSpec spec = test::round_spec();
    spec.grouped_gemm_efficiency = 0.5;
    emu::EmuOptions options;
    options.spec = spec;
    auto device = emu::make_device(std::move(options));
    auto stream = device->create_stream();
    const std::int64_t m = 1280, n = 1280, k = 4096;
    DeviceBuffer a(*device, 2 * m * k * 2), b(*device, 2 * k * n * 2), c(*device, 2 * m * n * 2);
    auto timed = [&](const std::function<void()>& op) {
        auto start = device->create_event(), end = device->create_event();
        start->record(*stream);
        op();
        end->record(*stream);
        end->synchronize();
        return end->elapsed_ms_since(*start) * 1000.0;
    };
    GroupedGemmArgs gg;
    gg.num_groups = 2, gg.k = k, gg.n = n, gg.max_rows = 2 * m, gg.rows_per_group = m;
    gg.a = a.data(), gg.b = b.data(), gg.c = c.data();
    gg.ab_dtype = gg.c_dtype = DType::kBF16;
    OpCost cost = op_cost(gg, 2 * m, 2);
    const double dense_rate = emu::model_kernel(cost, spec).work_us;
    cost.efficiency = 0.5;
    const double grouped = emu::model_kernel(cost, spec).work_us;
    EXPECT_NEAR(grouped, 2 * dense_rate, 1e-6 * grouped) << "compute-bound at this shape";
    EXPECT_NEAR(timed([&] { grouped_gemm(gg, *stream); }), 3.0 + grouped, 1e-3);
    const GemmArgs g = bf16_gemm(m, n, k, a, b, c);
    EXPECT_NEAR(timed([&] { gemm(g, *stream); }), 3.0 + emu::model_kernel(op_cost(g), spec).work_us, 1e-3);
    EXPECT_DOUBLE_EQ(emu::builtin_gpu_spec("h100").grouped_gemm_efficiency, 0.783);
    EXPECT_DOUBLE_EQ(emu::builtin_gpu_spec("h200").grouped_gemm_efficiency, 0.785);
    EXPECT_DOUBLE_EQ(emu::builtin_gpu_spec("a800").grouped_gemm_efficiency, 1.0);
}

TEST(EmuDevice, AGemmHoldsItsStreamForItsModeledTimeAndComputesNothing) {
    auto device = round_device();
    auto stream = device->create_stream();
    const std::int64_t m = 1280, n = 1280, k = 4096;
    DeviceBuffer a(*device, m * k * 2), b(*device, k * n * 2), c(*device, m * n * 2);
    const GemmArgs g = bf16_gemm(m, n, k, a, b, c);
    const double t0 = device->host_time_us();
    gemm(g, *stream);
    EXPECT_DOUBLE_EQ(device->host_time_us() - t0, 2.0);  // the launch only
    stream->synchronize();
    const double work = emu::model_kernel(op_cost(g), test::round_spec()).work_us;
    EXPECT_NEAR(device->host_time_us() - t0, 2.0 + 1.0 + work + 3.0, 1e-6);
    // Nothing was computed: C is still the zero pages it was reserved as.
    std::vector<std::uint16_t> out(16, 1);
    stream->copy(out.data(), c.data(), out.size() * 2);
    for (std::uint16_t v : out) EXPECT_EQ(v, 0);
}

TEST(EmuDevice, EventsTimeTheModeledTimeline) {
    auto device = round_device();
    auto stream = device->create_stream();
    auto start = device->create_event(), end = device->create_event();
    start->record(*stream);
    stream->host_task([] {});
    stream->host_task([] {});
    end->record(*stream);
    end->synchronize();
    // The first task starts at its launch (2 us after the start event), then the two hold the
    // callback lane 10 us each.
    EXPECT_NEAR(end->elapsed_ms_since(*start) * 1000.0, 22.0, 1e-3);
}

TEST(EmuDevice, AllocationsBeyondTheCapacityFailAsCudaOutOfMemory) {
    auto device = round_device();  // 1 GiB
    auto& emu_device = emu::as_emu(*device);
    DeviceBuffer a(*device, 600u << 20);
    try {
        DeviceBuffer b(*device, 500u << 20);
        FAIL() << "a 500 MiB allocation with 600 of 1024 MiB in use succeeded";
    } catch (const Error& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find("out of memory"), std::string::npos) << what;
        EXPECT_NE(what.find("cudaMalloc(500.0 MiB)"), std::string::npos) << what;
        EXPECT_NE(what.find("600.0 MiB in use of 1024.0 MiB"), std::string::npos) << what;
    }
    { DeviceBuffer b(*device, 400u << 20); }
    EXPECT_EQ(emu_device.memory().peak, 1000ull << 20);
    EXPECT_EQ(emu_device.memory().in_use, 600ull << 20);
    DeviceBuffer c(*device, 400u << 20);  // freed memory is usable again
}

// Payloads are never materialised: a GPU's worth of device memory costs this process no memory.
TEST(EmuDevice, DeviceMemoryIsNotHostMemory) {
    auto read_rss_mib = [] {
        std::ifstream statm("/proc/self/statm");
        long pages = 0, resident = 0;
        statm >> pages >> resident;
        return static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE)) / (1 << 20);
    };
    emu::EmuOptions options;
    options.spec = emu::builtin_gpu_spec("h100");
    auto device = emu::make_device(options);
    auto stream = device->create_stream();
    const double before = read_rss_mib();
    const std::int64_t m = 65536, n = 8192, k = 8192;  // 1 GiB of A, 128 MiB of B, 1 GiB of C in bf16
    DeviceBuffer a(*device, m * k * 2), b(*device, k * n * 2), c(*device, m * n * 2);
    DeviceBuffer big(*device, 60ull << 30);
    GemmArgs g;
    g.m = m, g.n = n, g.k = k;
    g.a = a.data(), g.b = b.data(), g.c = c.data();
    g.ab_dtype = g.c_dtype = DType::kBF16;
    for (int i = 0; i < 10; ++i) gemm(g, *stream);
    stream->fill_zero(big.data(), big.bytes());
    stream->synchronize();
    EXPECT_LT(read_rss_mib() - before, 64.0);
    EXPECT_GE(emu::as_emu(*device).memory().peak, 62ull << 30);
}

TEST(EmuDevice, PageableCopiesBlockTheHostAndPinnedOnesDoNot) {
    auto device = round_device();
    auto stream = device->create_stream();
    DeviceBuffer d(*device, 1 << 20);
    std::vector<char> pageable(1 << 20);
    void* pinned = device->allocate_host(1 << 20);
    // 1 MiB over a 1e4 byte/us link: 104.8576 us, plus the 1 us gap.
    const double copy_us = 1.0 + (1 << 20) / 1e4;
    double t0 = device->host_time_us();
    stream->copy(pinned, d.data(), 1 << 20);
    EXPECT_DOUBLE_EQ(device->host_time_us() - t0, 2.0);
    stream->synchronize();
    t0 = device->host_time_us();
    stream->copy(pageable.data(), d.data(), 1 << 20);
    EXPECT_NEAR(device->host_time_us() - t0, 2.0 + copy_us + 3.0, 1e-6);
    device->deallocate_host(pinned);
}

// Item 3 of issue 27: the host link. A copy runs on a copy engine, not the SMs: a pinned 1 MiB
// host-to-device copy enqueued right after a long kernel on another stream ends when the link alone
// says (its launch, the 1 us setup, 104.8576 us of bytes), long before the kernel, which keeps its
// own time.
TEST(EmuHostLink, ACopyRunsOnACopyEngineBesideAKernel) {
    auto device = round_device();
    auto a = device->create_stream(), b = device->create_stream();
    const std::int64_t m = 4096, n = 4096, k = 4096;
    DeviceBuffer x(*device, m * k * 2), y(*device, k * n * 2), z(*device, m * n * 2), d(*device, 1 << 20);
    void* pinned = device->allocate_host(1 << 20);
    const GemmArgs g = bf16_gemm(m, n, k, x, y, z);
    const double work = emu::model_kernel(op_cost(g), test::round_spec()).work_us;
    ASSERT_GT(work, 500.0);
    auto start = device->create_event(), kernel_end = device->create_event(), copy_end = device->create_event();
    start->record(*a);
    gemm(g, *a);                           // launched at +2, its gap, then `work`
    kernel_end->record(*a);
    b->copy(d.data(), pinned, 1 << 20);    // launched at +4, its setup, then the bytes
    copy_end->record(*b);
    a->synchronize();
    b->synchronize();
    EXPECT_NEAR(copy_end->elapsed_ms_since(*start) * 1e3, 4.0 + 1.0 + (1 << 20) / 1e4, 1e-3);  // elapsed_ms_since is a float
    EXPECT_NEAR(kernel_end->elapsed_ms_since(*start) * 1e3, 2.0 + 1.0 + work, 1e-3);  // elapsed_ms_since is a float
    device->deallocate_host(pinned);
}

// Two host-to-device copies in flight share the link: the first has it alone from +3 to +5 (2e4
// bytes), then each gets half (5e3 B/us) until the first is done, then the second finishes alone:
// the link is busy for 2 MiB / 1e4 B/us = 209.7152 us from +3, so the second ends at +212.7152 and
// the first at +5 + (1 MiB - 2e4) / 5e3 = +210.7152. Opposite directions do not share (full duplex).
TEST(EmuHostLink, CopiesOfOneDirectionShareTheLinkAndOppositeDirectionsDoNot) {
    auto device = round_device();
    auto b = device->create_stream(), c = device->create_stream();
    DeviceBuffer d1(*device, 1 << 20), d2(*device, 1 << 20);
    void* h1 = device->allocate_host(1 << 20);
    void* h2 = device->allocate_host(1 << 20);
    auto run = [&](bool opposite) {
        auto start = device->create_event(), end1 = device->create_event(), end2 = device->create_event();
        start->record(*b);
        b->copy(d1.data(), h1, 1 << 20);
        end1->record(*b);
        if (opposite) c->copy(h2, d2.data(), 1 << 20);
        else c->copy(d2.data(), h2, 1 << 20);
        end2->record(*c);
        b->synchronize();
        c->synchronize();
        return std::pair<double, double>{end1->elapsed_ms_since(*start) * 1e3, end2->elapsed_ms_since(*start) * 1e3};
    };
    const auto [same1, same2] = run(false);
    EXPECT_NEAR(same1, 5.0 + ((1 << 20) - 2e4) / 5e3, 1e-3);  // elapsed_ms_since is a float
    EXPECT_NEAR(same2, 3.0 + 2.0 * (1 << 20) / 1e4, 1e-3);  // elapsed_ms_since is a float
    const auto [up, down] = run(true);
    EXPECT_NEAR(up, 3.0 + (1 << 20) / 1e4, 1e-3);  // elapsed_ms_since is a float
    EXPECT_NEAR(down, 5.0 + (1 << 20) / 1e4, 1e-3);  // elapsed_ms_since is a float
    device->deallocate_host(h1);
    device->deallocate_host(h2);
}

// The built-in links: PCIe Gen4 x16 (A30, A800) at the 25 GB/s per direction measured on an A100
// PCIe, Gen5 x16 (H100, H200) at the 55.4 GB/s nvbandwidth measured host-to-device on an H200 node
// (gpu_spec.cpp, docs/emu-sources.md): 25e6 and 55.4e6 bytes take 1000 us.
TEST(EmuHostLink, BuiltInLinksRunAtTheirPcieGenerationsMeasuredRate) {
    for (const char* name : {"a30", "a800"}) {
        EXPECT_DOUBLE_EQ(emu::builtin_gpu_spec(name).host_link_gbps, 32.0) << name;
        EXPECT_NEAR(emu::host_copy_us(25e6, emu::builtin_gpu_spec(name)), 1000.0, 1e-9) << name;
    }
    for (const char* name : {"h100", "h200"}) {
        EXPECT_DOUBLE_EQ(emu::builtin_gpu_spec(name).host_link_gbps, 64.0) << name;
        EXPECT_NEAR(emu::host_copy_us(55.4e6, emu::builtin_gpu_spec(name)), 1000.0, 1e-9) << name;
    }
}

// Pinned host memory (cudaHostAlloc) is not GPU memory: it does not count against the capacity, and
// a payload fill of it, like one of device memory, costs this process no memory.
TEST(EmuHostLink, PinnedHostMemoryIsNotCountedOnTheGpu) {
    auto device = round_device();  // 1 GiB
    auto stream = device->create_stream();
    void* pinned = device->allocate_host(2ull << 30);  // more than the GPU holds
    EXPECT_EQ(emu::as_emu(*device).memory().in_use, 0u);
    stream->fill_zero(pinned, 2ull << 30);
    stream->synchronize();
    DeviceBuffer d(*device, 1 << 20);
    EXPECT_EQ(emu::as_emu(*device).memory().in_use, 1u << 20);
    device->deallocate_host(pinned);
}

// The router's choices come from the routing model and are real: the layout runs on them, and the
// grouped GEMM's time follows the rows each expert got.
TEST(EmuDevice, RoutingMetadataIsRealAndDrivesTheGroupedGemmTime) {
    emu::RoutingModel routing = emu::parse_routing_model("counts:6,2,0,0");
    auto device = round_device(routing);
    auto stream = device->create_stream();
    const std::int64_t tokens = 4096, hidden = 256, ffn = 512;
    const int experts = 4, top_k = 1;
    DeviceBuffer index(*device, tokens * 4), fraction(*device, experts * 4), counts(*device, experts * 4),
        offsets(*device, (experts + 1) * 4), slot(*device, tokens * 4), choice(*device, tokens * 4),
        dropped(*device, 4), logits(*device, tokens * experts * 4), probs(*device, tokens * experts * 4),
        lse(*device, tokens * 4), gates(*device, tokens * 4), losses(*device, 8);
    RouterForwardArgs r;
    r.tokens = tokens, r.num_experts = experts, r.top_k = top_k;
    r.logits = logits.as<float>(), r.probs = probs.as<float>(), r.logsumexp = lse.as<float>();
    r.expert_index = index.as<std::int32_t>(), r.gate_weight = gates.as<float>();
    r.expert_fraction = fraction.as<float>(), r.losses = losses.as<float>();
    router_forward(r, *stream);
    LayoutArgs l;
    l.tokens = tokens, l.num_experts = experts, l.top_k = top_k;
    l.expert_index = index.as<std::int32_t>(), l.expert_counts = counts.as<std::int32_t>();
    l.group_offsets = offsets.as<std::int32_t>(), l.slot_of_choice = slot.as<std::int32_t>();
    l.choice_of_row = choice.as<std::int32_t>(), l.dropped = dropped.as<std::int32_t>();
    compute_layout(l, *stream);
    std::vector<std::int32_t> c(experts);
    stream->copy(c.data(), counts.data(), experts * 4);  // pageable: returns when done
    EXPECT_EQ(std::accumulate(c.begin(), c.end(), 0), tokens);
    EXPECT_EQ(c[2] + c[3], 0);                   // zero weight: never chosen
    EXPECT_NEAR(c[0] / double(tokens), 0.75, 0.03);  // 6 : 2

    DeviceBuffer x(*device, tokens * hidden * 2), w(*device, experts * hidden * ffn * 2), y(*device, tokens * ffn * 2);
    GroupedGemmArgs gg;
    gg.num_groups = experts, gg.k = hidden, gg.n = ffn, gg.max_rows = tokens;
    gg.group_offsets = offsets.as<std::int32_t>();
    gg.a = x.data(), gg.b = w.data(), gg.c = y.data();
    gg.ab_dtype = gg.c_dtype = DType::kBF16;
    auto start = device->create_event(), end = device->create_event();
    start->record(*stream);
    grouped_gemm(gg, *stream);
    end->record(*stream);
    end->synchronize();
    // launch 2 + gap 1 + the GEMM over the 4096 rows of the 2 experts that got any
    const double expected = 3.0 + emu::model_kernel(op_cost(gg, tokens, 2), test::round_spec()).work_us;
    EXPECT_NEAR(end->elapsed_ms_since(*start) * 1000.0, expected, 1e-3);
}

TEST(EmuRouting, DrawsAreDistinctPerTokenDeterministicAndFollowTheModel) {
    const std::int64_t tokens = 20000;
    const int experts = 8, k = 2;
    auto draw = [&](const std::string& text, std::uint64_t key) {
        std::vector<std::int32_t> idx(tokens * k);
        std::vector<float> f(experts);
        emu::draw_choices(emu::parse_routing_model(text), key, tokens, experts, k, idx.data(), f.data());
        for (std::int64_t t = 0; t < tokens; ++t) EXPECT_NE(idx[t * k], idx[t * k + 1]);
        return std::make_pair(idx, f);
    };
    auto [b1, fb] = draw("balanced", 7);
    auto [b2, fb2] = draw("balanced", 7);
    auto [b3, fb3] = draw("balanced", 8);
    EXPECT_EQ(b1, b2);
    EXPECT_NE(b1, b3);
    for (float f : fb) EXPECT_NEAR(f, 1.0 / experts, 0.01);
    auto [z, fz] = draw("zipf:1.5", 7);
    for (int e = 1; e < experts; ++e) EXPECT_GT(fz[e - 1], fz[e]);
    EXPECT_THROW(emu::parse_routing_model("zipf:"), Error);
    EXPECT_THROW(emu::parse_routing_model("counts:1,-2"), Error);
    EXPECT_THROW(emu::parse_routing_model("uniform"), Error);
}

// Top-3 on the emulated router: every token's three choices are distinct experts, the dropless
// layout places all T*3 assignments, and the shares follow the model; top-k past the router's
// limit is refused with the same error as on the other backends.
TEST(EmuRouting, Top3DrawsThreeDistinctExpertsAndTheLayoutPlacesEveryAssignment) {
    auto device = round_device(emu::parse_routing_model("balanced"));
    auto stream = device->create_stream();
    const std::int64_t tokens = 6000;
    const int experts = 8, k = 3;
    const std::int64_t n = tokens * k;
    DeviceBuffer index(*device, n * 4), fraction(*device, experts * 4), counts(*device, experts * 4),
        offsets(*device, (experts + 1) * 4), slot(*device, n * 4), choice(*device, n * 4), dropped(*device, 4),
        logits(*device, tokens * experts * 4), probs(*device, tokens * experts * 4), lse(*device, tokens * 4),
        gates(*device, n * 4), losses(*device, 8);
    RouterForwardArgs r;
    r.tokens = tokens, r.num_experts = experts, r.top_k = k;
    r.logits = logits.as<float>(), r.probs = probs.as<float>(), r.logsumexp = lse.as<float>();
    r.expert_index = index.as<std::int32_t>(), r.gate_weight = gates.as<float>();
    r.expert_fraction = fraction.as<float>(), r.losses = losses.as<float>();
    router_forward(r, *stream);
    LayoutArgs l;
    l.tokens = tokens, l.num_experts = experts, l.top_k = k;
    l.expert_index = index.as<std::int32_t>(), l.expert_counts = counts.as<std::int32_t>();
    l.group_offsets = offsets.as<std::int32_t>(), l.slot_of_choice = slot.as<std::int32_t>();
    l.choice_of_row = choice.as<std::int32_t>(), l.dropped = dropped.as<std::int32_t>();
    compute_layout(l, *stream);
    std::vector<std::int32_t> idx(static_cast<std::size_t>(n)), c(experts), off(experts + 1);
    std::vector<float> f(experts);
    stream->copy(idx.data(), index.data(), n * 4);  // pageable: each returns when done
    stream->copy(c.data(), counts.data(), experts * 4);
    stream->copy(off.data(), offsets.data(), (experts + 1) * 4);
    stream->copy(f.data(), fraction.data(), experts * 4);
    for (std::int64_t t = 0; t < tokens; ++t) {
        const std::int32_t* mine = idx.data() + t * k;
        ASSERT_TRUE(mine[0] != mine[1] && mine[0] != mine[2] && mine[1] != mine[2])
            << "token " << t << " chose " << mine[0] << ", " << mine[1] << ", " << mine[2];
    }
    EXPECT_EQ(std::accumulate(c.begin(), c.end(), 0), n);
    EXPECT_EQ(off[experts], n);
    for (float share : f) EXPECT_NEAR(share, 1.0 / experts, 0.01);

    r.top_k = 9;
    try {
        router_forward(r, *stream);
        ADD_FAILURE() << "the emulated router accepted top_k 9";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("top_k = 9 outside [1, 8]"), std::string::npos) << e.what();
    }
}

TEST(EmuDevice, BuiltInSpecsAndBackendNames) {
    for (const char* name : {"a30", "a800", "h100", "h200"}) {
        const emu::GpuSpec& s = emu::builtin_gpu_spec(name);
        EXPECT_GT(s.bf16_tflops, 0) << name;
        EXPECT_FALSE(s.sources.empty()) << name;
    }
    EXPECT_EQ(emu::builtin_gpu_spec("A800").sms, 108);
    EXPECT_THROW(emu::builtin_gpu_spec("v100"), Error);
    auto device = make_device("emu", 0, "a30");
    EXPECT_EQ(device->backend(), Backend::kEmu);
    EXPECT_EQ(device->compute_dtype(), DType::kBF16);
    EXPECT_NE(device->description().find("A30"), std::string::npos);
    EXPECT_THROW(make_device("cpu", 0, "a30"), Error);
}

}  // namespace
}  // namespace scmoe
