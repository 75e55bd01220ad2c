// scmoe-bench a2a: all_to_all_v bandwidth over a size sweep, nccl-tests alltoall style.
//
// Ranks: in-process LocalCommunicator ranks (--ranks N, one thread and one CPU stream each), or one
// MpiCommunicator rank per process under mpirun (detected from OMPI_COMM_WORLD_SIZE / PMI_SIZE > 1,
// or --mpi). --link wraps either in an EmulatedLink and adds the modelled time column.
//
// size = bytes each rank sends in one all_to_all_v (count elements of f32, count / ranks to each
// rank, itself included); algbw = size / time; busbw = algbw * (n-1)/n (nccl-tests' alltoall bus
// factor). time = the slowest rank's mean over the timed iterations.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <iomanip>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <vector>

#include "launch/emu_stack.h"
#include "benches.h"
#include "scmoe/comm/emu_communicator.h"
#include "scmoe/comm/emulated_link.h"
#include "scmoe/comm/local_communicator.h"
#include "scmoe/comm/mpi_communicator.h"
#include "common.h"
#include "scmoe/kernels/error.h"
#include "launch/cli_options.h"
#include "launch/emu_choice.h"
#include "scmoe/comm/topology.h"
#include "launch/local_rank.h"
#include "multi_rank.h"
#include "report.h"

