// Emulated NCCL: the topology's times by hand, counts exchanged for real, small buffers reduced for
// real, the host blocking only where NcclCommunicator blocks, mismatched calls named.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "scmoe/comm/emu_communicator.h"
#include "scmoe/comm/topology.h"
#include "emu/emu_test_util.h"
#include "scmoe/kernels/emu/emu_device.h"
#include "scmoe/kernels/error.h"

namespace scmoe {
namespace {

TEST(Topology, AllToAllOnNvlinkIsBoundByEachGpusLink) {
    const Topology& t = cluster_topology("a800-nvlink-8");
    const std::vector<int> ranks = {0, 1, 2, 3, 4, 5, 6, 7};
    const double b = 1e6;  // bytes per pair
    std::vector<double> bytes(64, b);
    const auto us = all_to_all_us(t, ranks, bytes);
    // 7 peers x 1 MB over 200 GB/s x 0.78 (1e3 bytes per us per GB/s), after 8.4 + 3.4 us.
    for (double u : us) EXPECT_NEAR(u, 8.4 + 3.4 + 7e6 / (200 * 0.78 * 1e3), 1e-9);
}

TEST(Topology, AllToAllOnPcieIsBoundByTheSharedSwitchUplink) {
    const Topology& t = cluster_topology("a30-pcie-8");
    const std::vector<int> ranks = {0, 1, 2, 3, 4, 5, 6, 7};
    std::vector<double> bytes(64, 1e6);
    const auto us = all_to_all_us(t, ranks, bytes);
    // Each switch's 4 GPUs send 4 MB each to the other switch: 16 MB over one 32 GB/s x 0.8 uplink,
    // more than a GPU's own 7 MB over its link.
    for (double u : us) EXPECT_NEAR(u, 8.4 + 5.7 + 16e6 / (32 * 0.8 * 1e3), 1e-9);
    // Traffic that stays behind its switch does not touch the uplink.
    std::vector<double> local(64, 0.0);
    for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j) local[static_cast<std::size_t>(i * 8 + j)] = 1e6;
    EXPECT_NEAR(all_to_all_us(t, ranks, local)[0], 8.4 + 5.7 + 3e6 / (32 * 0.8 * 1e3), 1e-9);
}

TEST(Topology, InterNodeTrafficSharesTheNodesNics) {
    const Topology& t = cluster_topology("a800-2x8");
    std::vector<int> ranks(16);
    for (int i = 0; i < 16; ++i) ranks[static_cast<std::size_t>(i)] = i;
    std::vector<double> bytes(256, 1e6);
    const auto us = all_to_all_us(t, ranks, bytes);
    // A node sends 8 GPUs x 8 peers x 1 MB = 64 MB over 12.5 GB/s x 0.9; its NVLink share is small.
    EXPECT_NEAR(us[0], 8.4 + 14.0 + 64e6 / (12.5 * 0.9 * 1e3), 1e-9);
    // Ring all-reduce: 2(n-1)/n of the bytes at the NIC's bus bandwidth, or the tree if faster.
    const double ring = 8.4 + (30 - 2) * 3.4 + 2 * 14.0 + 2.0 * 15 / 16 * 1e8 / (12.5 * 0.9 * 1e3);
    EXPECT_LE(all_reduce_us(t, ranks, 1e8), ring + 1e-9);
    EXPECT_GT(all_reduce_us(t, ranks, 1e8), 2.0 * 15 / 16 * 1e8 / (12.5 * 0.9 * 1e3));
    EXPECT_THROW(cluster_topology("dgx-1"), Error);
}

// A cluster of single links stands for EmulatedLink: latency + (n-1)/n of a rank's bytes / bandwidth,
// the same formula as the link's model (scmoe/comm/emulated_link.h), and no SM share.
TEST(Topology, ALinkClusterMatchesTheEmulatedLinksModel) {
    const Topology t = cluster_topology("link:gbyte_s=10,latency_us=50,gpus=4");
    EXPECT_EQ(t.comm_sms, 0);
    EXPECT_EQ(t.world_size(), 4);
    const std::vector<int> ranks = {0, 1, 2, 3};
    std::vector<double> bytes(16, 1e6);  // each rank sends 4 MB, 1 MB to each rank (itself included)
    EXPECT_NEAR(all_to_all_us(t, ranks, bytes)[2], 50 + 3e6 / (10 * 1e3), 1e-9);
    EXPECT_THROW(cluster_topology("link:gbyte_s=0"), Error);
    EXPECT_THROW(cluster_topology("link:gbyte_s=10,speed=3"), Error);
}

// The key's unit is in its name: 'gbps' (which read as Gb/s but meant GB/s) is refused, naming the
// new key, instead of being read in either unit.
TEST(Topology, TheOldLinkKeyIsRefusedNamingTheNewOne) {
    try {
        cluster_topology("link:gbps=10,gpus=4");
        FAIL() << "link:gbps= was accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("renamed 'gbyte_s'"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("link:gbyte_s=10"), std::string::npos) << e.what();
    }
}

// describe() is made from the cluster's fields, and a NIC's rate is printed in both units.
TEST(Topology, DescriptionsComeFromTheFieldsWithUnits) {
    const Topology t = cluster_topology("a800-2x8");
    const std::string d = describe(t);
    EXPECT_NE(d.find("2 nodes x 8 A800 SXM4"), std::string::npos) << d;
    EXPECT_NE(d.find("100 Gb/s (12.5 GB/s)"), std::string::npos) << d;
    EXPECT_NE(d.find("Ethernet"), std::string::npos) << d;
    ASSERT_FALSE(t.assumptions.empty());  // the paper gives no speed for its Ethernet
    EXPECT_EQ(t.assumptions.front().about, "nic");
    const std::string pcie = describe(cluster_topology("a30-pcie-8"));
    EXPECT_NE(pcie.find("PCIe"), std::string::npos) << pcie;
    EXPECT_EQ(pcie.find("NVLink"), std::string::npos) << pcie;
    EXPECT_NE(pcie.find("2 switches of 4 GPUs"), std::string::npos) << pcie;
    EXPECT_EQ(describe(cluster_topology("link:gbyte_s=1,gpus=2")).find("NVLink"), std::string::npos);
    EXPECT_EQ(describe_nic_rate(50), "400 Gb/s (50 GB/s)");
}

// Runs body(member, device, comm) on `n` emulated GPUs, one host thread each.
void on_emu_ranks(int n, const std::function<void(int, Device&, Communicator&)>& body,
                  const std::string& preset = "a800-nvlink-8") {
    std::vector<int> ranks(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) ranks[static_cast<std::size_t>(i)] = i;
    auto group = EmuGroup::create(cluster_topology(preset), ranks);
    std::vector<std::string> errors(static_cast<std::size_t>(n));
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r)
        threads.emplace_back([&, r] {
            try {
                emu::EmuOptions o;
                o.spec = test::round_spec();
                auto device = emu::make_device(o);
                auto comm = group->communicator(r);
                body(r, *device, *comm);
            } catch (const std::exception& e) {
                errors[static_cast<std::size_t>(r)] = e.what();
            }
        });
    for (auto& t : threads) t.join();
    for (int r = 0; r < n; ++r) EXPECT_EQ(errors[static_cast<std::size_t>(r)], "") << "rank " << r;
}

