// What the multi-rank subcommands (a2a, layer --ep) share: the EmulatedLink flags, mpirun
// detection, the per-rank preamble lines of an MPI job, and the in-process lockstep driver.
#pragma once

#include <atomic>
#include <barrier>
#include <cstddef>
#include <cxxopts.hpp>
#include <exception>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "scmoe/comm/emulated_link.h"
#include "scmoe/kernels/error.h"

namespace scmoe::bench {

// Adds --link, --link-gbyte-s and --link-latency-us to `options` in `group` (and the renamed --link-gbps,
// refused naming --link-gbyte-s).
void add_link_options(cxxopts::Options& options, const std::string& group);
// The link they name, or nullopt for none; throws UsageError on a bad or contradictory value.
std::optional<LinkModel> read_link_options(const cxxopts::ParseResult& result);
// {"name", "gbps", "latency_us"}, or null without a link.
nlohmann::ordered_json link_json(const std::optional<LinkModel>& link);


// Runs `num_cases` cases on `num_ranks` in-process rank threads in lockstep: for case c every
// thread r computes run_rank(r, c), then the calling thread gets on_case(c, results) with every
// rank's result. Throws Error("rank r: ...") with the first failure, after the threads are joined.
//
// NOTES: the caller and the rank threads meet at `sync` twice per case: once to start it, once
// when every rank has finished it. A failed rank records its error and keeps meeting, so nobody
// hangs (its peers fail too, at the latest after SCMOE_COMM_TIMEOUT_S).
template <class Result>
void run_ranks_in_lockstep(int num_ranks, std::size_t num_cases, const std::function<Result(int, std::size_t)>& run_rank,
                           const std::function<void(std::size_t, const std::vector<Result>&)>& on_case) {
    const auto n = static_cast<std::size_t>(num_ranks);
    std::barrier sync(num_ranks + 1);
    std::atomic<std::size_t> next{0};
    std::atomic<bool> stop{false};
    std::vector<Result> results(n);
    std::vector<std::string> errors(n);
    std::vector<std::thread> threads;
    for (int r = 0; r < num_ranks; ++r) {
        threads.emplace_back([&, r] {
            std::string& error = errors[static_cast<std::size_t>(r)];
            while (true) {
                sync.arrive_and_wait();
                if (stop) return;
                if (error.empty()) {
                    try {
                        results[static_cast<std::size_t>(r)] = run_rank(r, next);
                    } catch (const std::exception& e) {
                        error = e.what();
                    }
                }
                sync.arrive_and_wait();
            }
        });
    }
    std::string failure;
    for (std::size_t c = 0; c < num_cases && failure.empty(); ++c) {
        next = c;
        sync.arrive_and_wait();
        sync.arrive_and_wait();
        for (std::size_t r = 0; r < n && failure.empty(); ++r)
            if (!errors[r].empty()) failure = "rank " + std::to_string(r) + ": " + errors[r];
        if (failure.empty()) on_case(c, results);
    }
    stop = true;
    sync.arrive_and_wait();
    for (auto& t : threads) t.join();
    if (!failure.empty()) throw Error(failure);
}

#if SCMOE_WITH_MPI
// "Rank r Pid p on host: mpi(rank r of n)[ behind link]" for every rank of MPI_COMM_WORLD, gathered
// to rank 0 (the other ranks get an empty list). Collective.
std::vector<std::string> mpi_rank_lines(const std::optional<LinkModel>& link);
#endif

}  // namespace scmoe::bench