namespace scmoe::bench {
namespace {

struct A2aArgs {
    std::vector<std::int64_t> sizes;  // bytes per rank per all_to_all_v
    int ranks = 2;                    // in-process ranks (ignored under MPI)
    bool mpi = false;
    std::optional<LinkModel> link;
    launch::ClusterFlags cluster_flags;  // emu: --cluster and its overrides (launch/cli_options.h)
    Topology topology;                   // emu: the resolved cluster
    std::vector<std::string> cluster_notes;
};

// Default -e: one default run (2 ranks, 5 + 2 iterations per size, 2 CPU cores) stays well under a
// minute, with the largest size past the caches.
constexpr const char* kDefaultMaxBytes = "128M";

cxxopts::Options a2a_options() {
    cxxopts::Options options("scmoe-bench a2a",
                             "all_to_all_v of f32 over a size sweep (nccl-tests alltoall columns). size = bytes each "
                             "rank sends, split evenly over the ranks; busbw = algbw * (n-1)/n.");
    options.set_width(110);
    add_common_options(options);
    // clang-format off
    options.add_options("a2a")
        ("b,minbytes", "Smallest size in bytes (K/M/G suffixes)", cxxopts::value<std::string>()->default_value("8"))
        ("e,maxbytes", "Largest size in bytes (K/M/G suffixes)",
         cxxopts::value<std::string>()->default_value(kDefaultMaxBytes))
        ("f,stepfactor", "Multiplication factor between sizes", cxxopts::value<std::int64_t>()->default_value("2"))
        ("ranks", "In-process ranks (LocalCommunicator, one thread and stream each); not under MPI",
         cxxopts::value<int>()->default_value("2"))
        ("mpi", "One MpiCommunicator rank per process (automatic under mpirun: OMPI_COMM_WORLD_SIZE or "
                "PMI_SIZE > 1)");
    // clang-format on
    launch::add_cluster_options(options, "a2a");
    add_link_options(options, "a2a");
    add_nccl_tests_guards(options);
    return options;
}

A2aArgs read_a2a_args(const cxxopts::ParseResult& r) {
    A2aArgs a;
    const std::int64_t begin = parse_size(r["minbytes"].as<std::string>(), "--minbytes");
    const std::int64_t end = parse_size(r["maxbytes"].as<std::string>(), "--maxbytes");
    a.sizes = size_sweep(begin, end, r["stepfactor"].as<std::int64_t>());
    a.ranks = r["ranks"].as<int>();
    if (a.ranks < 1) throw UsageError("--ranks must be >= 1");
    a.mpi = r.count("mpi") > 0 || launch::launched_by_mpirun();
    a.link = read_link_options(r);
    try {
        a.cluster_flags = launch::read_cluster_options(r);
    } catch (const Error& e) {
        throw UsageError(e.what());
    }
    return a;
}

// What rank `src` sends to rank `dst` at position i: an integer below 2^24, so exact in f32, that
// names all three (sources and destinations mixed in by large primes).
float a2a_value(int src, int dst, std::int64_t i) {
    return static_cast<float>((i + src * 7919LL + dst * 104729LL) & 0xFFFFFF);
}

// memcpy bandwidth of this machine in GB/s: 256 MiB, best of 3, pages touched first.
double memcpy_gbps() {
    const std::size_t bytes = std::size_t{256} << 20;
    std::vector<char> src(bytes, 1), dst(bytes, 0);
    double best_s = 1e30;
    for (int i = 0; i < 3; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        std::memcpy(dst.data(), src.data(), bytes);
        const auto t1 = std::chrono::steady_clock::now();
        best_s = std::min(best_s, std::chrono::duration<double>(t1 - t0).count());
    }
    if (dst[bytes / 2] != 1) throw Error("memcpy bandwidth probe: copy did not happen");
    return static_cast<double>(bytes) / best_s / 1e9;
}

// One rank's result for one size.
struct RankResult {
    double us = 0.0;
    std::int64_t wrong = 0;
};

// One rank: its communicator (plain or behind a link), stream and buffers sized for the largest case.
class A2aRank {
  public:
    // In-process: on the CPU backend, or on an emulated GPU (`device`, whose memory then holds the
    // buffers; nothing is computed there, so nothing is checked).
    A2aRank(std::unique_ptr<Communicator> comm, const std::optional<LinkModel>& link, std::int64_t max_count,
            std::unique_ptr<Device> device = nullptr)
        : device_(device ? std::move(device) : make_device("cpu")), stream_(device_->create_stream()) {
        if (link) {
            link_ = std::make_unique<EmulatedLink>(std::shared_ptr<Communicator>(std::move(comm)), *link);
        } else {
            plain_ = std::move(comm);
        }
        if (device_->backend() == Backend::kEmu) {
            emu_send_ = DeviceBuffer(*device_, static_cast<std::size_t>(max_count) * sizeof(float));
            emu_recv_ = DeviceBuffer(*device_, static_cast<std::size_t>(max_count) * sizeof(float));
            return;
        }
        send_.resize(static_cast<std::size_t>(max_count));
        recv_.resize(static_cast<std::size_t>(max_count));
    }
    // The MPI case: the caller owns the communicator.
    A2aRank(Communicator& comm, const std::optional<LinkModel>& link, std::int64_t max_count)
        : device_(make_device("cpu")), stream_(device_->create_stream()), borrowed_(&comm) {
        if (link) link_ = std::make_unique<EmulatedLink>(comm, *link);
        send_.resize(static_cast<std::size_t>(max_count));
        recv_.resize(static_cast<std::size_t>(max_count));
    }
    ~A2aRank() {
        try {
            stream_->synchronize();
        } catch (...) {  // NOTES: the error was reported by run(); a destructor cannot throw
        }
    }

    Communicator& comm() { return link_ ? *link_ : plain_ ? *plain_ : *borrowed_; }
    const EmulatedLink* link() const { return link_.get(); }

