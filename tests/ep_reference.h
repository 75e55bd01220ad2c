// Expert-parallel equivalence harness shared by the in-process (LocalCommunicator) and the mpirun
// tests: every world rank's inputs and the full parameter set are generated from seeds, so any rank
// can compute the single-rank reference for any other rank.
#pragma once

#include <cmath>
#include <string>
#include <vector>

#include "test_util.h"

namespace scmoe::testing {

struct EpCase {
    std::string name;
    int dp = 1, ep = 2;
    int top_k = 2;
    DispatchMode dispatch = DispatchMode::kCapacity;
    std::vector<std::int64_t> tokens;  // per world rank (world = dp * ep); zero allowed
    bool shared = false;
    int experts = 8;  // global experts (experts == ep: one local expert per rank)
};

inline MoeConfig ep_config(const EpCase& c) {
    MoeConfig m;
    m.hidden = 8;
    m.ffn = 12;
    m.num_experts = c.experts;
    m.top_k = c.top_k;
    m.dispatch = c.dispatch;
    m.capacity_factor = 1.0f;  // capacity mode drops some assignments: drops must match too
    m.shared_expert = c.shared;
    m.coefficient_gate = c.shared;
    m.aux_loss_coef = 0.1f;
    m.z_loss_coef = 0.05f;
    return m;
}

inline std::int64_t max_tokens_of(const EpCase& c) {
    std::int64_t m = 0;
    for (std::int64_t t : c.tokens) m = std::max(m, t);
    return m;
}

// Single-rank results of one world rank's tokens with the full expert set.
struct RankReference {
    std::vector<float> y, grad_x, grads;  // grads: MoeParamStore order, all E experts
    std::int64_t dropped = 0;
};

inline constexpr std::uint64_t kParamSeed = 77;
inline std::uint64_t input_seed(int world_rank) { return 1000 + 10 * static_cast<std::uint64_t>(world_rank); }

inline RankReference single_rank_reference(const EpCase& c, int world_rank) {
    const MoeConfig config = ep_config(c);
    const std::int64_t T = c.tokens[static_cast<std::size_t>(world_rank)];
    CpuLayerHarness h(config, T, false, kParamSeed);
    fill_uniform(h.x.data(), static_cast<std::int64_t>(h.x.size()), 1.0f, input_seed(world_rank));
    fill_uniform(h.grad_y.data(), static_cast<std::int64_t>(h.grad_y.size()), 1.0f, input_seed(world_rank) + 1);
    fill_nan(h.y);
    fill_nan(h.grad_x);
    fill_nan(h.grads);
    h.forward();
    h.backward();
    RankReference r;
    r.y = h.y;
    r.grad_x = h.grad_x;
    const auto* g = static_cast<const float*>(h.grads.data());
    r.grads.assign(g, g + h.grads.numel());
    for (const std::vector<float>* v : {&r.y, &r.grad_x, &r.grads})
        SCMOE_CHECK(first_nan(*v) < 0, "the single-rank reference of world rank "
                                           << world_rank << " left an output or gradient unwritten (NaN)");
    r.dropped = h.layer.stats(*h.stream).dropped_tokens;
    return r;
}

// The full parameters, from the same seed the reference uses.
inline std::vector<float> full_params(const MoeConfig& config) {
    auto device = make_device("cpu");
    MoeParamStore store(*device, config, DType::kF32);
    fill_uniform(static_cast<float*>(store.data()), store.numel(), 0.5f, kParamSeed);
    const auto* p = static_cast<const float*>(store.data());
    return std::vector<float>(p, p + store.numel());
}

// Copies this ep rank's slice of the full parameters (or gradients) into `local`; with
// `sum_over` the expert slices are summed over the given full gradient sets (the reference of an
// expert's gradient in expert parallelism is the sum over the ranks that feed it).
inline void slice_params(const MoeConfig& config, int ep, int ep_rank, const std::vector<const float*>& full,
                         float* local) {
    const auto full_specs = moe_param_specs(config, 1);
    const auto local_specs = moe_param_specs(config, ep);
    std::int64_t full_off = 0, local_off = 0;
    for (std::size_t i = 0; i < full_specs.size(); ++i) {
        const std::int64_t n_local = local_specs[i].numel();
        const bool expert = full_specs[i].name == "expert_w1" || full_specs[i].name == "expert_w2";
        const std::int64_t start = expert ? ep_rank * n_local : 0;
        for (std::int64_t j = 0; j < n_local; ++j) {
            double acc = 0;
            for (const float* f : full) acc += f[full_off + start + j];
            local[local_off + j] = static_cast<float>(acc);
        }
        full_off += full_specs[i].numel();
        local_off += n_local;
    }
}

// max |a - b| <= tol * max(1, max |b|); returns a message naming the first bad element, or "".
// A NaN on either side is a mismatch (an output a run left NaN-filled must not pass).
inline std::string compare(const float* a, const float* b, std::int64_t n, double tol, const std::string& what) {
    double scale = 1.0;
    for (std::int64_t i = 0; i < n; ++i) scale = std::max(scale, static_cast<double>(std::abs(b[i])));
    for (std::int64_t i = 0; i < n; ++i)
        if (!(std::abs(static_cast<double>(a[i]) - b[i]) <= tol * scale))
            return what + "[" + std::to_string(i) + "] = " + std::to_string(a[i]) + ", single-rank " +
                   std::to_string(b[i]);
    return "";
}

// Compares an expert-parallel rank's MoE gradients (`got`, this rank's MoeParamStore layout) with
// single-rank references in the full layout: the expert slices against the sum over `replica_refs`
// (every rank whose tokens feed these experts), every other parameter against `own_ref` (this
// rank's tokens alone). Returns "" or the first mismatch, named `prefix` + parameter.
inline std::string compare_ep_grads(const MoeConfig& config, int ep, int ep_rank, const float* got,
                                    const std::vector<const float*>& replica_refs, const float* own_ref, double tol,
                                    const std::string& prefix) {
    const auto specs = moe_param_specs(config, ep);
    std::int64_t numel = 0;
    for (const ParamSpec& s : specs) numel += s.numel();
    std::vector<float> summed(static_cast<std::size_t>(numel)), own(summed.size());
    slice_params(config, ep, ep_rank, replica_refs, summed.data());
    slice_params(config, ep, ep_rank, {own_ref}, own.data());
    std::int64_t off = 0;
    for (const ParamSpec& s : specs) {
        const bool expert = s.name == "expert_w1" || s.name == "expert_w2";
        if (s.numel()) {
            std::string err = compare(got + off, (expert ? summed : own).data() + off, s.numel(), tol, prefix + s.name);
            if (!err.empty()) return err;
        }
        off += s.numel();
    }
    return "";
}

// Runs one world rank of the case on `ep_comm` and returns the mismatches against the references
// ("" when everything matches). refs: the references of every world rank.
inline std::string run_ep_rank(const EpCase& c, int world_rank, Communicator& ep_comm,
                               const std::vector<RankReference>& refs, double tol) {
    const MoeConfig config = ep_config(c);
    const int ep_rank = ep_comm.rank(), replica = world_rank / c.ep;
    const std::int64_t T = c.tokens[static_cast<std::size_t>(world_rank)], H = config.hidden;
    auto device = make_device("cpu");
    auto stream = device->create_stream();
    MoeLayer layer(config, *device, max_tokens_of(c), &ep_comm);
    MoeParamStore params(*device, config, DType::kF32, c.ep), grads(*device, config, DType::kF32, c.ep);
    const std::vector<float> full = full_params(config);
    slice_params(config, c.ep, ep_rank, {full.data()}, static_cast<float*>(params.data()));
    // Outputs and gradients start as NaN (issue 28): what the distributed layer skips shows.
    std::vector<float> x(static_cast<std::size_t>(T * H)), gy(x.size()), y(x.size(), kUnwritten), gx(x.size(), kUnwritten);
    fill_nan(grads);
    fill_uniform(x.data(), T * H, 1.0f, input_seed(world_rank));
    fill_uniform(gy.data(), T * H, 1.0f, input_seed(world_rank) + 1);
    layer.forward(host_tensor(x, T, H), Tensor(), params.view(), host_tensor(y, T, H), *stream);
    layer.backward(host_tensor(gy, T, H), params.view(), grads.view(), host_tensor(gx, T, H), Tensor(), *stream);
    stream->synchronize();
    const RankReference& ref = refs[static_cast<std::size_t>(world_rank)];
    std::string err = compare(y.data(), ref.y.data(), T * H, tol, "y");
    if (err.empty()) err = compare(gx.data(), ref.grad_x.data(), T * H, tol, "grad_x");
    if (err.empty() && layer.stats(*stream).dropped_tokens != ref.dropped)
        err = "dropped " + std::to_string(layer.stats(*stream).dropped_tokens) + " vs single-rank " +
              std::to_string(ref.dropped);
    std::vector<const float*> replica_refs;
    for (int r = 0; r < c.ep; ++r) replica_refs.push_back(refs[static_cast<std::size_t>(replica * c.ep + r)].grads.data());
    if (err.empty())
        err = compare_ep_grads(config, c.ep, ep_rank, static_cast<const float*>(grads.data()), replica_refs,
                               ref.grads.data(), tol, "grad ");
    return err.empty() ? "" : "world rank " + std::to_string(world_rank) + " (" + c.name + "): " + err;
}

}  // namespace scmoe::testing
