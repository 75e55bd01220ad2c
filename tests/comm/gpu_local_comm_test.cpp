// LocalCommunicator on CUDA streams: 4 ranks as threads on one GPU, each with its own stream and
// device buffers; every collective checked element by element against values crafted so each
// names its source, destination and position (reductions: rank-order sums where the order shows).
// Skips with a message where no CUDA device answers.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "scmoe/comm/local_communicator.h"
#include "gpu/gpu_test_util.h"
#include "scmoe/kernels/device.h"
#include "scmoe/kernels/error.h"
#include "scmoe/kernels/math.h"

namespace scmoe {
namespace {

constexpr int kRanks = 4;

using RankFn = std::function<void(Communicator& comm, Device& device, Stream& stream)>;

// Runs fn on every rank in its own thread with its own CUDA device object and stream; returns each
// rank's error ("" when it succeeded). Ranks in `absent` issue nothing. fn synchronizes before its
// device buffers go out of scope (the to_host helper does).
std::vector<std::string> run_gpu_ranks(const std::shared_ptr<LocalGroup>& group, const RankFn& fn,
                                       std::vector<int> absent = {}) {
    const int n = group->size();
    std::vector<std::string> errors(static_cast<std::size_t>(n));
    std::vector<std::unique_ptr<Communicator>> comms;
    for (int r = 0; r < n; ++r) comms.push_back(group->communicator(r));
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
        if (std::find(absent.begin(), absent.end(), r) != absent.end()) continue;
        threads.emplace_back([&, r] {
            auto& err = errors[static_cast<std::size_t>(r)];
            try {
                auto device = make_device("cuda");
                auto stream = device->create_stream();
                fn(*comms[static_cast<std::size_t>(r)], *device, *stream);
                stream->synchronize();
            } catch (const std::exception& e) {
                err = e.what();
                if (err.empty()) err = "(empty error)";
            }
        });
    }
    for (auto& t : threads) t.join();
    return errors;  // the communicators go after every rank's stream is gone: their events outlive the work
}

void expect_no_errors(const std::vector<std::string>& errors) {
    for (std::size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

template <class T>
DeviceBuffer to_device(Device& device, Stream& stream, const std::vector<T>& host) {
    DeviceBuffer buf(device, std::max<std::size_t>(host.size() * sizeof(T), 1));
    if (!host.empty()) stream.copy(buf.data(), host.data(), host.size() * sizeof(T));
    stream.synchronize();
    return buf;
}

// Synchronizes the stream (the collectives before it included) and copies n elements back.
template <class T>
std::vector<T> to_host(Stream& stream, const void* dev, std::size_t n) {
    std::vector<T> out(n);
    if (n > 0) stream.copy(out.data(), dev, n * sizeof(T));
    stream.synchronize();
    return out;
}

// count(r, p): elements rank r sends to rank p; zeros included, the last rank sends nothing.
const std::vector<std::vector<std::int64_t>> kCounts = {{2, 0, 3, 1}, {1, 4, 0, 2}, {0, 1, 2, 5}, {0, 0, 0, 0}};

float a2a_value(int src, int dst, std::int64_t i) { return static_cast<float>(src * 100 + dst * 10 + i); }

// Three rounds, one per place the counts live: pageable host vectors, device memory, and pinned
// host memory that a host task on the stream fills only after a delay (the counts are "produced by
// earlier work on the stream", as MoeLayer does).
TEST(GpuLocalCommFourRanks, AllToAllVUnevenAndZeroCounts) {
    SCMOE_REQUIRE_GPU();
    auto group = LocalGroup::create(kRanks, 60.0);
    auto errors = run_gpu_ranks(group, [&](Communicator& comm, Device& device, Stream& stream) {
        const int r = comm.rank();
        const std::vector<std::int64_t>& mine = kCounts[static_cast<std::size_t>(r)];
        std::vector<float> send;
        for (int p = 0; p < kRanks; ++p)
            for (std::int64_t i = 0; i < mine[static_cast<std::size_t>(p)]; ++i) send.push_back(a2a_value(r, p, i));
        std::int64_t total = 0;
        for (int s = 0; s < kRanks; ++s) total += kCounts[static_cast<std::size_t>(s)][static_cast<std::size_t>(r)];
        DeviceBuffer dsend = to_device(device, stream, send);
        DeviceBuffer dcounts = to_device(device, stream, mine);
        DeviceBuffer drecv_counts(device, kRanks * sizeof(std::int64_t));
        auto* pinned = static_cast<std::int64_t*>(device.allocate_host(2 * kRanks * sizeof(std::int64_t)));
        for (int round = 0; round < 3; ++round) {
            DeviceBuffer drecv =
                to_device(device, stream, std::vector<float>(static_cast<std::size_t>(total) + 1, -1.0f));
            std::vector<std::int64_t> recv_counts(kRanks, -7);
            if (round == 0) {
                comm.all_to_all_v(dsend.data(), mine.data(), drecv.data(), recv_counts.data(), DType::kF32, stream);
            } else if (round == 1) {
                comm.all_to_all_v(dsend.data(), dcounts.as<std::int64_t>(), drecv.data(),
                                  drecv_counts.as<std::int64_t>(), DType::kF32, stream);
                recv_counts = to_host<std::int64_t>(stream, drecv_counts.data(), kRanks);
            } else {
                std::fill(pinned, pinned + 2 * kRanks, -9);
                stream.host_task([&, pinned] {
                    std::this_thread::sleep_for(std::chrono::milliseconds(50));
                    std::copy(mine.begin(), mine.end(), pinned);
                });
                comm.all_to_all_v(dsend.data(), pinned, drecv.data(), pinned + kRanks, DType::kF32, stream);
                std::copy(pinned + kRanks, pinned + 2 * kRanks, recv_counts.begin());
            }
            const auto got = to_host<float>(stream, drecv.data(), static_cast<std::size_t>(total) + 1);
            std::size_t k = 0;
            for (int s = 0; s < kRanks; ++s) {
                const std::int64_t c = kCounts[static_cast<std::size_t>(s)][static_cast<std::size_t>(r)];
                EXPECT_EQ(recv_counts[static_cast<std::size_t>(s)], c) << "rank " << r << " round " << round;
                for (std::int64_t i = 0; i < c; ++i, ++k)
                    EXPECT_EQ(got[k], a2a_value(s, r, i)) << "rank " << r << " round " << round << " from " << s;
            }
            EXPECT_EQ(got[k], -1.0f) << "rank " << r << " round " << round << ": wrote past what it receives";
        }
        device.deallocate_host(pinned);
    });
    expect_no_errors(errors);
}

// f32: contributions where the addition order shows (1e8 + 1 loses the 1); bf16: 1 + 2^-8 + 2^-8
// is 1 + 2^-7 in fp32 rounded once, but 1 when every add rounds to bf16; i32: wraps. Three rounds
// (events re-recorded), then a large count (the scratch grows, every block of the grid busy).
TEST(GpuLocalCommFourRanks, AllReduceSumIsRankOrdered) {
    SCMOE_REQUIRE_GPU();
    auto group = LocalGroup::create(kRanks, 60.0);
    auto f32_value = [](int r, std::int64_t i) {
        const float big[] = {1e8f, 1.0f, -1e8f, 1.0f};
        return big[(r + i) % 4] * static_cast<float>(i % 7 + 1);
    };
    auto bf16_value = [](int r, std::int64_t i) {
        const float tiny = 1.0f / 256.0f;
        const float v[] = {1.0f, tiny, tiny, 0.0f};
        return i == 0 ? v[r] : math::round_to_bf16(static_cast<float>((r + 1) * (i % 13)) * 0.37f);
    };
    auto i32_value = [](int r, std::int64_t i) {
        return i == 0 ? (r == 0 ? std::numeric_limits<std::int32_t>::max() : 1)
                      : static_cast<std::int32_t>(r * 1000 - i);
    };
    auto run_sizes = [&](std::int64_t count, int rounds) {
        std::vector<float> want_f32(static_cast<std::size_t>(count)), want_bf16(want_f32.size());
        std::vector<std::int32_t> want_i32(want_f32.size());
        for (std::int64_t i = 0; i < count; ++i) {
            float acc = f32_value(0, i), acc_bf16 = 0.0f;
            std::uint32_t acc_i32 = 0;
            for (int r = 1; r < kRanks; ++r) acc += f32_value(r, i);
            for (int r = 0; r < kRanks; ++r) acc_bf16 += bf16_value(r, i);
            for (int r = 0; r < kRanks; ++r) acc_i32 += static_cast<std::uint32_t>(i32_value(r, i));
            want_f32[static_cast<std::size_t>(i)] = acc;
            want_bf16[static_cast<std::size_t>(i)] = math::round_to_bf16(acc_bf16);
            want_i32[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(acc_i32);
        }
        EXPECT_EQ(want_bf16[0], 1.0f + 1.0f / 128.0f);
        EXPECT_EQ(want_i32[0], std::numeric_limits<std::int32_t>::min() + 2);
        return run_gpu_ranks(group, [&](Communicator& comm, Device& device, Stream& stream) {
            const int r = comm.rank();
            std::vector<float> f(static_cast<std::size_t>(count));
            std::vector<std::uint16_t> b(f.size());
            std::vector<std::int32_t> n(f.size());
            for (std::int64_t i = 0; i < count; ++i) {
                f[static_cast<std::size_t>(i)] = f32_value(r, i);
                b[static_cast<std::size_t>(i)] = math::f32_to_bf16_bits(bf16_value(r, i));
                n[static_cast<std::size_t>(i)] = i32_value(r, i);
            }
            for (int round = 0; round < rounds; ++round) {
                DeviceBuffer df = to_device(device, stream, f), db = to_device(device, stream, b),
                             dn = to_device(device, stream, n);
                comm.all_reduce_sum(df.data(), count, DType::kF32, stream);
                comm.all_reduce_sum(db.data(), count, DType::kBF16, stream);
                comm.all_reduce_sum(dn.data(), count, DType::kI32, stream);
                const auto gf = to_host<float>(stream, df.data(), f.size());
                const auto gb = to_host<std::uint16_t>(stream, db.data(), b.size());
                const auto gn = to_host<std::int32_t>(stream, dn.data(), n.size());
                for (std::size_t i = 0; i < f.size(); ++i) {
                    ASSERT_EQ(std::memcmp(&gf[i], &want_f32[i], 4), 0)
                        << "rank " << r << " f32 element " << i << ": " << gf[i] << " vs " << want_f32[i];
                    ASSERT_EQ(math::bf16_bits_to_f32(gb[i]), want_bf16[i]) << "rank " << r << " bf16 element " << i;
                    ASSERT_EQ(gn[i], want_i32[i]) << "rank " << r << " i32 element " << i;
                }
            }
        });
    };
    expect_no_errors(run_sizes(5, 3));
    group = LocalGroup::create(kRanks, 60.0);
    expect_no_errors(run_sizes(3 * 65536 + 17, 1));
}

TEST(GpuLocalCommFourRanks, AllGatherBroadcastAndBarrier) {
    SCMOE_REQUIRE_GPU();
    auto group = LocalGroup::create(kRanks, 60.0);
    constexpr std::int64_t kPer = 3;
    std::atomic<int> arrived{0};
    std::vector<int> seen(kRanks, -1);
    auto errors = run_gpu_ranks(group, [&](Communicator& comm, Device& device, Stream& stream) {
        const int r = comm.rank();
        EXPECT_EQ(comm.name(), "local(rank " + std::to_string(r) + " of 4)");
        std::vector<float> send(kPer);
        for (std::int64_t i = 0; i < kPer; ++i) send[static_cast<std::size_t>(i)] = static_cast<float>(r * 10 + i);
        DeviceBuffer dsend = to_device(device, stream, send);
        DeviceBuffer drecv = to_device(device, stream, std::vector<float>(kRanks * kPer + 1, -1.0f));
        comm.all_gather(dsend.data(), kPer, drecv.data(), DType::kF32, stream);
        // In place: this rank's block already sits in the output.
        std::vector<float> in_place(kRanks * kPer, -1.0f);
        std::copy(send.begin(), send.end(), in_place.begin() + r * kPer);
        DeviceBuffer dplace = to_device(device, stream, in_place);
        comm.all_gather(dplace.as<float>() + r * kPer, kPer, dplace.data(), DType::kF32, stream);
        // Broadcast from the last rank, then from rank 1 (i32) into buffers that start as zeros.
        const std::vector<float> payload = {7.0f, -1.5f, 3.25f, 42.0f};
        DeviceBuffer dbcast = to_device(device, stream, r == kRanks - 1 ? payload : std::vector<float>(4, 0.0f));
        comm.broadcast(dbcast.data(), 4, DType::kF32, kRanks - 1, stream);
        DeviceBuffer dints = to_device(device, stream, std::vector<std::int32_t>{r == 1 ? 123 : 0, r == 1 ? -5 : 0});
        comm.broadcast(dints.data(), 2, DType::kI32, 1, stream);
        // Barrier: rank 0's stream reaches it 100 ms late; nobody's later work may start before.
        stream.host_task([&, r] {
            if (r == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
            ++arrived;
        });
        comm.barrier(stream);
        stream.host_task([&, r] { seen[static_cast<std::size_t>(r)] = arrived.load(); });
        const auto got = to_host<float>(stream, drecv.data(), kRanks * kPer + 1);
        const auto got_in_place = to_host<float>(stream, dplace.data(), kRanks * kPer);
        for (int s = 0; s < kRanks; ++s)
            for (std::int64_t i = 0; i < kPer; ++i) {
                EXPECT_EQ(got[static_cast<std::size_t>(s * kPer + i)], static_cast<float>(s * 10 + i)) << "rank " << r;
                EXPECT_EQ(got_in_place[static_cast<std::size_t>(s * kPer + i)], static_cast<float>(s * 10 + i))
                    << "rank " << r << " (in place)";
            }
        EXPECT_EQ(got[kRanks * kPer], -1.0f) << "rank " << r << ": wrote past the gathered blocks";
        EXPECT_EQ(to_host<float>(stream, dbcast.data(), 4), payload) << "rank " << r;
        EXPECT_EQ(to_host<std::int32_t>(stream, dints.data(), 2), (std::vector<std::int32_t>{123, -5})) << "rank " << r;
    });
    expect_no_errors(errors);
    for (int r = 0; r < kRanks; ++r) EXPECT_EQ(seen[static_cast<std::size_t>(r)], kRanks) << "rank " << r;
}

// Fails at once, not by timing out: the timeout is far beyond CTest's (which ends a hang), and the
// errors must be the mismatch.
TEST(GpuLocalCommFourRanks, MismatchFailsEveryRankAtTheCall) {
    SCMOE_REQUIRE_GPU();
    auto group = LocalGroup::create(kRanks, 3600.0);
    auto errors = run_gpu_ranks(group, [&](Communicator& comm, Device& device, Stream& stream) {
        DeviceBuffer buf = to_device(device, stream, std::vector<float>(4, 1.0f));
        if (comm.rank() == 2) {
            comm.barrier(stream);
        } else {
            comm.all_reduce_sum(buf.data(), 4, DType::kF32, stream);
        }
        stream.synchronize();
    });
    for (int r = 0; r < kRanks; ++r) {
        const std::string& e = errors[static_cast<std::size_t>(r)];
        EXPECT_NE(e.find("rank " + std::to_string(r) + ": "), std::string::npos) << e;
        EXPECT_EQ(e.find("timed out"), std::string::npos) << e;
        EXPECT_NE(e.find("mismatched collectives"), std::string::npos) << e;
        EXPECT_NE(e.find("issued barrier(cuda:0)"), std::string::npos) << e;
        EXPECT_NE(e.find("issued all_reduce_sum(count=4, f32, cuda:0)"), std::string::npos) << e;
    }
}

TEST(GpuLocalCommFourRanks, RankThatNeverJoinsTimesOutNamingIt) {
    SCMOE_REQUIRE_GPU();
    auto group = LocalGroup::create(kRanks, 0.5);
    const auto start = std::chrono::steady_clock::now();
    auto errors = run_gpu_ranks(group,
                                [&](Communicator& comm, Device& device, Stream& stream) {
                                    DeviceBuffer send = to_device(device, stream, std::vector<float>(4, 1.0f));
                                    DeviceBuffer recv(device, 4 * sizeof(float));
                                    std::vector<std::int64_t> counts(kRanks, 1), recv_counts(kRanks);
                                    comm.all_to_all_v(send.data(), counts.data(), recv.data(), recv_counts.data(),
                                                      DType::kF32, stream);
                                    stream.synchronize();
                                },
                                /*absent=*/{3});
    // A timeout never fires early (a lower bound; how late it fires depends on the machine's load).
    EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(500));
    for (int r = 0; r < 3; ++r) {
        const std::string& e = errors[static_cast<std::size_t>(r)];
        EXPECT_NE(e.find("all_to_all_v timed out after 0.5 s waiting for rank 3"), std::string::npos) << e;
    }
    EXPECT_EQ(errors[3], "");
}

// A rank whose earlier work failed (a host task threw) fails the all_to_all_v on every rank at
// once, not after the timeout (set far beyond CTest's, which ends a hang).
TEST(GpuLocalCommFourRanks, EarlierStreamErrorFailsEveryRank) {
    SCMOE_REQUIRE_GPU();
    auto group = LocalGroup::create(kRanks, 3600.0);
    auto errors = run_gpu_ranks(group, [&](Communicator& comm, Device& device, Stream& stream) {
        DeviceBuffer buf(device, kRanks * sizeof(float));
        std::vector<std::int64_t> counts(kRanks, 1), recv_counts(kRanks);
        if (comm.rank() == 1) stream.host_task([] { SCMOE_FAIL("boom in a host task"); });
        comm.all_to_all_v(buf.data(), counts.data(), buf.data(), recv_counts.data(), DType::kF32, stream);
        stream.synchronize();
    });
    for (int r = 0; r < kRanks; ++r) {
        const std::string& e = errors[static_cast<std::size_t>(r)];
        EXPECT_NE(e.find("rank " + std::to_string(r) + ": all_to_all_v"), std::string::npos) << e;
        EXPECT_EQ(e.find("timed out"), std::string::npos) << e;
        EXPECT_NE(e.find("rank 1: "), std::string::npos) << e;
        EXPECT_NE(e.find("boom in a host task"), std::string::npos) << e;
    }
}

TEST(GpuLocalCommOneRank, CollectivesAreCopies) {
    SCMOE_REQUIRE_GPU();
    auto group = LocalGroup::create(1, 30.0);
    auto errors = run_gpu_ranks(group, [&](Communicator& comm, Device& device, Stream& stream) {
        const std::vector<float> values = {1, 2, 3};
        DeviceBuffer send = to_device(device, stream, values), recv(device, 3 * sizeof(float));
        std::int64_t count = 3, recv_count = 0;
        comm.all_to_all_v(send.data(), &count, recv.data(), &recv_count, DType::kF32, stream);
        EXPECT_EQ(recv_count, 3) << "filled in when all_to_all_v returns";
        comm.all_reduce_sum(send.data(), 3, DType::kF32, stream);
        comm.broadcast(send.data(), 3, DType::kF32, 0, stream);
        comm.barrier(stream);
        EXPECT_EQ(to_host<float>(stream, recv.data(), 3), values);
        EXPECT_EQ(to_host<float>(stream, send.data(), 3), values);
    });
    expect_no_errors(errors);
}

}  // namespace
}  // namespace scmoe
