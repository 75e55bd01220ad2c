// LocalCommunicator: ranks as threads, every collective checked element by element against values
// crafted so each one names its source, destination and position.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "scmoe/comm/local_communicator.h"
#include "scmoe/kernels/device.h"
#include "scmoe/kernels/error.h"

namespace scmoe {
namespace {

using RankFn = std::function<void(Communicator& comm, Stream& stream)>;

// Runs fn on every rank in its own thread with its own CPU stream; returns each rank's error
// message ("" when it succeeded). Ranks listed in `absent` never issue anything. fn synchronizes
// before its locals go out of scope: enqueued work reads them.
std::vector<std::string> run_ranks(const std::shared_ptr<LocalGroup>& group, const RankFn& fn,
                                   std::vector<int> absent = {}) {
    const int n = group->size();
    std::vector<std::string> errors(static_cast<std::size_t>(n));
    std::vector<std::unique_ptr<Communicator>> comms;
    for (int r = 0; r < n; ++r) comms.push_back(group->communicator(r));
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
        if (std::find(absent.begin(), absent.end(), r) != absent.end()) continue;
        threads.emplace_back([&, r] {
            auto device = make_device("cpu");
            auto stream = device->create_stream();
            auto& err = errors[static_cast<std::size_t>(r)];
            try {
                fn(*comms[static_cast<std::size_t>(r)], *stream);
                stream->synchronize();
            } catch (const Error& e) {
                err = e.what();
                if (err.empty()) err = "(empty error)";
            }
        });
    }
    for (auto& t : threads) t.join();
    return errors;
}

void expect_no_errors(const std::vector<std::string>& errors) {
    for (std::size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

// count(r, p): elements rank r sends to rank p. Zeros included; the last rank sends nothing.
std::vector<std::vector<std::int64_t>> a2a_counts(int n) {
    if (n == 2) return {{1, 3}, {0, 0}};
    return {{2, 0, 3, 1}, {1, 4, 0, 2}, {0, 1, 2, 5}, {0, 0, 0, 0}};
}

void check_all_to_all_v(int n, bool known = false) {
    const auto counts = a2a_counts(n);
    auto group = LocalGroup::create(n, 30.0);
    auto errors = run_ranks(group, [&](Communicator& comm, Stream& stream) {
        const int r = comm.rank();
        const auto& mine = counts[static_cast<std::size_t>(r)];
        std::vector<float> send;
        for (int p = 0; p < n; ++p)
            for (std::int64_t i = 0; i < mine[static_cast<std::size_t>(p)]; ++i)
                send.push_back(static_cast<float>(r * 100 + p * 10 + i));
        std::int64_t expected_total = 0;
        for (int s = 0; s < n; ++s) expected_total += counts[static_cast<std::size_t>(s)][static_cast<std::size_t>(r)];
        // Twice: the second round reuses the group after the first completed.
        for (int round = 0; round < 2; ++round) {
            std::vector<float> recv(static_cast<std::size_t>(expected_total) + 1, -1.0f);
            std::vector<std::int64_t> recv_counts(static_cast<std::size_t>(n), -7);
            if (known) {  // all_to_all_v_known: this rank is told what it receives
                for (int s = 0; s < n; ++s)
                    recv_counts[static_cast<std::size_t>(s)] = counts[static_cast<std::size_t>(s)][static_cast<std::size_t>(r)];
                comm.all_to_all_v_known(send.data(), mine.data(), recv.data(), recv_counts.data(), DType::kF32, stream);
            } else {
                comm.all_to_all_v(send.data(), mine.data(), recv.data(), recv_counts.data(), DType::kF32, stream);
            }
            stream.synchronize();
            std::size_t k = 0;
            for (int s = 0; s < n; ++s) {
                const std::int64_t c = counts[static_cast<std::size_t>(s)][static_cast<std::size_t>(r)];
                EXPECT_EQ(recv_counts[static_cast<std::size_t>(s)], c) << "rank " << r << " from " << s;
                for (std::int64_t i = 0; i < c; ++i, ++k)
                    EXPECT_EQ(recv[k], static_cast<float>(s * 100 + r * 10 + i))
                        << "rank " << r << " element " << i << " from " << s;
            }
            EXPECT_EQ(recv[k], -1.0f) << "rank " << r << " wrote past what it receives";
        }
    });
    expect_no_errors(errors);
}

TEST(LocalCommTwoRanks, AllToAllVHandChecked) { check_all_to_all_v(2); }
TEST(LocalCommFourRanks, AllToAllVHandChecked) { check_all_to_all_v(4); }
TEST(LocalCommFourRanks, AllToAllVKnownHandChecked) { check_all_to_all_v(4, true); }

// Rank 0 is told it receives one element more from rank 1 than rank 1 sends: it fails naming both
// counts before anything is written. Every buffer is the rank's own local: a rank leaves the failed
// collective only once its peers are done copying from it.
TEST(LocalCommFourRanks, AllToAllVKnownMismatchIsNamed) {
    auto group = LocalGroup::create(4, 30.0);
    std::vector<float> received_by_0(5, -1.0f);
    auto errors = run_ranks(group, [&](Communicator& comm, Stream& stream) {
        std::vector<std::int64_t> counts(4, 1), expected(4, 1);
        std::vector<float> send(4, 1.0f), received(5, -1.0f);
        if (comm.rank() == 0) expected[1] = 2;
        try {
            comm.all_to_all_v_known(send.data(), counts.data(), received.data(), expected.data(), DType::kF32, stream);
            stream.synchronize();
        } catch (...) {
            if (comm.rank() == 0) received_by_0 = received;
            throw;
        }
    });
    EXPECT_NE(errors[0].find("rank 1 sends 1 elements, this rank was told to receive 2"), std::string::npos)
        << errors[0];
    for (int r = 1; r < 4; ++r)
        EXPECT_NE(errors[static_cast<std::size_t>(r)].find("failed: rank 0: "), std::string::npos)
            << errors[static_cast<std::size_t>(r)];
    EXPECT_EQ(received_by_0[0], -1.0f) << "rank 0 wrote before the check";
}

// A rank whose part of a collective fails must not leave while its peers still copy from its
// buffers: rank 3 fails its all_to_all_v_known check and, as soon as its call returns, overwrites
// its send buffer with a poison value. The peers copy 1 Mi elements from every rank, rank 3's last;
// whatever they received from rank 3 is its data, never the poison.
TEST(LocalCommFourRanks, FailingRankLeavesOnlyAfterPeersCopiedFromIt) {
    constexpr std::int64_t kChunk = 1 << 20;
    constexpr float kPoison = -12345.0f;
    auto group = LocalGroup::create(4, 60.0);
    std::vector<std::int64_t> poisoned_seen(4, 0);
    auto errors = run_ranks(group, [&](Communicator& comm, Stream& stream) {
        const int r = comm.rank();
        std::vector<std::int64_t> counts(4, kChunk), expected(4, kChunk);
        if (r == 3) expected[1] = kChunk + 1;
        std::vector<float> send(static_cast<std::size_t>(4 * kChunk), static_cast<float>(r + 1));
        std::vector<float> recv(static_cast<std::size_t>(4 * kChunk), 0.0f);
        try {
            comm.all_to_all_v_known(send.data(), counts.data(), recv.data(), expected.data(), DType::kF32, stream);
            stream.synchronize();
        } catch (...) {
            if (r == 3)
                std::fill(send.begin(), send.end(), kPoison);
            else
                poisoned_seen[static_cast<std::size_t>(r)] = std::count(recv.begin() + 3 * kChunk, recv.end(), kPoison);
            throw;
        }
    });
    for (int r = 0; r < 4; ++r) EXPECT_NE(errors[static_cast<std::size_t>(r)], "") << "rank " << r;
    for (int r = 0; r < 3; ++r) EXPECT_EQ(poisoned_seen[static_cast<std::size_t>(r)], 0) << "rank " << r;
}

// A rank that will make no further calls abandons the group: its peers' collective fails at once,
// naming it and why, instead of waiting out the (here 300 s) timeout; a later call fails the same.
TEST(LocalCommFourRanks, AbandonedGroupFailsPendingAndLaterCollectives) {
    auto group = LocalGroup::create(4, 300.0);
    auto errors = run_ranks(group, [&](Communicator& comm, Stream& stream) {
        std::vector<float> buf(8, 1.0f);
        if (comm.rank() == 3) {
            std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the peers are already waiting
            group->abandon(3, "its host thread failed");
        }
        comm.all_reduce_sum(buf.data(), 8, DType::kF32, stream);
        stream.synchronize();
    });
    for (int r = 0; r < 4; ++r) {
        const std::string& e = errors[static_cast<std::size_t>(r)];
        EXPECT_NE(e.find("all_reduce_sum (collective #0) failed: rank 3 left the group: its host thread failed"),
                  std::string::npos)
            << "rank " << r << ": " << e;
        EXPECT_EQ(e.find("timed out"), std::string::npos) << e;
    }
    EXPECT_THROW(group->abandon(4, "no such rank"), Error);
}

void check_all_reduce(int n) {
    auto group = LocalGroup::create(n, 30.0);
    // Contributions where float addition order matters: 1e8 + 1 loses the 1.
    auto contribution = [](int r, int i) {
        const float big[] = {1e8f, 1.0f, -1e8f, 1.0f};
        return big[(r + i) % 4] * static_cast<float>(i + 1);
    };
    constexpr int kCount = 5;
    std::vector<float> expected(kCount);
    for (int i = 0; i < kCount; ++i) {
        float acc = contribution(0, i);
        for (int r = 1; r < n; ++r) acc += contribution(r, i);
        expected[static_cast<std::size_t>(i)] = acc;
    }
    auto errors = run_ranks(group, [&](Communicator& comm, Stream& stream) {
        const int r = comm.rank();
        for (int round = 0; round < 3; ++round) {
            std::vector<float> buf(kCount);
            for (int i = 0; i < kCount; ++i) buf[static_cast<std::size_t>(i)] = contribution(r, i);
            std::vector<std::int32_t> ints = {r + 1, -r, 1000 * r};
            comm.all_reduce_sum(buf.data(), kCount, DType::kF32, stream);
            comm.all_reduce_sum(ints.data(), 3, DType::kI32, stream);
            stream.synchronize();
            for (int i = 0; i < kCount; ++i)
                EXPECT_EQ(std::memcmp(&buf[static_cast<std::size_t>(i)], &expected[static_cast<std::size_t>(i)], 4), 0)
                    << "rank " << r << " element " << i << ": " << buf[static_cast<std::size_t>(i)] << " vs "
                    << expected[static_cast<std::size_t>(i)];
            EXPECT_EQ(ints[0], n * (n + 1) / 2);
            EXPECT_EQ(ints[1], -n * (n - 1) / 2);
            EXPECT_EQ(ints[2], 1000 * n * (n - 1) / 2);
        }
    });
    expect_no_errors(errors);
}

TEST(LocalCommTwoRanks, AllReduceSumIsRankOrdered) { check_all_reduce(2); }
TEST(LocalCommFourRanks, AllReduceSumIsRankOrdered) { check_all_reduce(4); }

void check_all_gather_and_broadcast(int n) {
    auto group = LocalGroup::create(n, 30.0);
    constexpr std::int64_t kPer = 3;
    auto errors = run_ranks(group, [&](Communicator& comm, Stream& stream) {
        const int r = comm.rank();
        EXPECT_EQ(comm.size(), n);
        EXPECT_EQ(comm.name(), "local(rank " + std::to_string(r) + " of " + std::to_string(n) + ")");
        std::vector<float> send(kPer), recv(static_cast<std::size_t>(n * kPer), -1.0f);
        for (std::int64_t i = 0; i < kPer; ++i) send[static_cast<std::size_t>(i)] = static_cast<float>(r * 10 + i);
        comm.all_gather(send.data(), kPer, recv.data(), DType::kF32, stream);
        // In place: this rank's block already sits in the output.
        std::vector<float> in_place(static_cast<std::size_t>(n * kPer), -1.0f);
        std::copy(send.begin(), send.end(), in_place.begin() + r * kPer);
        comm.all_gather(in_place.data() + r * kPer, kPer, in_place.data(), DType::kF32, stream);
        const int root = n - 1;
        std::vector<float> bcast = {0.0f, 0.0f, 0.0f, 0.0f};
        if (r == root) bcast = {7.0f, -1.5f, 3.25f, 42.0f};
        comm.broadcast(bcast.data(), 4, DType::kF32, root, stream);
        stream.synchronize();
        for (int s = 0; s < n; ++s)
            for (std::int64_t i = 0; i < kPer; ++i) {
                EXPECT_EQ(recv[static_cast<std::size_t>(s * kPer + i)], static_cast<float>(s * 10 + i)) << "rank " << r;
                EXPECT_EQ(in_place[static_cast<std::size_t>(s * kPer + i)], static_cast<float>(s * 10 + i))
                    << "rank " << r;
            }
        EXPECT_EQ(bcast, (std::vector<float>{7.0f, -1.5f, 3.25f, 42.0f})) << "rank " << r;
    });
    expect_no_errors(errors);
}

TEST(LocalCommTwoRanks, AllGatherAndBroadcast) { check_all_gather_and_broadcast(2); }
TEST(LocalCommFourRanks, AllGatherAndBroadcast) { check_all_gather_and_broadcast(4); }

TEST(LocalCommFourRanks, BarrierWaitsForEveryRank) {
    constexpr int kRanks = 4;
    auto group = LocalGroup::create(kRanks, 30.0);
    std::atomic<int> arrived{0};
    std::vector<int> seen(kRanks, -1);
    auto errors = run_ranks(group, [&](Communicator& comm, Stream& stream) {
        const int r = comm.rank();
        stream.host_task([&, r] {
            if (r == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
            ++arrived;
        });
        comm.barrier(stream);
        stream.host_task([&, r] { seen[static_cast<std::size_t>(r)] = arrived.load(); });
    });
    expect_no_errors(errors);
    for (int r = 0; r < kRanks; ++r) EXPECT_EQ(seen[static_cast<std::size_t>(r)], kRanks) << "rank " << r;
}

// A mismatch fails at once rather than by timing out: the timeout is set far beyond the test's own
// (CTest's TIMEOUT ends a hang), and the errors must be the mismatch, not a timeout.
TEST(LocalCommTwoRanks, MismatchedOperationsFailOnEveryRank) {
    auto group = LocalGroup::create(2, 3600.0);
    auto errors = run_ranks(group, [&](Communicator& comm, Stream& stream) {
        float x[4] = {1, 2, 3, 4};
        if (comm.rank() == 0) {
            comm.all_reduce_sum(x, 4, DType::kF32, stream);
        } else {
            comm.barrier(stream);
        }
        stream.synchronize();  // x must outlive the work that reads it
    });
    for (int r = 0; r < 2; ++r) {
        const auto& e = errors[static_cast<std::size_t>(r)];
        EXPECT_EQ(e.find("timed out"), std::string::npos) << e;
        EXPECT_NE(e.find("rank " + std::to_string(r) + ": "), std::string::npos) << e;
        EXPECT_NE(e.find("rank 0 issued all_reduce_sum(count=4, f32)"), std::string::npos) << e;
        EXPECT_NE(e.find("rank 1 issued barrier()"), std::string::npos) << e;
    }
}

TEST(LocalCommFourRanks, MismatchedCountsFailOnEveryRank) {
    auto group = LocalGroup::create(4, 3600.0);
    auto errors = run_ranks(group, [&](Communicator& comm, Stream& stream) {
        std::vector<float> x(8, 1.0f);
        comm.all_gather(x.data(), comm.rank() == 2 ? 1 : 2, x.data() + 4, DType::kF32, stream);
        stream.synchronize();
    });
    for (int r = 0; r < 4; ++r) {
        const auto& e = errors[static_cast<std::size_t>(r)];
        EXPECT_NE(e.find("mismatched collectives"), std::string::npos) << "rank " << r << ": " << e;
        EXPECT_NE(e.find("issued all_gather(count=1, f32)"), std::string::npos) << e;
    }
}

TEST(LocalCommFourRanks, NegativeCountFailsOnEveryRank) {
    auto group = LocalGroup::create(4, 30.0);
    auto errors = run_ranks(group, [&](Communicator& comm, Stream& stream) {
        std::vector<std::int64_t> counts(4, 0), recv_counts(4);
        if (comm.rank() == 1) counts[3] = -2;
        float dummy = 0;
        comm.all_to_all_v(&dummy, counts.data(), &dummy, recv_counts.data(), DType::kF32, stream);
        stream.synchronize();
    });
    for (int r = 0; r < 4; ++r)
        EXPECT_NE(errors[static_cast<std::size_t>(r)].find("rank 1 passed all_to_all_v send_counts[3] = -2"),
                  std::string::npos)
            << errors[static_cast<std::size_t>(r)];
}

TEST(LocalCommFourRanks, RankThatNeverJoinsTimesOut) {
    auto group = LocalGroup::create(4, 0.5);
    const auto start = std::chrono::steady_clock::now();
    auto errors = run_ranks(group,
                            [&](Communicator& comm, Stream& stream) {
                                std::vector<std::int64_t> counts(4, 1), recv_counts(4);
                                std::vector<float> send(4, 1.0f), recv(4);
                                comm.all_to_all_v(send.data(), counts.data(), recv.data(), recv_counts.data(),
                                                  DType::kF32, stream);
                                stream.synchronize();
                            },
                            /*absent=*/{3});
    // A timeout never fires early (a lower bound; how late it fires depends on the machine's load).
    EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(500));
    int timed_out_itself = 0;
    for (int r = 0; r < 3; ++r) {
        const auto& e = errors[static_cast<std::size_t>(r)];
        EXPECT_NE(e.find("all_to_all_v timed out after 0.5 s waiting for rank 3"), std::string::npos) << e;
        if (e.find("rank " + std::to_string(r) + ": all_to_all_v timed out") != std::string::npos) ++timed_out_itself;
    }
    EXPECT_GE(timed_out_itself, 1);
    EXPECT_EQ(errors[3], "");
}

TEST(LocalCommOneRank, CollectivesAreCopies) {
    auto group = LocalGroup::create(1, 30.0);
    auto errors = run_ranks(group, [&](Communicator& comm, Stream& stream) {
        std::vector<float> send = {1, 2, 3}, recv(3);
        std::int64_t count = 3, recv_count = 0;
        comm.all_to_all_v(send.data(), &count, recv.data(), &recv_count, DType::kF32, stream);
        comm.all_reduce_sum(send.data(), 3, DType::kF32, stream);
        comm.barrier(stream);
        stream.synchronize();
        EXPECT_EQ(recv, send);
        EXPECT_EQ(recv_count, 3);
    });
    expect_no_errors(errors);
}

TEST(LocalComm, CommunicatorOfARankIsCreatedOnce) {
    auto group = LocalGroup::create(2, 30.0);
    auto first = group->communicator(0);
    EXPECT_THROW(group->communicator(0), Error);
    EXPECT_THROW(group->communicator(2), Error);
    EXPECT_THROW(LocalGroup::create(0), Error);
}

}  // namespace
}  // namespace scmoe
