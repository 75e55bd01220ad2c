// MpiCommunicator under mpirun: the same hand-checkable collectives as the LocalComm tests, with
// values that name their source, destination and position. Prints "N passed, M failed" on rank 0
// and exits non-zero when any check failed on any rank.
//
//   mpirun -np 4 --oversubscribe scmoe_mpi_comm_test              # the checks
//   mpirun -np 2 --oversubscribe scmoe_mpi_comm_test rank-exits   # rank 1 leaves mid-run; rank 0
//                                                                 # must report a timeout and exit 1
#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "scmoe/comm/mpi_communicator.h"
#include "scmoe/kernels/device.h"
#include "scmoe/kernels/error.h"

namespace {

using scmoe::Communicator;
using scmoe::DType;
using scmoe::Stream;

// Mismatches found by the running check; reported per check.
int g_mismatches = 0;

template <class T, class U>
void expect_eq(const T& got, const U& want, const std::string& what) {
    if (got == want) return;
    if (++g_mismatches <= 10)
        std::fprintf(stderr, "  mismatch: %s: got %s, want %s\n", what.c_str(), std::to_string(got).c_str(),
                     std::to_string(want).c_str());
}

// Elements rank r sends to rank p: uneven, zeros included, the last rank sends nothing.
std::int64_t a2a_count(int r, int p, int n) { return r == n - 1 ? 0 : (r + 2 * p) % 4; }

void check_all_to_all_v_with(Communicator& comm, Stream& stream, bool known) {
    const int r = comm.rank(), n = comm.size();
    std::vector<std::int64_t> counts(static_cast<std::size_t>(n));
    std::vector<float> send;
    for (int p = 0; p < n; ++p) {
        counts[static_cast<std::size_t>(p)] = a2a_count(r, p, n);
        for (std::int64_t i = 0; i < a2a_count(r, p, n); ++i) send.push_back(static_cast<float>(r * 100 + p * 10 + i));
    }
    std::int64_t total = 0;
    for (int s = 0; s < n; ++s) total += a2a_count(s, r, n);
    std::vector<float> recv(static_cast<std::size_t>(total) + 1, -1.0f);
    std::vector<std::int64_t> recv_counts(static_cast<std::size_t>(n), -7);
    if (known) {  // all_to_all_v_known: this rank is told what it receives
        for (int s = 0; s < n; ++s) recv_counts[static_cast<std::size_t>(s)] = a2a_count(s, r, n);
        comm.all_to_all_v_known(send.data(), counts.data(), recv.data(), recv_counts.data(), DType::kF32, stream);
    } else {
        comm.all_to_all_v(send.data(), counts.data(), recv.data(), recv_counts.data(), DType::kF32, stream);
    }
    stream.synchronize();
    std::size_t k = 0;
    for (int s = 0; s < n; ++s) {
        const std::string from = "rank " + std::to_string(r) + " from " + std::to_string(s);
        expect_eq(recv_counts[static_cast<std::size_t>(s)], a2a_count(s, r, n), from + " count");
        for (std::int64_t i = 0; i < a2a_count(s, r, n); ++i, ++k)
            expect_eq(recv[k], static_cast<float>(s * 100 + r * 10 + i), from + " element " + std::to_string(i));
    }
    expect_eq(recv[k], -1.0f, "rank " + std::to_string(r) + " sentinel after the received elements");
}

void check_all_to_all_v(Communicator& comm, Stream& stream) { check_all_to_all_v_with(comm, stream, false); }
void check_all_to_all_v_known(Communicator& comm, Stream& stream) { check_all_to_all_v_with(comm, stream, true); }

// Rank 0 is told it receives one element more from rank 1 than rank 1 sends: rank 0 fails naming
// both counts (before anything is written); the others complete.
void check_known_mismatch(Communicator& comm, Stream& stream) {
    const int r = comm.rank(), n = comm.size();
    std::vector<std::int64_t> counts(static_cast<std::size_t>(n), 1), expected(static_cast<std::size_t>(n), 1);
    if (r == 0 && n > 1) expected[1] = 2;
    std::vector<float> send(static_cast<std::size_t>(n), 1.0f), recv(static_cast<std::size_t>(n) + 1, -1.0f);
    std::string error;
    try {
        comm.all_to_all_v_known(send.data(), counts.data(), recv.data(), expected.data(), DType::kF32, stream);
        stream.synchronize();
    } catch (const scmoe::Error& e) {
        error = e.what();
    }
    if (r == 0 && n > 1) {
        expect_eq(error.find("rank 1 sends 1 elements, this rank was told to receive 2") != std::string::npos, true,
                  "rank 0's error names the mismatch: " + error);
        expect_eq(recv[0], -1.0f, "rank 0 wrote nothing");
    } else {
        expect_eq(error.empty(), true, "rank " + std::to_string(r) + " completes: " + error);
    }
}

void check_all_reduce_sum(Communicator& comm, Stream& stream) {
    const int r = comm.rank(), n = comm.size();
    // Float addition order matters for these: the result must be the rank-order sum, bit for bit.
    auto contribution = [](int rank, int i) {
        const float values[] = {1e8f, 1.0f, -1e8f, 1.0f};
        return values[(rank + i) % 4] * static_cast<float>(i + 1);
    };
    constexpr int kCount = 5;
    std::vector<float> buf(kCount);
    for (int i = 0; i < kCount; ++i) buf[static_cast<std::size_t>(i)] = contribution(r, i);
    std::vector<std::int32_t> ints = {r + 1, -r, 1000 * r};
    comm.all_reduce_sum(buf.data(), kCount, DType::kF32, stream);
    comm.all_reduce_sum(ints.data(), 3, DType::kI32, stream);
    stream.synchronize();
    for (int i = 0; i < kCount; ++i) {
        float want = contribution(0, i);
        for (int s = 1; s < n; ++s) want += contribution(s, i);
        expect_eq(std::memcmp(&buf[static_cast<std::size_t>(i)], &want, sizeof(float)), 0,
                  "rank " + std::to_string(r) + " f32 sum element " + std::to_string(i) + " bitwise (got " +
                      std::to_string(buf[static_cast<std::size_t>(i)]) + ", want " + std::to_string(want) + ")");
    }
    expect_eq(ints[0], n * (n + 1) / 2, "i32 sum 0");
    expect_eq(ints[1], -n * (n - 1) / 2, "i32 sum 1");
    expect_eq(ints[2], 1000 * n * (n - 1) / 2, "i32 sum 2");
}

void check_all_gather(Communicator& comm, Stream& stream) {
    const int r = comm.rank(), n = comm.size();
    constexpr std::int64_t kPer = 3;
    std::vector<float> send(kPer), recv(static_cast<std::size_t>(n * kPer), -1.0f);
    for (std::int64_t i = 0; i < kPer; ++i) send[static_cast<std::size_t>(i)] = static_cast<float>(r * 10 + i);
    comm.all_gather(send.data(), kPer, recv.data(), DType::kF32, stream);
    stream.synchronize();
    for (int s = 0; s < n; ++s)
        for (std::int64_t i = 0; i < kPer; ++i)
            expect_eq(recv[static_cast<std::size_t>(s * kPer + i)], static_cast<float>(s * 10 + i),
                      "rank " + std::to_string(r) + " block " + std::to_string(s) + " element " + std::to_string(i));
}

void check_broadcast(Communicator& comm, Stream& stream) {
    const int r = comm.rank(), n = comm.size();
    for (int root = 0; root < n; ++root) {
        std::vector<float> buf(4, 0.0f);
        if (r == root) buf = {7.0f, -1.5f, 3.25f, static_cast<float>(root)};
        comm.broadcast(buf.data(), 4, DType::kF32, root, stream);
        stream.synchronize();
        const std::vector<float> want = {7.0f, -1.5f, 3.25f, static_cast<float>(root)};
        for (std::size_t i = 0; i < 4; ++i)
            expect_eq(buf[i], want[i],
                      "rank " + std::to_string(r) + " root " + std::to_string(root) + " element " + std::to_string(i));
    }
}

void check_barrier(Communicator& comm, Stream& stream) {
    comm.barrier(stream);
    comm.barrier(stream);
    stream.synchronize();
}

int run_checks(Communicator& comm, Stream& stream) {
    const std::vector<std::pair<const char*, std::function<void(Communicator&, Stream&)>>> checks = {
        {"all_to_all_v", check_all_to_all_v}, {"all_reduce_sum", check_all_reduce_sum},
        {"all_gather", check_all_gather},     {"broadcast", check_broadcast},
        {"barrier", check_barrier},           {"all_to_all_v again", check_all_to_all_v},
        {"all_to_all_v_known", check_all_to_all_v_known}, {"all_to_all_v_known mismatch", check_known_mismatch}};
    int passed = 0, failed = 0;
    for (const auto& [name, check] : checks) {
        g_mismatches = 0;
        try {
            check(comm, stream);
        } catch (const std::exception& e) {
            std::fprintf(stderr, "rank %d: %s threw: %s\n", comm.rank(), name, e.what());
            ++g_mismatches;
        }
        // A check passes only when it passed on every rank.
        int local = g_mismatches > 0 ? 1 : 0, any = 0;
        MPI_Allreduce(&local, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        if (comm.rank() == 0) std::printf("%-20s %s\n", name, any ? "FAILED" : "ok");
        (any ? failed : passed) += 1;
    }
    if (comm.rank() == 0)
        std::printf("%d passed, %d failed (%d ranks, %s)\n", passed, failed, comm.size(), comm.name().c_str());
    return failed;
}

// Rank 1 completes one all_to_all_v, then leaves without finalising MPI; rank 0 starts the next
// one and must fail with the timeout naming rank 1.
int run_rank_exits(Communicator& comm, Stream& stream) {
    check_all_to_all_v(comm, stream);
    if (comm.rank() == 1) {
        std::fflush(nullptr);
        std::_Exit(0);
    }
    const auto start = std::chrono::steady_clock::now();
    try {
        check_all_to_all_v(comm, stream);
    } catch (const scmoe::Error& e) {
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        std::printf("rank %d caught after %.1f s: %s\n", comm.rank(), s, e.what());
        std::fflush(nullptr);
        return 1;
    }
    std::printf("rank %d: all_to_all_v with a departed peer did not fail\n", comm.rank());
    return 2;
}

// On sub-communicators ({0, 2} and {1, 3} of 4 ranks, as an expert-parallel split makes them):
// world rank 3 completes one all_to_all_v, then leaves. World rank 1 (rank 0 of its group) must
// fail naming MPI_COMM_WORLD's ranks, itself 1 and the peer 3, not the group's 0 and 1; its next
// call must refuse as a CommError naming that first failure.
int run_subgroup_rank_exits(Stream& stream) {
    int world_rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Comm half = MPI_COMM_NULL;
    MPI_Comm_split(MPI_COMM_WORLD, world_rank % 2, world_rank, &half);
    scmoe::MpiCommunicator comm(half);
    MPI_Comm_free(&half);
    check_all_to_all_v(comm, stream);
    if (world_rank != 1) {
        if (world_rank == 3) {
            std::fflush(nullptr);
            std::_Exit(0);
        }
        check_all_to_all_v(comm, stream);  // the other group carries on
        return 0;
    }
    const auto start = std::chrono::steady_clock::now();
    try {
        check_all_to_all_v(comm, stream);
    } catch (const scmoe::CommError& e) {
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        std::printf("rank %d caught after %.1f s: %s\n", world_rank, s, e.what());
        try {
            check_all_to_all_v(comm, stream);
        } catch (const scmoe::CommError& again) {
            std::printf("then: CommError: %s\n", again.what());
        }
        std::fflush(nullptr);
        return 1;
    }
    std::printf("rank %d: all_to_all_v with a departed peer did not fail with a CommError\n", world_rank);
    return 2;
}

// Rank 0 sums 2 floats, the others 4: the calls differ (as when the ranks' configurations do). Every
// rank must fail naming it, never sum what a shorter message left in its buffer: rank 0 receives
// more than it expects (MPI's truncation), the others less than they expect (which MPI completes
// without an error). 0 when every rank failed so, printed by rank 0.
int run_reduce_mismatch(Communicator& comm, Stream& stream) {
    const int r = comm.rank();
    std::vector<float> buf(4, 1.0f);
    std::string error;
    try {
        comm.all_reduce_sum(buf.data(), r == 0 ? 2 : 4, DType::kF32, stream);
        stream.synchronize();
    } catch (const scmoe::Error& e) {
        error = e.what();
    }
    const bool named = r == 0 ? error.find("the peer sent more than this rank expected") != std::string::npos
                              : error.find("rank 0 sent 8 bytes, this rank expected 16") != std::string::npos;
    if (!named) std::printf("rank %d: %s\n", r, error.empty() ? "the mismatched all_reduce_sum completed" : error.c_str());
    int local = named ? 0 : 1, any = 0;
    MPI_Allreduce(&local, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (r == 0 && any == 0) std::printf("mismatched all_reduce_sum: every rank failed naming it\n");
    std::fflush(nullptr);
    return any;
}

}  // namespace

int main(int argc, char** argv) {
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    const std::string mode = argc > 1 ? argv[1] : "checks";
    int rc = 0;
    try {
        auto device = scmoe::make_device("cpu");
        auto stream = device->create_stream();
        scmoe::MpiCommunicator comm(MPI_COMM_WORLD);
        if (mode == "subgroup-rank-exits") {
            rc = run_subgroup_rank_exits(*stream);
            std::_Exit(rc);  // a peer is gone: MPI_Finalize could wait for it forever
        }
        if (mode == "rank-exits") {
            rc = run_rank_exits(comm, *stream);
            // The peer is gone: MPI_Finalize could wait for it forever, so leave now.
            std::_Exit(rc);
        }
        if (mode == "reduce-mismatch") {
            rc = run_reduce_mismatch(comm, *stream);
            std::_Exit(rc);  // the communicator failed: leave as the other fault modes do
        }
        rc = run_checks(comm, *stream) > 0 ? 1 : 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    MPI_Finalize();
    return rc;
}
