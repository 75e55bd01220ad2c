#include "launch/local_rank.h"

#include <cstdlib>
#include <string>

#include "kernels/error.h"

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

}  // namespace scmoe::launch
