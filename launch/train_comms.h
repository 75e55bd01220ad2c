// The communicators a training rank needs (world, its expert-parallel group, its expert-data-parallel
// group; see scmoe/models/parallel.h), built for in-process ranks (LocalGroup threads) or for MPI processes
// (MPI on CPU, NCCL on CUDA), optionally behind an EmulatedLink.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "scmoe/comm/emulated_link.h"
#include "scmoe/models/parallel.h"

namespace scmoe {
class LocalGroup;
class EmuGroup;
class Device;
struct Topology;
}  // namespace scmoe

namespace scmoe::launch {

// Which groups an emulated link slows down: only the expert-parallel group (the MoE all-to-all the
// ScMoE overlap is about; the default) or every group (also the gradient all-reduce).
enum class LinkScope { kExpertParallel, kAll };

// A rank's communicators; comms() borrows them.
struct RankComms {
    std::vector<std::shared_ptr<Communicator>> owned;  // world, ep, expert_dp
    models::TrainComms comms() const { return {owned[0].get(), owned[1].get(), owned[2].get()}; }
};

// The groups of `world` in-process ranks with expert-parallel size `ep`; created once, shared by
// the rank threads, each of which calls rank_comms(rank) once. With a topology the ranks are
// emulated GPUs (rank r at place r of the topology) and the groups are EmuGroups; without, they
// are LocalGroups, optionally behind an emulated link.
class LocalTrainGroups {
  public:
    LocalTrainGroups(int world, int ep, std::optional<LinkModel> link, LinkScope scope = LinkScope::kExpertParallel);
    LocalTrainGroups(int world, int ep, const Topology& topology);
    RankComms rank_comms(int rank);
    // Rank `rank` will make no further calls (it failed with `why`): the collectives of its groups
    // that it has not joined fail at once on its peers instead of after the timeout
    // (LocalGroup::abandon, EmuGroup::abandon).
    void abandon(int rank, const std::string& why);

  private:
    int world_, ep_;
    std::optional<LinkModel> link_;
    LinkScope scope_ = LinkScope::kExpertParallel;
    std::shared_ptr<LocalGroup> world_group_;
    std::vector<std::shared_ptr<LocalGroup>> ep_groups_, expert_dp_groups_;
    std::shared_ptr<EmuGroup> emu_world_;
    std::vector<std::shared_ptr<EmuGroup>> emu_ep_, emu_expert_dp_;
};

// Runs fn(rank, comms) for every rank of `groups` on its own thread; after joining them all, throws
// scmoe::Error "rank r: ..." with the error of the rank that failed first other than by a CommError
// (the cause), else of the rank that failed first. A rank that throws abandons its groups, so its
// peers' collectives fail at once rather than after SCMOE_COMM_TIMEOUT_S; fn should call
// groups.abandon itself before unwinding anything whose destructor waits for its streams.
void run_local_ranks(LocalTrainGroups& groups, int world, const std::function<void(int, const RankComms&)>& fn);

#if SCMOE_WITH_MPI
// Collective over MPI_COMM_WORLD: splits it into the groups of `layout` and wraps each in an
// MpiCommunicator (CPU device) or an NcclCommunicator (CUDA device).
RankComms mpi_rank_comms(const models::ParallelLayout& layout, Device& device, int cuda_device,
                         std::optional<LinkModel> link, LinkScope scope = LinkScope::kExpertParallel);
#endif

}  // namespace scmoe::launch
