// scmoe-bench layer --ep N: the expert-parallel MoeLayer on N ranks, each with --tokens tokens of its
// own and E/N experts. Ranks are in-process threads (LocalCommunicator, one CPU device and stream
// each) or, under mpirun, processes (MpiCommunicator over MPI_COMM_WORLD); --link puts every rank's
// communicator behind an EmulatedLink.
//
// Times: fwd_time and train_time are the slowest rank's mean over the timed iterations, every
// rank's clock started after a barrier. The stage columns are rank 0's staged pass (events between
// stages); a2a = its dispatch + collect + their backward mirrors, a2a_% = a2a / the staged pass;
// a2a_min = per a2a stage the fastest rank's mean, summed. Each rank's a2a share follows its row as
// a '#' line.
#include <unistd.h>

#include <algorithm>
#include <iostream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "scmoe/comm/local_communicator.h"
#include "scmoe/comm/mpi_communicator.h"
#include "scmoe/kernels/error.h"
#include "launch/local_rank.h"
#include "layer_common.h"
#include "layer_ep_rank.h"
#include "multi_rank.h"
#include "report.h"

namespace scmoe::bench {
namespace {

struct EpCase {
    DispatchMode dispatch;
    std::int64_t tokens;
};

std::vector<EpCase> ep_cases(const LayerBenchArgs& args) {
    std::vector<EpCase> cases;
    for (DispatchMode d : args.dispatch)
        for (std::int64_t t : args.tokens) cases.push_back({d, t});
    return cases;
}

void print_notes(Report& report, const LayerBenchArgs& args, bool check, const std::vector<std::string>& rank_lines) {
    for (const std::string& line : rank_lines) report.note(line);
    report.note(std::string(args.mpi ? "MpiCommunicator over MPI_COMM_WORLD" : "LocalCommunicator") + ", ep " +
                std::to_string(args.ep) + ": every rank has --tokens tokens of its own and " +
                std::to_string(args.experts / args.ep) + " of the " + std::to_string(args.experts) +
                " experts; tokens = per rank, tok/s = all ranks' tokens / time, dropped = sum over ranks");
    if (args.link)
        report.note("EmulatedLink " + describe_link_model(*args.link) +
                    " around every rank's communicator; a2a_model = rank 0's modelled all_to_all_v time per staged "
                    "pass (latency + bytes / bandwidth per op, 5 ops: counts, dispatch, collect and their backward)");
    report.note(
        "fwd_time, train_time = the slowest rank's mean over the timed iterations; every rank starts its clock "
        "after a barrier");
    report.note(
        "stage columns = rank 0's stream, one forward+backward staged with events between stages, mean over the "
        "timed iterations; stage_sum = their total; a2a = disp_a2a + coll_a2a + coll_bwd + disp_bwd (count "
        "exchange, regroup and any wait for a slower rank included); a2a_% = a2a / stage_sum; a2a_min = per a2a stage "
        "the fastest rank's mean, summed: about the exchange alone, without the wait for the slowest rank");
    if (check)
        report.note(
            "check: every rank's y, grad_x and weight gradients against a single-rank MoeLayer (all experts) on "
            "its own inputs, expert gradients summed over ranks: wrong = elements off by > 1e-4 * max(|ref|, "
            "rms(ref)) or non-finite + dropped-count differences + elements of a second forward+backward that "
            "differ bitwise");
}

// The table: one row per case from every rank's results, then each rank's a2a share.
class EpTable {
  public:
    EpTable(Report& report, const LayerBenchArgs& args, bool check) : report_(report), args_(args), check_(check) {
        columns_ = {
            {"experts", "experts", "", 7, 0},
            {"top_k", "top_k", "", 5, 0},
            {"dispatch", "dispatch", "", 8, 0},
            {"ep", "ep", "", 3, 0},
            {"tokens", "tokens", "", 7, 0},
            {"fwd_us", "fwd_time", "(us)", 10, 1},
            {"fwd_tokens_per_s", "fwd_tok/s", "(tok/s)", 10, 0},
            {"fwd_bwd_us", "train_time", "(us)", 10, 1},
            {"train_tokens_per_s", "train_tok/s", "(tok/s)", 10, 0},
        };
        stage_columns_ = {kRoute, kPermute, kDispatch, kExperts, kCollect, kCombine};
        if (args.shared_expert) stage_columns_.push_back(kShared);
        for (int s : {kCombineBwd, kCollectBwd, kExpertsBwd, kDispatchBwd, kPermuteBwd, kRouteBwd})
            stage_columns_.push_back(s);
        if (args.shared_expert) stage_columns_.push_back(kSharedBwd);
        for (int s : stage_columns_) {
            const char* header = s == kDispatch ? "disp_a2a" : s == kCollect ? "coll_a2a" : kStageHeader[s];
            columns_.push_back({kStageKey[s], header, "(us)", 9, 1});
        }
        columns_.push_back({"stage_sum_us", "stage_sum", "(us)", 10, 1});
        columns_.push_back({"a2a_us", "a2a", "(us)", 9, 1});
        columns_.push_back({"a2a_share_pct", "a2a_%", "(%)", 6, 1});
        columns_.push_back({"a2a_min_us", "a2a_min", "(us)", 9, 1});
        if (args.link) columns_.push_back({"a2a_model_us", "a2a_model", "(us)", 9, 1});
        columns_.push_back({"dropped", "dropped", "", 7, 0});
        columns_.push_back({"wrong", "#wrong", "", 6, 0});
    }

