// In-process ranks for the layer and block tests: a body run on `ranks` threads of one LocalGroup,
// each rank's error caught and returned (the test asserts they are all "").
#pragma once

#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "scmoe/comm/local_communicator.h"

namespace scmoe::testing {

// Runs `body(rank, comm)` on `ranks` threads of one LocalGroup (comm null for one rank); returns each
// rank's error, "rank r: <what>", or "" where the body returned.
template <class Body>
std::vector<std::string> on_local_ranks(int ranks, Body body) {
    std::shared_ptr<LocalGroup> group = ranks > 1 ? LocalGroup::create(ranks, 60.0) : nullptr;
    std::vector<std::string> errors(static_cast<std::size_t>(ranks));
    std::vector<std::thread> threads;
    for (int r = 0; r < ranks; ++r)
        threads.emplace_back([&, r] {
            try {
                std::unique_ptr<Communicator> comm = group ? group->communicator(r) : nullptr;
                body(r, comm.get());
            } catch (const std::exception& e) {
                errors[static_cast<std::size_t>(r)] = "rank " + std::to_string(r) + ": " + e.what();
            }
        });
    for (auto& t : threads) t.join();
    return errors;
}

}  // namespace scmoe::testing
