#include "scmoe/kernels/emu/detail/world.h"

#include <sstream>

#include "scmoe/kernels/emu/timeline.h"

namespace scmoe::emu {

World& World::get() {
    static World world;
    return world;
}

void World::pump() {
    bool moved = true, any = false;
    while (moved) {
        moved = false;
        for (Timeline* t : timelines) moved |= t->advance();
        if (!moved) {
            bool all_wait = true;
            for (Timeline* t : timelines) all_wait &= t->host_state_ != Timeline::HostState::kRunning;
            if (all_wait) {
                for (Timeline* t : timelines) {
                    if (t->host_state_ == Timeline::HostState::kWaitingPeers && !t->relaxed_) {
                        t->relaxed_ = true;
                        moved = true;
                    }
                }
            }
        }
        any |= moved;
    }
    if (any) {
        ++progress;
        cv.notify_all();
    }
}

std::string World::describe() const {
    std::ostringstream os;
    for (std::size_t i = 0; i < timelines.size(); ++i)
        os << "\n  emulated GPU " << i << ": " << timelines[i]->describe_state();
    return os.str();
}

}  // namespace scmoe::emu
