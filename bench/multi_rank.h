// What the multi-rank subcommands (a2a, layer --ep) share: the EmulatedLink flags, mpirun
// detection, and the per-rank preamble lines of an MPI job.
#pragma once

#include <cxxopts.hpp>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "comm/emulated_link.h"

namespace scmoe::bench {

// Adds --link, --link-gbps and --link-latency-us to `options` in `group`.
void add_link_options(cxxopts::Options& options, const std::string& group);
// The link they name, or nullopt for none; throws UsageError on a bad or contradictory value.
std::optional<LinkModel> read_link_options(const cxxopts::ParseResult& result);
// {"name", "gbps", "latency_us"}, or null without a link.
nlohmann::ordered_json link_json(const std::optional<LinkModel>& link);

// The world size mpirun announced (OMPI_COMM_WORLD_SIZE, else PMI_SIZE), 0 when neither is set.
int mpirun_world_size();
// True under mpirun with more than one process.
bool launched_by_mpirun();

#if SCMOE_WITH_MPI
// Initialises MPI at MPI_THREAD_SERIALIZED (what MpiCommunicator needs) unless it already is.
void init_mpi_serialized();
// "Rank r Pid p on host: mpi(rank r of n)[ behind link]" for every rank of MPI_COMM_WORLD, gathered
// to rank 0 (the other ranks get an empty list). Collective.
std::vector<std::string> mpi_rank_lines(const std::optional<LinkModel>& link);
#endif

}  // namespace scmoe::bench
