// EmuCommunicator: emulated NCCL for emulated GPUs (the emu backend, scmoe/kernels/emu/), ranks as
// threads of one process.
//
//   auto group = EmuGroup::create(topology, {0, 1, 2, 3});  // the members' global ranks
//   std::unique_ptr<Communicator> comm = group->communicator(member);  // once per member thread
//
// What runs for real and what is modeled:
//  - The counts of all_to_all_v are exchanged for real, and the host blocks exactly where
//    NcclCommunicator::all_to_all_v blocks: it enqueues the counts' upload, their exchange and
//    their download, then synchronizes the stream (the host clock jumps to the exchange's end),
//    then enqueues the data exchange and returns.
//  - Payload is not moved (emulated device memory holds no payload). Small buffers (up to
//    emu::kRealCopyBytes: a layer's expert counts, a loss, a flag, measured times) are exchanged,
//    reduced, gathered and broadcast for real, so routing metadata and host-side agreements among
//    ranks are the real ones.
//  - Each collective is a communication kernel on the stream: it holds Topology::comm_sms of the
//    GPU's SMs from its arrival, waits for every member to arrive, then takes the Topology's time
//    for its bytes (scmoe/comm/topology.h).
// Calls are matched by order (a member's k-th call meets every member's k-th call); a mismatch
// (different operation, count or dtype) throws Error on the members that see it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "scmoe/comm/communicator.h"
#include "scmoe/comm/topology.h"

namespace scmoe {

class EmuGroup : public std::enable_shared_from_this<EmuGroup> {
public:
    // `ranks`: the members' global ranks in `topology` (member i is ranks[i]); distinct.
    static std::shared_ptr<EmuGroup> create(Topology topology, std::vector<int> ranks);
    ~EmuGroup();
    // The communicator of member `member`, for one thread; its streams must be emulated.
    std::unique_ptr<Communicator> communicator(int member);
    // Member `member` will make no further calls (its thread failed with `why`): every collective
    // the others wait in for it, and every later call, fails with a CommError naming it and `why`
    // (as LocalGroup::abandon), instead of waiting for the emulator's stall limit. First call wins.
    void abandon(int member, const std::string& why);

    struct State;
    State& state() { return *state_; }

private:
    EmuGroup() = default;
    std::unique_ptr<State> state_;
};

}  // namespace scmoe
