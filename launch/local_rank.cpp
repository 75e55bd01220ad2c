#include "launch/local_rank.h"

#include <cstdlib>
#include <string>

#include "scmoe/kernels/error.h"
#if SCMOE_WITH_MPI
#include <mpi.h>
#endif

namespace scmoe::launch {

LocalRank local_rank(std::optional<int> override_device) {
    if (override_device) {
        SCMOE_CHECK(*override_device >= 0, "--device " << *override_device << " must be >= 0");
        return {*override_device, "--device"};
    }
    for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "LOCAL_RANK"}) {
        const char* v = std::getenv(name);
        if (!v || !*v) continue;
        std::size_t used = 0;
        int value = -1;
        try {
            value = std::stoi(v, &used);
        } catch (const std::exception&) {
        }
        SCMOE_CHECK(value >= 0 && used == std::string(v).size(),
                    name << "='" << v << "' is not a local rank (a non-negative integer)");
        return {value, name};
    }
    return {0, "default"};
}

int launcher_world_size() {
    for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS"}) {
        const char* value = std::getenv(name);
        if (value != nullptr && std::atoi(value) > 0) return std::atoi(value);
    }
    return 0;
}

bool launched_by_mpirun() { return launcher_world_size() > 1; }

#if SCMOE_WITH_MPI
namespace {

// Initialises MPI asking for `level` unless it already is; the thread level MPI provides.
int init_mpi_at(int level) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    int provided = 0;
    if (!initialized)
        MPI_Init_thread(nullptr, nullptr, level, &provided);
    else
        MPI_Query_thread(&provided);
    return provided;
}

}  // namespace

void init_mpi_serialized() { init_mpi_at(MPI_THREAD_SERIALIZED); }

bool init_mpi_multiple() { return init_mpi_at(MPI_THREAD_MULTIPLE) >= MPI_THREAD_MULTIPLE; }
#endif

}  // namespace scmoe::launch