TEST(EmuCommunicator, CountsAreExchangedForRealAndTheHostWaitsOnlyForThem) {
    const int n = 4;
    on_emu_ranks(n, [&](int r, Device& device, Communicator& comm) {
        auto stream = device.create_stream();
        std::vector<std::int64_t> send(n), recv(n, -1);
        for (int p = 0; p < n; ++p) send[static_cast<std::size_t>(p)] = 1000 * (r + 1) + p;  // r -> p
        DeviceBuffer a(device, 1 << 24), b(device, 1 << 24);
        const double t0 = device.host_time_us();
        comm.all_to_all_v(a.data(), send.data(), b.data(), recv.data(), DType::kBF16, *stream);
        for (int p = 0; p < n; ++p) EXPECT_EQ(recv[static_cast<std::size_t>(p)], 1000 * (p + 1) + r);
        // The host came back once it had the counts; the data exchange (its latency alone is
        // 8.4 + 3.4 us) runs after that.
        const double returned = device.host_time_us() - t0;
        stream->synchronize();
        const double done = device.host_time_us() - t0;
        EXPECT_GT(done, returned + 8.4 + 3.4);
        // A small payload (routing metadata: expert counts) moves for real: rank r sends p the
        // value 10 r + p.
        std::vector<std::int64_t> one(n, 1), got(n);
        auto* out = a.as<std::int32_t>();
        for (int p = 0; p < n; ++p) out[p] = 10 * r + p;
        comm.all_to_all_v(a.data(), one.data(), b.data(), got.data(), DType::kI32, *stream);
        stream->synchronize();
        for (int p = 0; p < n; ++p) EXPECT_EQ(b.as<std::int32_t>()[p], 10 * p + r);
    });
}