    // `count` elements in all, count / n to each rank: fill, time, then check.
    RankResult run(std::int64_t count, const CommonArgs& common) {
        Communicator& c = comm();
        const int me = c.rank(), n = c.size();
        const std::int64_t per_peer = count / n;
        std::vector<std::int64_t> send_counts(static_cast<std::size_t>(n), per_peer);
        std::vector<std::int64_t> recv_counts(static_cast<std::size_t>(n), -1);
        if (emu_send_.data()) {
            c.barrier(*stream_);
            RankResult result;
            result.us = time_us(*device_, *stream_, common.warmup, common.iters, [&] {
                c.all_to_all_v(emu_send_.data(), send_counts.data(), emu_recv_.data(), recv_counts.data(),
                               DType::kF32, *stream_);
            });
            return result;
        }
        for (int p = 0; p < n; ++p)
            for (std::int64_t i = 0; i < per_peer; ++i)
                send_[static_cast<std::size_t>(p * per_peer + i)] = a2a_value(me, p, i);
        // A communicator that writes nothing must not pass on the previous size's data.
        std::fill(recv_.begin(), recv_.begin() + count, -1.0f);
        c.barrier(*stream_);
        RankResult result;
        result.us = time_us(*device_, *stream_, common.warmup, common.iters, [&] {
            c.all_to_all_v(send_.data(), send_counts.data(), recv_.data(), recv_counts.data(), DType::kF32, *stream_);
        });
        if (common.check) {
            for (int s = 0; s < n; ++s) {
                if (recv_counts[static_cast<std::size_t>(s)] != per_peer) {
                    result.wrong += per_peer;
                    continue;
                }
                for (std::int64_t i = 0; i < per_peer; ++i)
                    result.wrong += recv_[static_cast<std::size_t>(s * per_peer + i)] != a2a_value(s, me, i);
            }
        }
        return result;
    }

  private:
    std::unique_ptr<Device> device_;
    std::unique_ptr<Stream> stream_;
    std::unique_ptr<Communicator> plain_;
    Communicator* borrowed_ = nullptr;
    std::unique_ptr<EmulatedLink> link_;
    std::vector<float> send_, recv_;
    DeviceBuffer emu_send_, emu_recv_;
};

// The table, shared by both modes; rows are printed by the caller with every rank's result reduced.
class A2aTable {
  public:
    A2aTable(Report& report, int num_ranks, const std::optional<LinkModel>& link, bool check)
        : report_(report), num_ranks_(num_ranks), link_(link), check_(check) {
        std::vector<Column> columns = {
            {"size", "size", "(B)", 12, 0},
            {"count", "count", "(elements)", 12, 0},
            {"type", "type", "", 6, 0},
            {"time_us", "time", "(us)", 10, 2},
            {"algbw_gbps", "algbw", "(GB/s)", 7, 2},
            {"busbw_gbps", "busbw", "(GB/s)", 7, 2},
        };
        if (link_) columns.push_back({"model_us", "model", "(us)", 10, 2});
        columns.push_back({"wrong", "#wrong", "", 6, 0});
        report_.begin_table(std::move(columns));
    }

    // One row: `count` elements per rank, the slowest rank's time, the wrong elements of all ranks.
    void add(std::int64_t count, double us, std::int64_t wrong) {
        const std::int64_t bytes = count * 4;
        const double algbw = us > 0.0 ? static_cast<double>(bytes) / us / 1e3 : 0.0;
        const double busbw = algbw * (num_ranks_ - 1) / num_ranks_;
        std::vector<Cell> cells = {bytes, count, std::string("float"), us, algbw, busbw};
        if (link_) {
            // Every rank sends and receives count / n elements to and from each of the n-1 others.
            const double link_bytes = static_cast<double>(count / num_ranks_) * (num_ranks_ - 1) * 4.0;
            cells.emplace_back(modelled_link_us(*link_, LinkOp::kAllToAllV, link_bytes, num_ranks_));
        }
        cells.emplace_back(check_ ? Cell{wrong} : Cell{});
        if (busbw > 0.0 && count / num_ranks_ > 0) {
            busbw_sum_ += busbw;
            ++busbw_rows_;
        }
        report_.add_row(std::move(cells));
    }

    std::string average_busbw() const {
        std::ostringstream os;
        os << std::fixed << std::setprecision(2) << (busbw_rows_ ? busbw_sum_ / busbw_rows_ : 0.0) << " GB/s";
        return os.str();
    }

