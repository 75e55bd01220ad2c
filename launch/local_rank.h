// Which GPU a process uses: its rank among the processes of its node, from the launcher.
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

}  // namespace scmoe::launch