// With known receive counts there is no count exchange and the host does not wait (NCCL's grouped
// sends and receives); small payloads still move for real.
TEST(EmuCommunicator, KnownCountsSkipTheCountExchangeAndTheHostWait) {
    const int n = 4;
    on_emu_ranks(n, [&](int r, Device& device, Communicator& comm) {
        auto stream = device.create_stream();
        DeviceBuffer a(device, 1 << 24), b(device, 1 << 24);
        std::vector<std::int64_t> one(n, 1);
        auto* out = a.as<std::int32_t>();
        for (int p = 0; p < n; ++p) out[p] = 10 * r + p;
        const double t0 = device.host_time_us();
        comm.all_to_all_v_known(a.data(), one.data(), b.data(), one.data(), DType::kI32, *stream);
        // Only launches: less than the exchange's latency (8.4 + 3.4 us), which a count exchange
        // and a wait for it would cost.
        EXPECT_LT(device.host_time_us() - t0, 8.4 + 3.4);
        stream->synchronize();
        EXPECT_GT(device.host_time_us() - t0, 8.4 + 3.4);
        for (int p = 0; p < n; ++p) EXPECT_EQ(b.as<std::int32_t>()[p], 10 * p + r);
    });
}

// A receive count that differs from what the peer sends fails at the next synchronize, naming both.
TEST(EmuCommunicator, KnownCountsThatDoNotMatchAreNamed) {
    on_emu_ranks(2, [&](int r, Device& device, Communicator& comm) {
        auto stream = device.create_stream();
        DeviceBuffer a(device, 64), b(device, 64);
        std::vector<std::int64_t> send(2, 1), expected(2, 1);
        if (r == 0) expected[1] = 3;
        comm.all_to_all_v_known(a.data(), send.data(), b.data(), expected.data(), DType::kI32, *stream);
        try {
            stream->synchronize();
            EXPECT_EQ(r, 1) << "rank 0 accepted a wrong receive count";
        } catch (const Error& e) {
            EXPECT_EQ(r, 0);
            EXPECT_NE(std::string(e.what()).find("rank 1 sends 1 elements, this rank was told to receive 3"),
                      std::string::npos)
                << e.what();
        }
    });
}

TEST(EmuCommunicator, SmallBuffersAreReducedGatheredAndBroadcastForReal) {
    const int n = 3;
    on_emu_ranks(n, [&](int r, Device& device, Communicator& comm) {
        auto stream = device.create_stream();
        DeviceBuffer buf(device, 1024), all(device, 1024);
        auto* v = buf.as<float>();
        v[0] = static_cast<float>(r + 1);
        v[1] = 0.5f;
        comm.all_reduce_sum(buf.data(), 2, DType::kF32, *stream);
        stream->synchronize();
        EXPECT_EQ(v[0], 6.0f);
        EXPECT_EQ(v[1], 1.5f);
        auto* i = buf.as<std::int32_t>();
        i[0] = 10 * r;
        comm.all_gather(buf.data(), 1, all.data(), DType::kI32, *stream);
        i[1] = r == 2 ? 77 : 0;
        comm.broadcast(buf.as<std::int32_t>() + 1, 1, DType::kI32, 2, *stream);
        comm.barrier(*stream);
        stream->synchronize();
        for (int p = 0; p < n; ++p) EXPECT_EQ(all.as<std::int32_t>()[p], 10 * p);
        EXPECT_EQ(i[1], 77);
    });
}

