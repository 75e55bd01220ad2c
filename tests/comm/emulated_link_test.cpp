// EmulatedLink over LocalCommunicator ranks: the link model, its parser, and that a wrapped op
// holds its stream for at least the modelled time while its results stay exactly the wrapped op's.
// Only the lower bound is asserted (a link is never faster than its model); how close to the model
// the hold comes depends on the machine's load, and `scmoe-bench a2a --link` reports it (its time
// column next to the model column).
#include "scmoe/comm/emulated_link.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "scmoe/comm/local_communicator.h"
#include "scmoe/kernels/device.h"
#include "scmoe/kernels/error.h"

namespace scmoe {
namespace {

TEST(EmulatedLinkModel, PresetsAndCustom) {
    const LinkModel pcie = parse_link_model("pcie4");
    EXPECT_EQ(pcie.name, "pcie4");
    EXPECT_DOUBLE_EQ(pcie.gbps, 25.0);
    EXPECT_DOUBLE_EQ(pcie.latency_us, 10.0);
    EXPECT_DOUBLE_EQ(parse_link_model("nvlink4").gbps, 450.0);
    EXPECT_DOUBLE_EQ(parse_link_model("ib-ndr").gbps, 50.0);
    EXPECT_DOUBLE_EQ(parse_link_model("100gbe").gbps, 12.5);
    const LinkModel custom = parse_link_model("gbps=0.05,latency_us=100");
    EXPECT_EQ(custom.name, "custom");
    EXPECT_DOUBLE_EQ(custom.gbps, 0.05);
    EXPECT_DOUBLE_EQ(custom.latency_us, 100.0);
    EXPECT_DOUBLE_EQ(parse_link_model("latency_us=2,gbps=3").latency_us, 2.0);
    EXPECT_THROW(parse_link_model("pcie5"), Error);
    EXPECT_THROW(parse_link_model("gbps=0"), Error);
    EXPECT_THROW(parse_link_model("gbps=abc"), Error);
    EXPECT_THROW(parse_link_model("latency_us=3"), Error);
    EXPECT_THROW(parse_link_model("gbps=1,latency=3"), Error);
}

TEST(EmulatedLinkModel, Formulas) {
    const LinkModel m{"t", 2.0, 7.0};  // 2 GB/s = 2000 bytes/us
    EXPECT_DOUBLE_EQ(modelled_link_us(m, LinkOp::kAllToAllV, 4000.0, 4), 7.0 + 2.0);
    EXPECT_DOUBLE_EQ(modelled_link_us(m, LinkOp::kAllReduceSum, 4000.0, 4), 7.0 + 2.0 * 0.75 * 2.0);
    EXPECT_DOUBLE_EQ(modelled_link_us(m, LinkOp::kAllGather, 4000.0, 4), 7.0 + 0.75 * 2.0);
    EXPECT_DOUBLE_EQ(modelled_link_us(m, LinkOp::kBroadcast, 4000.0, 4), 7.0 + 2.0);
    EXPECT_DOUBLE_EQ(modelled_link_us(m, LinkOp::kBarrier, 4000.0, 4), 7.0);
    EXPECT_DOUBLE_EQ(modelled_link_us(m, LinkOp::kAllToAllV, 4000.0, 1), 0.0);  // no link crossed
}

// Runs fn(rank, link, stream) on every rank of a LocalGroup wrapped in `model`, one thread and one
// CPU stream per rank; returns each rank's error ("" when none).
template <class Fn>
std::vector<std::string> run_linked_ranks(int n, const LinkModel& model, Fn fn) {
    auto group = LocalGroup::create(n, 30.0);
    std::vector<std::unique_ptr<EmulatedLink>> links;
    for (int r = 0; r < n; ++r) links.push_back(std::make_unique<EmulatedLink>(group->communicator(r), model));
    std::vector<std::string> errors(static_cast<std::size_t>(n));
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
        threads.emplace_back([&, r] {
            auto device = make_device("cpu");
            auto stream = device->create_stream();
            try {
                fn(r, *links[static_cast<std::size_t>(r)], *device, *stream);
                stream->synchronize();
            } catch (const Error& e) {
                errors[static_cast<std::size_t>(r)] = e.what();
            }
        });
    }
    for (auto& t : threads) t.join();
    return errors;
}

float a2a_value(int src, int dst, std::int64_t i) {
    return static_cast<float>((src * 7919 + dst * 131 + i) % 16777216);
}

// 2 ranks, uneven counts (rank 0 sends more than it receives), a slow link: every a2a is modelled
// as latency + max(sent, received off-rank bytes) / bandwidth and takes no less. Sizes give 5-50 ms
// of modelled time.
TEST(EmulatedLinkTwoRanks, AllToAllVHoldsForTheModelAndKeepsData) {
    const LinkModel slow{"slow", 0.05, 100.0};  // 50 bytes per us
    const int n = 2;
    // Elements rank 0 sends to rank 1 per case; rank 1 sends a quarter of that back.
    const std::vector<std::int64_t> cases = {62'500, 250'000, 625'000};  // 250 KB, 1 MB, 2.5 MB of f32
    auto errors = run_linked_ranks(n, slow, [&](int r, EmulatedLink& link, Device& device, Stream& stream) {
        for (const std::int64_t big : cases) {
            const std::int64_t small = big / 4;
            std::vector<std::vector<std::int64_t>> counts = {{3, big}, {small, 5}};
            const auto& mine = counts[static_cast<std::size_t>(r)];
            std::vector<float> send;
            for (int p = 0; p < n; ++p)
                for (std::int64_t i = 0; i < mine[static_cast<std::size_t>(p)]; ++i) send.push_back(a2a_value(r, p, i));
            std::int64_t total = 0;
            for (int s = 0; s < n; ++s) total += counts[static_cast<std::size_t>(s)][static_cast<std::size_t>(r)];
            std::vector<float> recv(static_cast<std::size_t>(total), -1.0f);
            std::vector<std::int64_t> recv_counts(n, -7);

            // Every run against the lower bound and the counters.
            const double bytes = static_cast<double>(big) * 4.0;
            const double model_us = slow.latency_us + bytes / (slow.gbps * 1e3);
            EXPECT_DOUBLE_EQ(link.modelled_us(LinkOp::kAllToAllV, bytes), model_us);
            constexpr int kRepeats = 2;
            for (int repeat = 0; repeat < kRepeats; ++repeat) {
                auto t0 = device.create_event();
                auto t1 = device.create_event();
                link.reset_counters();
                link.inner().barrier(stream);  // both ranks start together; not counted by the link
                t0->record(stream);
                link.all_to_all_v(send.data(), mine.data(), recv.data(), recv_counts.data(), DType::kF32, stream);
                t1->record(stream);
                stream.synchronize();
                const double measured_us = 1000.0 * t1->elapsed_ms_since(*t0);
                // Both ranks move max(big, small) elements across the link: rank 0 sends big,
                // rank 1 receives big.
                EXPECT_GE(measured_us, model_us) << "rank " << r << ", " << bytes << " bytes";
                const LinkCounters c = link.counters(LinkOp::kAllToAllV);
                EXPECT_EQ(c.ops, 1);
                EXPECT_DOUBLE_EQ(c.bytes, bytes);
                EXPECT_DOUBLE_EQ(c.modelled_us, model_us);
                EXPECT_GE(c.measured_us, model_us);
                EXPECT_LE(c.wrapped_us, c.measured_us);
                EXPECT_EQ(link.counters().ops, 1);
            }

            std::size_t k = 0;
            for (int s = 0; s < n; ++s) {
                const std::int64_t c_in = counts[static_cast<std::size_t>(s)][static_cast<std::size_t>(r)];
                EXPECT_EQ(recv_counts[static_cast<std::size_t>(s)], c_in);
                std::int64_t bad = 0;
                for (std::int64_t i = 0; i < c_in; ++i, ++k) bad += recv[k] != a2a_value(s, r, i);
                EXPECT_EQ(bad, 0) << "rank " << r << " from " << s;
            }
        }
    });
    for (std::size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

// The other collectives pass through exactly and hold their streams for at least their own models.
TEST(EmulatedLinkFourRanks, OtherCollectivesExactAndModelled) {
    const LinkModel link_model{"t", 0.5, 2000.0};  // 500 bytes per us, 2 ms per op
    const int n = 4;
    auto errors = run_linked_ranks(n, link_model, [&](int r, EmulatedLink& link, Device& device, Stream& stream) {
        constexpr std::int64_t kCount = 1000;
        std::vector<std::int32_t> sum(kCount), gathered(n * kCount), bcast(kCount);
        const double bytes = kCount * 4.0;
        const double model_us = link.modelled_us(LinkOp::kAllReduceSum, bytes) +
                                link.modelled_us(LinkOp::kAllGather, n * bytes) +
                                link.modelled_us(LinkOp::kBroadcast, bytes) + link.modelled_us(LinkOp::kBarrier, 0.0);
        EXPECT_DOUBLE_EQ(model_us, 4 * 2000.0 + (2 * 0.75 * bytes + 0.75 * n * bytes + bytes) / 500.0);
        // Two runs from fresh inputs: each holds at least the modelled time; the data and counters
        // checked after are the last run's.
        for (int attempt = 0; attempt < 2; ++attempt) {
            for (std::int64_t i = 0; i < kCount; ++i) {
                sum[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(r * 1000 + i);
                gathered[static_cast<std::size_t>(r * kCount + i)] = static_cast<std::int32_t>(r * 1000 + i);
                bcast[static_cast<std::size_t>(i)] = r == 2 ? static_cast<std::int32_t>(i * 3) : -1;
            }
            auto t0 = device.create_event();
            auto t1 = device.create_event();
            link.inner().barrier(stream);
            stream.synchronize();
            link.reset_counters();
            t0->record(stream);
            link.all_reduce_sum(sum.data(), kCount, DType::kI32, stream);
            link.all_gather(gathered.data() + r * kCount, kCount, gathered.data(), DType::kI32, stream);
            link.broadcast(bcast.data(), kCount, DType::kI32, 2, stream);
            link.barrier(stream);
            t1->record(stream);
            stream.synchronize();
            const double measured_us = 1000.0 * t1->elapsed_ms_since(*t0);
            EXPECT_GE(measured_us, model_us) << "run " << attempt;
        }
        EXPECT_EQ(link.counters().ops, 4);
        EXPECT_EQ(link.counters(LinkOp::kBarrier).ops, 1);
        std::int64_t bad = 0;
        for (std::int64_t i = 0; i < kCount; ++i) {
            bad += sum[static_cast<std::size_t>(i)] != static_cast<std::int32_t>((0 + 1 + 2 + 3) * 1000 + 4 * i);
            bad += bcast[static_cast<std::size_t>(i)] != static_cast<std::int32_t>(i * 3);
            for (int s = 0; s < n; ++s)
                bad += gathered[static_cast<std::size_t>(s * kCount + i)] != static_cast<std::int32_t>(s * 1000 + i);
        }
        EXPECT_EQ(bad, 0) << "rank " << r;
    });
    for (std::size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

// A mismatched call still fails on every rank through the link, and the link does not hang.
TEST(EmulatedLinkTwoRanks, WrappedErrorsPropagate) {
    auto errors =
        run_linked_ranks(2, parse_link_model("pcie4"), [](int r, EmulatedLink& link, Device&, Stream& stream) {
            std::vector<float> buf(4, 1.0f);
            link.all_reduce_sum(buf.data(), r == 0 ? 4 : 3, DType::kF32, stream);
        });
    for (const std::string& e : errors) EXPECT_NE(e.find("mismatched collectives"), std::string::npos) << e;
}

}  // namespace
}  // namespace scmoe
