// BlockStack under mpirun: every rank runs the expert-parallel stack over an MpiCommunicator and
// checks (1) overlap on and off give bitwise identical outputs and gradients, (2) every rank chose
// the same expert slots, (3) its results equal the single-rank stack on its tokens (fp32, relative
// 1e-5; experts' gradients summed over ranks), and (4) with 8 experts, the chunked a2a/expert
// pipeline (every chunk count) gives bitwise the unchunked results. Rank 0 prints "N passed, M failed".
#include <mpi.h>

#include <cstdio>
#include <exception>
#include <memory>
#include <string>

#include "block_test_util.h"
#include "scmoe/comm/mpi_communicator.h"
#include "mpi_cases.h"

namespace {

using scmoe::testing::StackResult;

std::string run_case(const std::string& variant, int rank, int world, scmoe::Communicator& comm) {
    const scmoe::BlockStackConfig config = scmoe::testing::small_variant(variant, scmoe::DispatchMode::kDropless);
    const std::int64_t T = 8, H = config.backbone.hidden;
    std::vector<StackResult> refs;
    for (int r = 0; r < world; ++r) {
        auto device = scmoe::make_device("cpu");
        scmoe::BlockStack single(config, *device, T);
        scmoe::testing::init_params(single, 9);
        refs.push_back(scmoe::testing::run_stack(single, scmoe::testing::make_input(T, H, 30 + static_cast<std::uint64_t>(r)),
                                                 scmoe::testing::make_input(T, H, 40 + static_cast<std::uint64_t>(r)), false));
        const std::string unwritten = scmoe::testing::unwritten(refs.back());
        if (!unwritten.empty()) return "single-rank reference " + std::to_string(r) + ": " + unwritten;
    }
    // Overlap off and on each on a stack of its own (issue 28; run_stack starts outputs and
    // gradients as NaN): nothing the overlapped run skips can come from the other run.
    auto device = scmoe::make_device("cpu");
    scmoe::BlockStack off_stack(config, *device, T, &comm), stack(config, *device, T, &comm);
    scmoe::testing::init_params(off_stack, 9, world, rank);
    scmoe::testing::init_params(stack, 9, world, rank);
    const auto x = scmoe::testing::make_input(T, H, 30 + static_cast<std::uint64_t>(rank));
    const auto gy = scmoe::testing::make_input(T, H, 40 + static_cast<std::uint64_t>(rank));
    const StackResult off = scmoe::testing::run_stack(off_stack, x, gy, false);
    std::string e = scmoe::testing::unwritten(off);
    if (!e.empty()) return "overlap off: " + e;
    const StackResult on = scmoe::testing::run_stack(stack, x, gy, true, true);
    e = scmoe::testing::bitwise_diff(on, off);
    if (!e.empty()) return "overlap on vs off: " + e;
    // Same slots everywhere: gather rank 0's and compare.
    std::vector<int> slots;
    for (const auto& b : stack.forward_schedule().branches) slots.push_back(b.slot);
    for (const auto& b : stack.backward_schedule().branches) slots.push_back(b.slot);
    std::vector<int> root = slots;
    MPI_Bcast(root.data(), static_cast<int>(root.size()), MPI_INT, 0, MPI_COMM_WORLD);
    if (root != slots) return "rank " + std::to_string(rank) + " chose different expert slots from rank 0";
    const StackResult& ref = refs[static_cast<std::size_t>(rank)];
    const auto n = static_cast<std::int64_t>(on.out.size());
    e = scmoe::testing::compare(on.out.data(), ref.out.data(), n, 1e-5, "output");
    if (e.empty()) e = scmoe::testing::compare(on.grad_in.data(), ref.grad_in.data(), n, 1e-5, "grad_input");
    if (e.empty())
        e = scmoe::testing::compare(on.backbone_grads.data(), ref.backbone_grads.data(),
                                    static_cast<std::int64_t>(on.backbone_grads.size()), 1e-5, "backbone grads");
    for (std::size_t m = 0; e.empty() && m < on.moe_grads.size(); ++m) {
        std::vector<const float*> all;
        for (const StackResult& r : refs) all.push_back(r.moe_grads[m].data());
        e = scmoe::testing::compare_ep_grads(config.moe, world, rank, on.moe_grads[m].data(), all,
                                             ref.moe_grads[m].data(), 1e-5, "moe grad ");
    }
    return e;
}

// 8 experts (2 or 4 local per rank): forced chunk counts 2..local, overlap on and off, bitwise
// equal to chunks = 1.
std::string run_chunk_case(const std::string& variant, int rank, int world, scmoe::Communicator& comm) {
    scmoe::MoeConfig moe = scmoe::testing::small_moe(scmoe::DispatchMode::kDropless);
    moe.num_experts = 8;
    const scmoe::BlockStackConfig config = scmoe::block_variant(variant, scmoe::testing::small_backbone(), moe, true, 3);
    const std::int64_t T = 8, H = config.backbone.hidden;
    auto device = scmoe::make_device("cpu");
    // The reference and every candidate on a stack of its own (issue 28).
    auto fresh_stack = [&](int chunks) {
        auto stack = std::make_unique<scmoe::BlockStack>(config, *device, T, &comm);
        scmoe::testing::init_params(*stack, 9, world, rank);
        stack->set_expert_chunks(chunks);
        return stack;
    };
    const auto x = scmoe::testing::make_input(T, H, 30 + static_cast<std::uint64_t>(rank));
    const auto gy = scmoe::testing::make_input(T, H, 40 + static_cast<std::uint64_t>(rank));
    const StackResult ref = scmoe::testing::run_stack(*fresh_stack(1), x, gy, false);
    const std::string unwritten = scmoe::testing::unwritten(ref);
    if (!unwritten.empty()) return "the reference (1 chunk, overlap off): " + unwritten;
    for (int chunks = 2; chunks <= moe.num_experts / world; ++chunks) {
        for (bool overlap : {false, true}) {
            const std::string e =
                scmoe::testing::bitwise_diff(scmoe::testing::run_stack(*fresh_stack(chunks), x, gy, overlap), ref);
            if (!e.empty()) return std::to_string(chunks) + " chunks, overlap " + (overlap ? "on" : "off") + ": " + e;
        }
    }
    return "";
}

}  // namespace

int main(int argc, char** argv) {
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    int world = 0, rank = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    const std::vector<std::string> variants = scmoe::block_variant_names();
    std::vector<std::string> names = variants;
    for (const std::string& v : variants) names.push_back(v + " chunked");
    const int failed = scmoe::testing::run_mpi_cases(
        names,
        [&](std::size_t i) {
            scmoe::MpiCommunicator comm(MPI_COMM_WORLD);
            return i < variants.size() ? run_case(variants[i], rank, world, comm)
                                       : run_chunk_case(variants[i - variants.size()], rank, world, comm);
        },
        "BlockStack over MpiCommunicator");
    MPI_Finalize();
    return failed ? 1 : 0;
}
