// Expert parallelism across real processes: under mpirun, every world rank runs the distributed
// MoE layer over an MpiCommunicator (MPI_COMM_WORLD split into dp replicas of ep ranks) and checks
// its output, dropped count and every gradient against the single-rank layer on its tokens
// (fp32, relative 1e-5). The cases that fit the world size run. Rank 0 prints "N passed, M failed".
//
//   mpirun -np 2 scmoe_moe_ep_mpi_test rank-exits   rank 1 leaves after building the layer; rank 0's
//                                                   forward must fail with the timeout naming rank 1
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>

#include "scmoe/comm/mpi_communicator.h"
#include "ep_reference.h"
#include "mpi_cases.h"

namespace {

using scmoe::DispatchMode;
using scmoe::testing::EpCase;

std::vector<EpCase> cases_for(int world) {
    const auto cap = DispatchMode::kCapacity, dropless = DispatchMode::kDropless;
    if (world == 2)
        return {EpCase{"ep2_top1_capacity", 1, 2, 1, cap, {12, 12}, false},
                EpCase{"ep2_top2_dropless", 1, 2, 2, dropless, {12, 9}, false},
                EpCase{"ep2_top2_capacity_shared_zero_token_rank", 1, 2, 2, cap, {10, 0}, true},
                EpCase{"ep2_top3_capacity_shared", 1, 2, 3, cap, {12, 9}, true},
                EpCase{"ep2_top3_dropless", 1, 2, 3, dropless, {7, 12}, false}};
    if (world == 4)
        return {EpCase{"ep4_top2_capacity", 1, 4, 2, cap, {8, 8, 8, 8}, false},
                EpCase{"ep4_top1_dropless_skewed", 1, 4, 1, dropless, {9, 0, 5, 13}, true},
                EpCase{"dp2_ep2_top2_dropless", 2, 2, 2, dropless, {6, 11, 8, 4}, false},
                EpCase{"dp2_ep2_top1_capacity", 2, 2, 1, cap, {10, 10, 10, 10}, true},
                EpCase{"ep4_top3_capacity_skewed", 1, 4, 3, cap, {16, 3, 0, 7}, false},
                EpCase{"dp2_ep2_top3_dropless", 2, 2, 3, dropless, {6, 11, 8, 4}, true}};
    return {};
}

// Every rank builds the expert-parallel layer (a collective), then rank 1 leaves without finalising
// MPI; rank 0's forward waits in the dispatch all-to-all and must fail with the timeout.
int run_rank_exits(int rank) {
    const EpCase c{"rank_exits", 1, 2, 2, DispatchMode::kDropless, {6, 6}, false};
    const scmoe::MoeConfig config = scmoe::testing::ep_config(c);
    auto device = scmoe::make_device("cpu");
    auto stream = device->create_stream();
    scmoe::MpiCommunicator comm(MPI_COMM_WORLD);
    scmoe::MoeLayer layer(config, *device, 6, &comm);
    if (rank == 1) {
        std::fflush(nullptr);
        std::_Exit(0);
    }
    scmoe::MoeParamStore params(*device, config, scmoe::DType::kF32, 2);
    scmoe::testing::fill_uniform(static_cast<float*>(params.data()), params.numel(), 0.5f, 5);
    std::vector<float> x(6 * static_cast<std::size_t>(config.hidden), 0.5f), y(x.size());
    const auto start = std::chrono::steady_clock::now();
    try {
        layer.forward(scmoe::testing::host_tensor(x, 6, config.hidden), scmoe::Tensor(), params.view(),
                      scmoe::testing::host_tensor(y, 6, config.hidden), *stream);
        stream->synchronize();
    } catch (const scmoe::Error& e) {
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        std::printf("rank %d caught after %.1f s: %s\n", rank, s, e.what());
        std::fflush(nullptr);
        return 1;
    }
    std::printf("rank %d: the layer's forward with a departed peer did not fail\n", rank);
    return 2;
}

}  // namespace

int main(int argc, char** argv) {
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    int world = 0, rank = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (argc > 1 && std::string(argv[1]) == "rank-exits") {
        int rc = 3;
        try {
            rc = run_rank_exits(rank);
        } catch (const std::exception& e) {
            std::fprintf(stderr, "rank %d: unexpected error: %s\n", rank, e.what());
        }
        std::_Exit(rc);  // the peer is gone: MPI_Finalize could wait for it forever
    }
    const auto cases = cases_for(world);
    if (cases.empty() && rank == 0) std::printf("no cases for %d ranks (run with -np 2 or -np 4)\n", world);
    std::vector<std::string> names;
    for (const EpCase& c : cases) names.push_back(c.name);
    const int failed = scmoe::testing::run_mpi_cases(
        names,
        [&](std::size_t i) {
            const EpCase& c = cases[i];
            std::vector<scmoe::testing::RankReference> refs;
            for (int w = 0; w < world; ++w) refs.push_back(scmoe::testing::single_rank_reference(c, w));
            MPI_Comm ep_comm;
            MPI_Comm_split(MPI_COMM_WORLD, rank / c.ep, rank % c.ep, &ep_comm);
            std::string error;
            {
                scmoe::MpiCommunicator comm(ep_comm);
                error = scmoe::testing::run_ep_rank(c, rank, comm, refs, 1e-5);
            }
            MPI_Comm_free(&ep_comm);
            return error;
        },
        "MpiCommunicator");
    MPI_Finalize();
    return failed ? 1 : 0;
}