  private:
    Report& report_;
    int num_ranks_;
    std::optional<LinkModel> link_;
    bool check_;
    double busbw_sum_ = 0.0;
    int busbw_rows_ = 0;
};

// Elements per rank for `bytes`: f32, rounded down to a multiple of the rank count (as nccl-tests).
std::int64_t elements_for(std::int64_t bytes, int num_ranks) { return bytes / 4 / num_ranks * num_ranks; }

nlohmann::ordered_json args_json(const CommonArgs& common, const A2aArgs& args, int num_ranks) {
    nlohmann::ordered_json j = common_args_json(common);
    j["sizes"] = args.sizes;
    j["ranks"] = num_ranks;
    j["mode"] = args.mpi ? "mpi" : "local";
    j["link"] = link_json(args.link);
    return j;
}

void print_notes(Report& report, const A2aArgs& args, int num_ranks, double memcpy_bw,
                 const std::vector<std::string>& rank_lines) {
    for (const std::string& line : rank_lines) report.note(line);
    std::ostringstream bw;
    bw << "memcpy bandwidth: " << std::fixed << std::setprecision(2) << memcpy_bw
       << " GB/s (256 MiB std::memcpy, best of 3): the ceiling for busbw within one host";
    report.note(bw.str());
    report.note(std::string(args.mpi ? "MpiCommunicator" : "LocalCommunicator") + ", " + std::to_string(num_ranks) +
                " ranks; time = slowest rank; busbw = algbw * (n-1)/n");
    if (args.link)
        report.note("EmulatedLink " + describe_link_model(*args.link) +
                    ": model = latency + (n-1)/n * size / bandwidth per op");
    report.note("check: every received element equals f(src, dst, i), exact in f32");
}

int run_local(const CommonArgs& common, const A2aArgs& args, const std::string& command) {
    const int n = args.ranks;
    const bool emulated = common.backend == "emu";
    std::unique_ptr<Device> device = make_bench_device(common);
    const std::int64_t max_count = elements_for(args.sizes.back(), n);
    std::vector<std::unique_ptr<A2aRank>> ranks;
    if (emulated) {
        std::vector<int> members(static_cast<std::size_t>(n));
        for (int r = 0; r < n; ++r) members[static_cast<std::size_t>(r)] = r;
        auto group = EmuGroup::create(launch::emulated_topology(args.topology, common.stack), members);
        for (int r = 0; r < n; ++r)
            ranks.push_back(std::make_unique<A2aRank>(group->communicator(r), std::nullopt, max_count,
                                                      make_bench_device(common)));
    } else {
        auto group = LocalGroup::create(n);
        for (int r = 0; r < n; ++r)
            ranks.push_back(std::make_unique<A2aRank>(group->communicator(r), args.link, max_count));
    }

    Report report(std::cout, "a2a", command, *device, common, args_json(common, args, n));
    report.print_preamble();
    std::vector<std::string> rank_lines;
    for (int r = 0; r < n; ++r)
        rank_lines.push_back("Rank " + std::to_string(r) + " Pid " + std::to_string(getpid()) + " thread " +
                             std::to_string(r) + ": " + ranks[static_cast<std::size_t>(r)]->comm().name());
    if (emulated) {
        for (const std::string& line : rank_lines) report.note(line);
        report.note("emu: times are the emulator's predictions for " + describe(args.topology) +
                    ", not measurements; nothing is moved, so there is no check");
        for (const std::string& note : args.cluster_notes) report.note(note);
    } else {
        print_notes(report, args, n, memcpy_gbps(), rank_lines);
    }
    A2aTable table(report, n, args.link, common.check);

    run_ranks_in_lockstep<RankResult>(
        n, args.sizes.size(),
        [&](int r, std::size_t c) {
            return ranks[static_cast<std::size_t>(r)]->run(elements_for(args.sizes[c], n), common);
        },
        [&](std::size_t c, const std::vector<RankResult>& results) {
            double us = 0.0;
            std::int64_t wrong = 0;
            for (const RankResult& res : results) {
                us = std::max(us, res.us);
                wrong += res.wrong;
            }
            table.add(elements_for(args.sizes[c], n), us, wrong);
        });
    return report.finish({{"Avg bus bandwidth", table.average_busbw()}});
}

#if SCMOE_WITH_MPI

// Under mpirun: MPI is initialised here (MPI_THREAD_SERIALIZED, what MpiCommunicator needs) and
// finalised on the way out. Rank 0 prints; every rank returns the same exit status.
int run_mpi(CommonArgs common, const A2aArgs& args, const std::string& command) {
    launch::init_mpi_serialized();
    int status = kExitOk;
    int me = 0, n = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    try {
        std::unique_ptr<Device> device = make_device("cpu");
        const std::int64_t max_count = elements_for(args.sizes.back(), n);
        MpiCommunicator mpi_comm(MPI_COMM_WORLD);
        {
            A2aRank rank(mpi_comm, args.link, max_count);
            std::ostream null_stream(nullptr);
            if (me != 0) common.json_path.clear();
            Report report(me == 0 ? std::cout : null_stream, "a2a", command, *device, common,
                          args_json(common, args, n));
            report.print_preamble();
            // One line per rank: pid, host and communicator, gathered to rank 0.
            const std::vector<std::string> rank_lines = mpi_rank_lines(args.link);
            // Measured on rank 0 alone while the others wait.
            double memcpy_bw = me == 0 ? memcpy_gbps() : 0.0;
            MPI_Bcast(&memcpy_bw, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
            print_notes(report, args, n, memcpy_bw, rank_lines);
            A2aTable table(report, n, args.link, common.check);
            for (const std::int64_t bytes : args.sizes) {
                const std::int64_t count = elements_for(bytes, n);
                // RankResult::run synchronizes its stream before returning: no communicator work is
                // pending while this thread calls MPI itself (MPI_THREAD_SERIALIZED).
                const RankResult res = rank.run(count, common);
                double us = res.us;
                long long wrong = res.wrong;
                MPI_Allreduce(MPI_IN_PLACE, &us, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
                MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
                table.add(count, us, wrong);
            }
            status = report.finish({{"Avg bus bandwidth", table.average_busbw()}});
        }
    } catch (const std::exception& e) {
        // The other ranks may be blocked in a collective with this one: take the job down.
        std::cerr << "scmoe-bench a2a: rank " << me << ": error: " << e.what() << "\n" << std::flush;
        MPI_Abort(MPI_COMM_WORLD, kExitError);
    }
    MPI_Finalize();
    return status;
}

#endif  // SCMOE_WITH_MPI

}  // namespace

int run_a2a_bench(int argc, char** argv, const std::string& command) {
    cxxopts::Options options = a2a_options();
    const cxxopts::ParseResult result = options.parse(argc, argv);
    if (result.count("help")) {
        std::cout << options.help({"common", "a2a"});
        return kExitOk;
    }
    reject_unmatched(result);
    CommonArgs common = read_common_options(result);
    A2aArgs args = read_a2a_args(result);
    // The host-buffer communicators (LocalCommunicator, MpiCommunicator) run on CPU streams;
    // emulated GPUs run EmuCommunicator over a cluster.
    if (common.backend == "cuda")
        throw UsageError(
            "--backend cuda: a2a runs the host communicators (LocalCommunicator, MpiCommunicator) "
            "on the cpu backend; NCCL is not wired into scmoe-bench yet");
    if (common.backend == "emu") {
        if (args.mpi) throw UsageError("--backend emu runs its ranks in-process (--ranks N), not under mpirun");
        if (args.link) throw UsageError("--backend emu models the interconnect itself (--cluster): drop --link*");
        try {
            const launch::EmuChoice c =
                launch::resolve_emu_choice(common.gpu, common.routing, args.cluster_flags, args.ranks);
            args.topology = c.topology;
            args.cluster_notes = launch::cluster_notes(c);
        } catch (const Error& e) {
            throw UsageError(e.what());
        }
        resolve_iters(common, Backend::kEmu);
        return run_local(common, args, command);
    }
    if (!args.cluster_flags.cluster.empty() || args.cluster_flags.any_override())
        throw UsageError("--cluster and its overrides describe emulated GPUs: they need --backend emu");
    common.backend = "cpu";
    resolve_iters(common, Backend::kCpu);
    if (args.mpi) {
#if SCMOE_WITH_MPI
        return run_mpi(common, args, command);
#else
        throw UsageError("--mpi (or mpirun) but this scmoe was built without MPI (SCMOE_WITH_MPI)");
#endif
    }
    return run_local(common, args, command);
}

}  // namespace scmoe::bench