    // `results[r]` = rank r's; `provider` = rank 0's grouped GEMM provider.
    void add(const EpCase& c, const std::vector<EpCaseResult>& results, const std::string& provider) {
        if (!started_ || c.dispatch != last_dispatch_) {
            report_.note("config: " + make_config(args_, c.dispatch, DType::kF32).to_string() +
                         " provider=" + provider + " (from " + provider_source(args_) + ")");
            last_dispatch_ = c.dispatch;
        }
        if (!started_) report_.begin_table(columns_);
        started_ = true;
        double fwd_us = 0.0, train_us = 0.0;
        std::int64_t dropped = 0, wrong = 0;
        for (const EpCaseResult& r : results) {
            fwd_us = std::max(fwd_us, r.fwd_us);
            train_us = std::max(train_us, r.train_us);
            dropped += r.dropped;
            wrong += r.wrong;
        }
        const EpCaseResult& r0 = results.front();
        const double all_tokens = static_cast<double>(c.tokens) * static_cast<double>(results.size());
        const double fwd_rate = all_tokens / (fwd_us * 1e-6), train_rate = all_tokens / (train_us * 1e-6);
        fwd_rate_sum_ += fwd_rate;
        train_rate_sum_ += train_rate;
        share_sum_ += r0.a2a_share();
        ++rows_;
        std::vector<Cell> cells = {static_cast<std::int64_t>(args_.experts),
                                   static_cast<std::int64_t>(args_.top_k),
                                   std::string(dispatch_mode_name(c.dispatch)),
                                   static_cast<std::int64_t>(results.size()),
                                   c.tokens,
                                   fwd_us,
                                   fwd_rate,
                                   train_us,
                                   train_rate};
        for (int s : stage_columns_) cells.push_back(r0.stage_us[static_cast<std::size_t>(s)]);
        cells.push_back(r0.stage_sum_us());
        cells.push_back(r0.a2a_us());
        cells.push_back(r0.a2a_share());
        cells.push_back(a2a_min_us(results));
        if (args_.link) cells.push_back(r0.link_model_us);
        cells.push_back(dropped);
        cells.push_back(check_ ? Cell{wrong} : Cell{});
        report_.add_row(std::move(cells));
        std::string line = "a2a per rank (us, % of its staged pass):";
        for (std::size_t i = 0; i < results.size(); ++i)
            line += " " + std::to_string(i) + ": " + fixed(results[i].a2a_us(), 1) + " " +
                    fixed(results[i].a2a_share(), 1) + "%" + (i + 1 < results.size() ? "," : "");
        report_.note(line);
    }

    int finish() {
        const double n = rows_ ? static_cast<double>(rows_) : 1.0;
        return report_.finish({{"Avg fwd tokens/s", fixed(fwd_rate_sum_ / n, 0)},
                               {"Avg train tokens/s", fixed(train_rate_sum_ / n, 0)},
                               {"Avg a2a share (rank 0)", fixed(share_sum_ / n, 1) + " %"}});
    }

  private:
    // Per a2a stage, the fastest rank's mean (the rank that arrives last waits least), summed.
    static double a2a_min_us(const std::vector<EpCaseResult>& results) {
        double sum = 0.0;
        for (int s = 0; s < kNumStages; ++s) {
            if (!is_a2a_stage(s)) continue;
            double least = results.front().stage_us[static_cast<std::size_t>(s)];
            for (const EpCaseResult& r : results) least = std::min(least, r.stage_us[static_cast<std::size_t>(s)]);
            sum += least;
        }
        return sum;
    }