// A member that will make no further calls abandons the group: the collective its peers' streams
// wait in fails at once with a CommError naming it (not after the emulator's stall limit), moves
// no data, and later calls fail when issued.
TEST(EmuCommunicator, AbandonedGroupFailsPendingAndLaterCalls) {
    std::vector<int> ranks = {0, 1, 2};
    auto group = EmuGroup::create(cluster_topology("a800-nvlink-8"), ranks);
    std::vector<std::string> errors(3), later(3);
    std::vector<float> first(3, 0.0f);
    std::vector<std::thread> threads;
    for (int r = 0; r < 3; ++r)
        threads.emplace_back([&, r] {
            emu::EmuOptions o;
            o.spec = test::round_spec();
            auto device = emu::make_device(o);
            auto comm = group->communicator(r);
            auto stream = device->create_stream();
            DeviceBuffer buf(*device, 64);
            buf.as<float>()[0] = static_cast<float>(r + 1);
            if (r == 2) {
                std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the peers are already waiting
                group->abandon(2, "its host thread failed");
                return;
            }
            try {
                comm->all_reduce_sum(buf.data(), 1, DType::kF32, *stream);
                stream->synchronize();
            } catch (const CommError& e) {
                errors[static_cast<std::size_t>(r)] = e.what();
            }
            first[static_cast<std::size_t>(r)] = buf.as<float>()[0];
            try {
                comm->barrier(*stream);
            } catch (const CommError& e) {
                later[static_cast<std::size_t>(r)] = e.what();
            }
        });
    for (auto& t : threads) t.join();
    for (int r = 0; r < 2; ++r) {
        const auto i = static_cast<std::size_t>(r);
        // At its enqueue or, as almost always, in its stream's work: either way naming rank 2.
        EXPECT_NE(errors[i].find("all_reduce_sum"), std::string::npos) << errors[i];
        EXPECT_NE(errors[i].find("failed: rank 2 left the group: its host thread failed"), std::string::npos)
            << errors[i];
        EXPECT_EQ(first[i], static_cast<float>(r + 1)) << "the failed all-reduce wrote rank " << r << "'s buffer";
        EXPECT_NE(later[i].find("barrier (collective #"), std::string::npos) << later[i];
        EXPECT_NE(later[i].find("failed: rank 2 left the group"), std::string::npos) << later[i];
    }
    EXPECT_THROW(group->abandon(3, "no such member"), Error);
}

TEST(EmuCommunicator, MismatchedCallsAreNamed) {
    std::vector<int> ranks = {0, 1};
    auto group = EmuGroup::create(cluster_topology("a800-nvlink-8"), ranks);
    emu::EmuOptions o;
    o.spec = test::round_spec();
    auto device = emu::make_device(o);
    auto s0 = device->create_stream(), s1 = device->create_stream();
    DeviceBuffer buf(*device, 64);
    auto c0 = group->communicator(0), c1 = group->communicator(1);
    c0->all_reduce_sum(buf.data(), 4, DType::kF32, *s0);  // enqueues only: no peer needed yet
    try {
        c1->all_reduce_sum(buf.data(), 8, DType::kF32, *s1);
        FAIL() << "a mismatched all_reduce_sum was accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("mismatched collectives"), std::string::npos) << e.what();
    }
    // The refused call took no place in the order: the matching one completes the collective.
    c1->all_reduce_sum(buf.data(), 4, DType::kF32, *s1);
    s0->synchronize();
    s1->synchronize();
    EXPECT_THROW(EmuGroup::create(cluster_topology("a800-nvlink-8"), {0, 0}), Error);
    EXPECT_THROW(EmuGroup::create(cluster_topology("a800-nvlink-8"), {8}), Error);
}

}  // namespace
}  // namespace scmoe
