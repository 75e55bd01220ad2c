// How a process was launched: the world size a launcher (mpirun, srun) announced, and which GPU the
// process uses (its rank among the processes of its node). Shared by scmoe-train and scmoe-bench.
#pragma once

#include <optional>
#include <string>

namespace scmoe::launch {

struct LocalRank {
    int value = 0;
    std::string source;  // "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "LOCAL_RANK", "--device", "default"
};

// override (--device) if given; else the first of OMPI_COMM_WORLD_LOCAL_RANK (Open MPI's mpirun),
// SLURM_LOCALID (srun), LOCAL_RANK (torchrun-style launchers) that is set; else 0. Throws
// scmoe::Error when the variable that is used is not a non-negative integer.
LocalRank local_rank(std::optional<int> override_device = std::nullopt);

// The world size a launcher announced: OMPI_COMM_WORLD_SIZE (Open MPI's mpirun), else PMI_SIZE
// (MPICH / srun --mpi=pmi2), else SLURM_STEP_NUM_TASKS (any srun step); 0 when none is set.
int launcher_world_size();
// True when a launcher started more than one process.
bool launched_by_mpirun();

#if SCMOE_WITH_MPI
// Initialises MPI at MPI_THREAD_SERIALIZED (what MpiCommunicator needs) unless it already is.
void init_mpi_serialized();
// Initialises MPI asking for MPI_THREAD_MULTIPLE unless it already is. True when the library allows
// calls from several threads at once (two streams' collectives in flight together, e.g. the gradient
// all-reduce overlapped with the expert-parallel all-to-all); false means one stream at a time.
bool init_mpi_multiple();
#endif

}  // namespace scmoe::launch
