#include "scmoe/models/parallel.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "scmoe/comm/communicator.h"
#include "scmoe/kernels/adamw.h"
#include "scmoe/kernels/elementwise.h"
#include "scmoe/kernels/error.h"
#include "scmoe/moe/trace.h"

namespace scmoe::models {

std::vector<std::string> gather_strings(Communicator* world, const std::string& mine, Device& device, Stream& stream) {
    if (!world || world->size() == 1) return {mine};
    constexpr std::size_t kSlot = 4096;  // bytes per rank, a multiple of 4 (sent as i32 words)
    const auto n = static_cast<std::size_t>(world->size());
    DeviceBuffer buffer(device, kSlot * n);
    std::vector<char> own(kSlot, 0), all(kSlot * n);
    std::memcpy(own.data(), mine.data(), std::min(mine.size(), kSlot - 1));
    char* slots = static_cast<char*>(buffer.data());
    char* own_slot = slots + kSlot * static_cast<std::size_t>(world->rank());
    stream.copy(own_slot, own.data(), kSlot);
    world->all_gather(own_slot, static_cast<std::int64_t>(kSlot / 4), slots, DType::kI32, stream);
    stream.copy(all.data(), slots, all.size());
    stream.synchronize();
    std::vector<std::string> out(n);
    for (std::size_t r = 0; r < n; ++r)
        out[r] = std::string(all.data() + r * kSlot, strnlen(all.data() + r * kSlot, kSlot));
    return out;
}


void check_same_on_every_rank(Communicator* world, const std::vector<std::pair<std::string, std::string>>& fields,
                              const std::string& what, Device& device, Stream& stream) {
    if (!world || world->size() == 1) return;
    std::string mine;  // "name=value\n" per field
    for (const auto& [name, value] : fields) mine += name + "=" + value + "\n";
    SCMOE_CHECK(mine.size() < 4096, what << ": " << mine.size() << " bytes of settings to agree on (at most 4095)");
    const std::vector<std::string> all = gather_strings(world, mine, device, stream);
    auto parse = [](const std::string& text) {
        std::vector<std::pair<std::string, std::string>> out;
        std::istringstream in(text);
        for (std::string line; std::getline(in, line);) {
            const auto eq = line.find('=');
            out.emplace_back(line.substr(0, eq), eq == std::string::npos ? "" : line.substr(eq + 1));
        }
        return out;
    };
    const auto first = parse(all[0]);
    std::string differences;
    for (std::size_t r = 1; r < all.size(); ++r) {
        if (all[r] == all[0]) continue;
        const auto theirs = parse(all[r]);
        std::string fields_differing;
        for (std::size_t i = 0; i < std::max(first.size(), theirs.size()); ++i) {
            const std::string name = i < first.size() ? first[i].first : theirs[i].first;
            const std::string a = i < first.size() ? first[i].second : "(none)";
            const std::string b = i < theirs.size() ? theirs[i].second : "(none)";
            if (a != b) fields_differing += (fields_differing.empty() ? "" : ", ") + name + " " + b + " (rank 0: " + a + ")";
        }
        differences += (differences.empty() ? "" : "; ") + ("rank " + std::to_string(r) + " has " + fields_differing);
    }
    SCMOE_CHECK(differences.empty(), what << ": the ranks disagree: " << differences
                                          << " (every rank must be started with the same settings)");
}

void ParallelLayout::validate() const {
    SCMOE_CHECK(world > 0 && rank >= 0 && rank < world, "parallel layout: rank " << rank << " of world " << world);
    SCMOE_CHECK(ep > 0 && world % ep == 0, "parallel layout: world size " << world
                                                                         << " is not divisible by the expert-parallel size "
                                                                         << ep << " (dp x ep must equal the world)");
}

std::string ParallelLayout::describe() const {
    std::ostringstream o;
    o << "rank " << rank << " of " << world << ": dp " << dp() << " x ep " << ep << " (replica " << ep_group()
      << ", expert slice " << ep_rank() << ")";
    return o.str();
}

namespace {

void check_comm(Communicator* c, int size, int rank, const char* what) {
    if (size == 1 && !c) return;
    SCMOE_CHECK(c, "GradientReducer: the " << what << " communicator is missing (group size " << size << ")");
    SCMOE_CHECK(c->size() == size && c->rank() == rank, "GradientReducer: the " << what << " communicator is "
                                                                                << c->name() << ", expected rank "
                                                                                << rank << " of " << size);
}

}  // namespace

GradientReducer::GradientReducer(LanguageModel& model, const ParallelLayout& layout, TrainComms comms, Device& device,
                                 DType wire)
    : model_(model), layout_(layout), comms_(comms), device_(device), wire_(wire),
      stream_(device.create_stream(StreamPriority::kHigh)) {  // communication only: ahead of the backward's kernels
    layout_.validate();
    SCMOE_CHECK(wire == DType::kF32 || wire == DType::kBF16,
                "GradientReducer: gradients travel in f32 or bf16, not " << dtype_name(wire));
    check_comm(comms_.world, layout_.world, layout_.rank, "world");
    check_comm(comms_.ep, layout_.ep, layout_.ep_rank(), "expert-parallel");
    check_comm(comms_.expert_dp, layout_.dp(), layout_.ep_group(), "expert-data-parallel");
    // Runs: maximal stretches of adjacent tensors of one kind and stage, in group order (the same
    // on every rank).
    for (const ParamGroup& g : model_.param_groups()) {
        for (const NamedTensor& t : g.tensors) {
            const std::int64_t n = t.numel();
            float* p = g.grads + t.offset;
            Run* last = runs_.empty() ? nullptr : &runs_.back();
            if (last && last->expert == t.expert && last->stage == t.grads_stage && last->grads + last->count == p) {
                last->count += n;
            } else {
                Communicator* c = t.expert ? comms_.expert_dp : comms_.world;
                runs_.push_back({p, n, t.expert, t.grads_stage, c && c->size() > 1 ? c : nullptr});
            }
        }
    }
    const int stages = model_.num_grads_stages();
    for (int i = 0; i < stages; ++i) stage_ready_.push_back(device.create_event());
    done_ = device.create_event();
    issued_.assign(static_cast<std::size_t>(stages), 0);
    scratch_ = DeviceBuffer(device, sum_of_squares_scratch_bytes() + runs_.size() * sizeof(float));
    std::int64_t largest = 0;
    for (const Run& r : runs_)
        if (r.comm) largest = std::max(largest, r.count);
    if (wire_ != DType::kF32 && largest > 0)
        staging_ = DeviceBuffer(device, static_cast<std::size_t>(largest) * dtype_size(wire_));
}

GradientReducer::~GradientReducer() {
    try {
        stream_->synchronize();
    } catch (const std::exception&) {
    }
}

void GradientReducer::reduce_stage(int stage, Stream& s, Tracer* trace, const char* lane) {
    auto run = [this, stage](Stream& r) {
        for (const Run& x : runs_) {
            if (x.stage != stage || !x.comm) continue;
            if (wire_ == DType::kF32) {
                x.comm->all_reduce_sum(x.grads, x.count, DType::kF32, r);
                continue;
            }
            convert(x.grads, DType::kF32, staging_.data(), wire_, x.count, r);
            x.comm->all_reduce_sum(staging_.data(), x.count, wire_, r);
            convert(staging_.data(), wire_, x.grads, DType::kF32, x.count, r);
        }
    };
    const bool sends =
        std::any_of(runs_.begin(), runs_.end(), [stage](const Run& x) { return x.stage == stage && x.comm; });
    if (sends)  // a stage with nothing to send (one rank) leaves no entry
        run_op(trace, "grad_allreduce[stage" + std::to_string(stage) + "]", lane, s, run, true);
    else
        run(s);
}

LanguageModel::GradsReadyFn GradientReducer::grads_ready(Tracer* trace) {
    issued_.assign(issued_.size(), 0);  // a new backward (an earlier one may have failed half way)
    return [this, trace](int stage, Stream& s) {
        SCMOE_CHECK(stage >= 0 && stage < static_cast<int>(issued_.size()),
                    "GradientReducer: gradient stage " << stage << " of " << issued_.size());
        ++issued_[static_cast<std::size_t>(stage)];
        Event& ready = *stage_ready_[static_cast<std::size_t>(stage)];
        ready.record(s);
        stream_->wait(ready);
        reduce_stage(stage, *stream_, trace, "grad_reduce");
    };
}

void GradientReducer::finish() {
    for (std::size_t i = 0; i < issued_.size(); ++i)
        SCMOE_CHECK(issued_[i] == 1, "GradientReducer.finish: gradient stage " << i << " was reduced " << issued_[i]
                                                                              << " times (expected once per backward)");
    issued_.assign(issued_.size(), 0);
    done_->record(*stream_);
    model_.stream().wait(*done_);
}

void GradientReducer::reduce(Tracer* trace) {
    for (int stage = 0; stage < static_cast<int>(issued_.size()); ++stage)
        reduce_stage(stage, model_.stream(), trace, "backbone");
}

float GradientReducer::global_norm() {
    Stream& s = model_.stream();
    float* sums = reinterpret_cast<float*>(static_cast<char*>(scratch_.data()) + sum_of_squares_scratch_bytes());
    // Expert sums first, contiguous, so one all-reduce over the ep group adds the other slices' parts.
    std::vector<const Run*> order;
    for (const Run& r : runs_)
        if (r.expert) order.push_back(&r);
    const auto experts = static_cast<std::int64_t>(order.size());
    for (const Run& r : runs_)
        if (!r.expert) order.push_back(&r);
    for (std::size_t i = 0; i < order.size(); ++i) sum_of_squares(order[i]->grads, order[i]->count, sums + i, scratch_.data(), s);
    if (experts > 0 && comms_.ep && comms_.ep->size() > 1) comms_.ep->all_reduce_sum(sums, experts, DType::kF32, s);
    std::vector<float> host(order.size());
    s.copy(host.data(), sums, host.size() * sizeof(float));
    model_.blocks().synchronize();
    double total = 0;
    for (float v : host) total += v;
    return static_cast<float>(std::sqrt(total));
}

}  // namespace scmoe::models