    Report& report_;
    const LayerBenchArgs& args_;
    bool check_;
    std::vector<Column> columns_;
    std::vector<int> stage_columns_;
    bool started_ = false;
    DispatchMode last_dispatch_ = DispatchMode::kCapacity;
    double fwd_rate_sum_ = 0.0, train_rate_sum_ = 0.0, share_sum_ = 0.0;
    int rows_ = 0;
};

int run_local(const CommonArgs& common, const LayerBenchArgs& args, const std::string& command) {
    const int n = args.ep;
    std::unique_ptr<Device> device = make_device("cpu");
    auto group = LocalGroup::create(n);
    std::vector<std::unique_ptr<EpLayerRank>> ranks;
    for (int r = 0; r < n; ++r)
        ranks.push_back(std::make_unique<EpLayerRank>(group->communicator(r), args, common.check));

    Report report(std::cout, "layer", command, *device, common, layer_args_json(common, args, DType::kF32));
    report.print_preamble();
    std::vector<std::string> rank_lines;
    for (int r = 0; r < n; ++r)
        rank_lines.push_back("Rank " + std::to_string(r) + " Pid " + std::to_string(getpid()) + " thread " +
                             std::to_string(r) + ": " + ranks[static_cast<std::size_t>(r)]->comm().name());
    print_notes(report, args, common.check, rank_lines);
    EpTable table(report, args, common.check);

    const std::vector<EpCase> cases = ep_cases(args);
    run_ranks_in_lockstep<EpCaseResult>(
        n, cases.size(),
        [&](int r, std::size_t c) {
            return ranks[static_cast<std::size_t>(r)]->run_case(cases[c].dispatch, cases[c].tokens, common);
        },
        [&](std::size_t c, const std::vector<EpCaseResult>& results) {
            table.add(cases[c], results, ranks.front()->provider_name());
        });
    return table.finish();
}

#if SCMOE_WITH_MPI

// Under mpirun: MPI is initialised here and finalised on the way out. Rank 0 prints; every rank
// gets every rank's results (MPI_Allgather) and returns the same exit status.
int run_mpi(CommonArgs common, const LayerBenchArgs& args, const std::string& command) {
    launch::init_mpi_serialized();
    int status = kExitOk;
    int me = 0, n = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    try {
        std::unique_ptr<Device> device = make_device("cpu");
        MpiCommunicator mpi_comm(MPI_COMM_WORLD);
        {
            EpLayerRank rank(mpi_comm, args, common.check);
            std::ostream null_stream(nullptr);
            if (me != 0) common.json_path.clear();
            Report report(me == 0 ? std::cout : null_stream, "layer", command, *device, common,
                          layer_args_json(common, args, DType::kF32));
            report.print_preamble();
            print_notes(report, args, common.check, mpi_rank_lines(args.link));
            EpTable table(report, args, common.check);
            std::vector<double> mine(EpCaseResult::kPackedSize), all(mine.size() * static_cast<std::size_t>(n));
            for (const EpCase& c : ep_cases(args)) {
                // run_case returns with the stream synchronized: no communicator work is pending
                // while this thread calls MPI itself (MPI_THREAD_SERIALIZED).
                rank.run_case(c.dispatch, c.tokens, common).pack(mine.data());
                MPI_Allgather(mine.data(), EpCaseResult::kPackedSize, MPI_DOUBLE, all.data(), EpCaseResult::kPackedSize,
                              MPI_DOUBLE, MPI_COMM_WORLD);
                std::vector<EpCaseResult> results;
                for (int r = 0; r < n; ++r)
                    results.push_back(EpCaseResult::unpack(all.data() + r * EpCaseResult::kPackedSize));
                table.add(c, results, rank.provider_name());
            }
            status = table.finish();
        }
    } catch (const std::exception& e) {
        // The other ranks may be blocked in a collective with this one: take the job down.
        std::cerr << "scmoe-bench layer: rank " << me << ": error: " << e.what() << "\n" << std::flush;
        MPI_Abort(MPI_COMM_WORLD, kExitError);
    }
    MPI_Finalize();
    return status;
}

#endif  // SCMOE_WITH_MPI

}  // namespace

int run_layer_ep_bench(CommonArgs common, const LayerBenchArgs& args, const std::string& command) {
    // The host-buffer communicators (LocalCommunicator, MpiCommunicator) run on CPU streams.
    if (common.backend == "cuda")
        throw UsageError(
            "--backend cuda with --ep > 1: the expert-parallel layer runs on the host communicators "
            "(LocalCommunicator, MpiCommunicator), cpu backend only; NCCL is not wired into scmoe-bench yet");
    if (args.provider_given && args.provider != GroupedGemmProvider::kAuto &&
        args.provider != GroupedGemmProvider::kLoop)
        throw UsageError("--provider " + args.provider_name + " needs the cuda backend");
    common.backend = "cpu";
    resolve_iters(common, Backend::kCpu);
    if (args.mpi) {
#if SCMOE_WITH_MPI
        return run_mpi(common, args, command);
#else
        throw UsageError("mpirun but this scmoe was built without MPI (SCMOE_WITH_MPI)");
#endif
    }
    return run_local(common, args, command);
}

}  // namespace scmoe::bench
