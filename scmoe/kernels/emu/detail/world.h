// World: every emulated GPU's Timeline of the process, under one lock, since collectives tie their
// clocks (timeline.h). Private to kernels/emu/ (timeline.cpp, rendezvous.cpp): not public API, and
// not installed.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace scmoe::emu {

class Timeline;

class World {
  public:
    // The process's one World.
    static World& get();
    std::mutex mu;
    std::condition_variable cv;
    std::vector<Timeline*> timelines;
    std::uint64_t progress = 0;  // bumped whenever some timeline moved

    // Under mu: advances every timeline until none can move. When every host waits and nothing
    // moves, hosts that wait for peers may let their GPU run ahead of their clock (relaxed), since
    // no Work can come from them before the meeting ends.
    void pump();
    // Under mu: every timeline's state, one line each (for the message of a stuck run).
    std::string describe() const;
};

}  // namespace scmoe::emu
