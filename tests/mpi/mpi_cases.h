// The case loop of the tests that run under mpirun: every rank runs every case, a case fails when it
// fails on any rank (so every rank agrees), and rank 0 prints "ok"/"FAILED" per case and the
// "N passed, M failed" line CTest matches.
#pragma once

#include <mpi.h>

#include <cstdio>
#include <exception>
#include <functional>
#include <string>
#include <vector>

namespace scmoe::testing {

// run(i): case i on this rank, "" or what went wrong (an exception counts as a failure). Returns
// the number of failed cases, the same on every rank of MPI_COMM_WORLD.
inline int run_mpi_cases(const std::vector<std::string>& names, const std::function<std::string(std::size_t)>& run,
                         const std::string& what) {
    int world = 0, rank = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    int passed = 0, failed = 0;
    for (std::size_t i = 0; i < names.size(); ++i) {
        std::string error;
        try {
            error = run(i);
        } catch (const std::exception& e) {
            error = std::string("threw: ") + e.what();
        }
        if (!error.empty()) std::fprintf(stderr, "FAILED rank %d %s: %s\n", rank, names[i].c_str(), error.c_str());
        int bad = error.empty() ? 0 : 1, any = 0;
        MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        (any ? failed : passed) += 1;
        if (rank == 0) std::printf("%s %s\n", any ? "FAILED" : "ok    ", names[i].c_str());
    }
    if (rank == 0) std::printf("%d passed, %d failed (%d ranks, %s)\n", passed, failed, world, what.c_str());
    return failed;
}

}  // namespace scmoe::testing
