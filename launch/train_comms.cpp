#include "launch/train_comms.h"

#include <chrono>
#include <functional>
#include <new>
#include <string>
#include <system_error>
#include <thread>

#include "scmoe/comm/emu_communicator.h"
#include "scmoe/comm/local_communicator.h"
#include "scmoe/kernels/device.h"
#include "scmoe/kernels/error.h"
#if SCMOE_WITH_MPI
#include "scmoe/comm/mpi_communicator.h"
#if SCMOE_WITH_CUDA
#include "scmoe/comm/nccl_communicator.h"
#endif
#endif

namespace scmoe::launch {
namespace {

std::shared_ptr<Communicator> behind(std::shared_ptr<Communicator> c, const std::optional<LinkModel>& link) {
    if (!link) return c;
    return std::make_shared<EmulatedLink>(std::move(c), *link);
}

}  // namespace

LocalTrainGroups::LocalTrainGroups(int world, int ep, std::optional<LinkModel> link, LinkScope scope)
    : world_(world), ep_(ep), link_(std::move(link)), scope_(scope) {
    models::ParallelLayout{world, 0, ep}.validate();
    world_group_ = LocalGroup::create(world);
    for (int g = 0; g < world / ep; ++g) ep_groups_.push_back(LocalGroup::create(ep));
    for (int e = 0; e < ep; ++e) expert_dp_groups_.push_back(LocalGroup::create(world / ep));
}

LocalTrainGroups::LocalTrainGroups(int world, int ep, const Topology& topology) : world_(world), ep_(ep) {
    models::ParallelLayout{world, 0, ep}.validate();
    SCMOE_CHECK(world <= topology.world_size(),
                world << " ranks on cluster " << topology.name << " of " << topology.world_size() << " GPUs");
    // Each group's members in member order: rank r is member l.ep_rank() of expert-parallel group
    // l.ep_group(), and member l.ep_group() of expert-data-parallel group l.ep_rank().
    std::vector<int> all(static_cast<std::size_t>(world));
    std::vector<std::vector<int>> ep_members(static_cast<std::size_t>(world / ep), std::vector<int>(ep));
    std::vector<std::vector<int>> dp_members(static_cast<std::size_t>(ep), std::vector<int>(world / ep));
    for (int r = 0; r < world; ++r) {
        const models::ParallelLayout l{world, r, ep};
        all[static_cast<std::size_t>(r)] = r;
        ep_members[static_cast<std::size_t>(l.ep_group())][static_cast<std::size_t>(l.ep_rank())] = r;
        dp_members[static_cast<std::size_t>(l.ep_rank())][static_cast<std::size_t>(l.ep_group())] = r;
    }
    emu_world_ = EmuGroup::create(topology, all);
    for (auto& m : ep_members) emu_ep_.push_back(EmuGroup::create(topology, m));
    for (auto& m : dp_members) emu_expert_dp_.push_back(EmuGroup::create(topology, m));
}

RankComms LocalTrainGroups::rank_comms(int rank) {
    const models::ParallelLayout l{world_, rank, ep_};
    l.validate();
    RankComms r;
    if (emu_world_) {
        r.owned.push_back(emu_world_->communicator(rank));
        r.owned.push_back(emu_ep_[static_cast<std::size_t>(l.ep_group())]->communicator(l.ep_rank()));
        r.owned.push_back(emu_expert_dp_[static_cast<std::size_t>(l.ep_rank())]->communicator(l.ep_group()));
        return r;
    }
    const std::optional<LinkModel> dense_link = scope_ == LinkScope::kAll ? link_ : std::nullopt;
    r.owned.push_back(behind(world_group_->communicator(rank), dense_link));
    r.owned.push_back(behind(ep_groups_[static_cast<std::size_t>(l.ep_group())]->communicator(l.ep_rank()), link_));
    r.owned.push_back(
        behind(expert_dp_groups_[static_cast<std::size_t>(l.ep_rank())]->communicator(l.ep_group()), dense_link));
    return r;
}

void LocalTrainGroups::abandon(int rank, const std::string& why) {
    const models::ParallelLayout l{world_, rank, ep_};
    l.validate();
    if (emu_world_) {
        emu_world_->abandon(rank, why);
        emu_ep_[static_cast<std::size_t>(l.ep_group())]->abandon(l.ep_rank(), why);
        emu_expert_dp_[static_cast<std::size_t>(l.ep_rank())]->abandon(l.ep_group(), why);
        return;
    }
    world_group_->abandon(rank, why);
    ep_groups_[static_cast<std::size_t>(l.ep_group())]->abandon(l.ep_rank(), why);
    expert_dp_groups_[static_cast<std::size_t>(l.ep_rank())]->abandon(l.ep_group(), why);
}

void run_local_ranks(LocalTrainGroups& groups, int world, const std::function<void(int, const RankComms&)>& fn) {
    std::vector<std::string> errors(static_cast<std::size_t>(world));
    std::vector<bool> comm_error(static_cast<std::size_t>(world), false);
    std::vector<std::chrono::steady_clock::time_point> failed_at(static_cast<std::size_t>(world));
    std::vector<std::thread> threads;
    for (int r = 0; r < world; ++r) {
        std::function<void()> body = [&, r] {
            try {
                const RankComms comms = groups.rank_comms(r);
                fn(r, comms);
            } catch (const std::exception& e) {
                failed_at[static_cast<std::size_t>(r)] = std::chrono::steady_clock::now();
                // std::bad_alloc says only "std::bad_alloc": say what ran out.
                errors[static_cast<std::size_t>(r)] =
                    dynamic_cast<const std::bad_alloc*>(&e) != nullptr
                        ? "out of host memory: an allocation failed (std::bad_alloc); make the model, --batch or "
                          "--ranks smaller"
                        : e.what();
                comm_error[static_cast<std::size_t>(r)] = dynamic_cast<const CommError*>(&e) != nullptr;
                groups.abandon(r, e.what());
            }
        };
        try {
            threads.emplace_back(std::move(body));
        } catch (const std::system_error& e) {
            // Out of threads: the ranks started would wait for this one in their collectives, so every
            // rank not started leaves its groups (theirs then fail at once) before the started end.
            const std::string why = "cannot start in-process rank " + std::to_string(r) + " of " +
                                    std::to_string(world) + " (a thread): " + e.what();
            for (int q = r; q < world; ++q) groups.abandon(q, why);
            for (auto& t : threads) t.join();
            throw Error(why + "; run fewer --ranks, or one process per rank under mpirun");
        }
    }
    for (auto& t : threads) t.join();
    // The cause: the rank that failed first other than by a CommError (its peers' collectives then
    // fail or time out), else the rank that failed first.
    int cause = -1;
    for (int r = 0; r < world; ++r) {
        const auto i = static_cast<std::size_t>(r);
        if (errors[i].empty()) continue;
        const auto c = static_cast<std::size_t>(cause);
        if (cause < 0 || (comm_error[c] && !comm_error[i]) ||
            (comm_error[c] == comm_error[i] && failed_at[i] < failed_at[c]))
            cause = r;
    }
    if (cause >= 0) throw Error("rank " + std::to_string(cause) + ": " + errors[static_cast<std::size_t>(cause)]);
}

#if SCMOE_WITH_MPI
RankComms mpi_rank_comms(const models::ParallelLayout& layout, Device& device, [[maybe_unused]] int cuda_device,
                         std::optional<LinkModel> link, LinkScope scope) {
    layout.validate();
    MPI_Comm ep_comm = MPI_COMM_NULL, expert_dp_comm = MPI_COMM_NULL;
    MPI_Comm_split(MPI_COMM_WORLD, layout.ep_group(), layout.ep_rank(), &ep_comm);
    MPI_Comm_split(MPI_COMM_WORLD, layout.ep_rank(), layout.ep_group(), &expert_dp_comm);
    auto make = [&](MPI_Comm comm) -> std::shared_ptr<Communicator> {
        if (device.backend() == Backend::kCuda) {
#if SCMOE_WITH_CUDA
            return NcclCommunicator::from_mpi(comm, cuda_device);
#else
            SCMOE_FAIL("a CUDA device in a build without CUDA");
#endif
        }
        return std::make_shared<MpiCommunicator>(comm);
    };
    RankComms r;
    try {
        const std::optional<LinkModel> dense_link = scope == LinkScope::kAll ? link : std::nullopt;
        r.owned.push_back(behind(make(MPI_COMM_WORLD), dense_link));
        r.owned.push_back(behind(make(ep_comm), link));
        r.owned.push_back(behind(make(expert_dp_comm), dense_link));
    } catch (...) {
        MPI_Comm_free(&ep_comm);
        MPI_Comm_free(&expert_dp_comm);
        throw;
    }
    // The communicators hold duplicates (MpiCommunicator) or their own NCCL communicators.
    MPI_Comm_free(&ep_comm);
    MPI_Comm_free(&expert_dp_comm);
    return r;
}
#endif

}  // namespace scmoe::launch
