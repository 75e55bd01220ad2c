// scmoe-bench block: the ScMoE configurations side by side on a [dense, MoE] block pair (or the
// every-block layout), each run by the LayerScheduler with its overlap, on N expert-parallel ranks
// (in-process threads, or processes under mpirun) behind an optional emulated link.
//
// One row per token count per rank (--tokens, or the -b/-e/-f sweep) and variant: forward time,
// train-step (forward + backward) time, the backbone compute and a2a times measured op by op during
// calibration (serially, a synchronize after every op), the chosen expert slots K and pipeline chunks
// (--chunks: auto or forced), the speedup vs top-2 at the same token count, and three measures of the
// communication left on the critical path:
//   exposed        from traces of -n further steps (each after a barrier): the time in which an
//                  all-to-all runs and no compute runs on a rank (summarize_overlap) / its step span;
//   beyond_serial  max(0, step - (serial - a2a)) / step: the step beyond its compute measured op by
//                  op (this also counts the ranks' contention for shared cores);
//   link_cost      max(0, step - the same step with the emulated link off) / step.
// The variants' timed steps are interleaved, each started after a barrier. Times are the slowest
// rank's mean; exposed is the mean over the ranks, exposed_max the largest rank's share.
// --comm-share X first measures the top-2 MoE layer on this machine (at the first token count) and
// sets the link bandwidth so its a2a takes the fraction X of the MoE layer time; a sweep keeps that link.
// Check (#wrong): outputs (and input gradients with --mode train) of overlap on vs off, bitwise.
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <iostream>
#include <memory>
#include <optional>
#include <thread>

#include "launch/emu_stack.h"
#include "benches.h"
#include "block_args.h"
#include "scmoe/comm/comm_sms.h"
#include "scmoe/comm/emu_communicator.h"
#include "scmoe/comm/emulated_link.h"
#include "scmoe/comm/local_communicator.h"
#include "common.h"
#include "scmoe/kernels/emu/emu_device.h"
#include "scmoe/kernels/error.h"
#include "launch/local_rank.h"
#include "scmoe/moe/block_stack.h"
#include "scmoe/moe/trace.h"
#include "multi_rank.h"
#include "report.h"
#if SCMOE_WITH_MPI
#include "scmoe/comm/mpi_communicator.h"
#endif

namespace scmoe::bench {
namespace {

struct VariantResult {
    double fwd_ms = 0, train_ms = 0, backbone_ms = 0, a2a_ms = 0, serial_ms = 0, slot = -1, wrong = 0;
    double fwd_chunks = 0, bwd_chunks = 0;  // the first MoE branch's pipeline pieces (0: no MoE branch)
    double fwd_nolink_ms = 0, train_nolink_ms = 0;  // the same steps with the emulated link switched off
    double exposed_us = 0, traced_us = 0;  // traced steps: exposed communication and span, summed
    double backbone_idle_us = 0;           // traced steps: the backbone stream's idle time, mean per step
    static constexpr int kPacked = 14;
    void pack(double* d) const {
        d[0] = fwd_ms, d[1] = train_ms, d[2] = backbone_ms, d[3] = a2a_ms, d[4] = serial_ms, d[5] = slot, d[6] = wrong;
        d[7] = fwd_chunks, d[8] = bwd_chunks, d[9] = fwd_nolink_ms, d[10] = train_nolink_ms;
        d[11] = exposed_us, d[12] = traced_us, d[13] = backbone_idle_us;
    }
    double exposed_pct() const { return traced_us > 0 ? 100.0 * exposed_us / traced_us : 0.0; }
    static VariantResult unpack(const double* d) {
        return {d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7], d[8], d[9], d[10], d[11], d[12], d[13]};
    }
};

struct RankOutput {
    std::vector<VariantResult> results;  // [token count][variant]: index t * variants + v
    std::vector<std::string> notes;      // rank 0: link calibration, chosen schedules, emulator figures
};

std::string comma_list(const std::vector<std::int64_t>& values) {
    std::string text;
    for (const std::int64_t v : values) text += (text.empty() ? "" : ",") + std::to_string(v);
    return text;
}

// Element-wise mean over the ranks of `comm` (device memory for the collective).
std::vector<double> mean_over_ranks(Communicator* comm, Device& device, Stream& stream, const std::vector<double>& v) {
    if (!comm || comm->size() == 1) return v;
    std::vector<float> f(v.begin(), v.end());
    DeviceBuffer scratch(device, f.size() * sizeof(float));
    all_reduce_sum_host(*comm, f.data(), static_cast<std::int64_t>(f.size()), scratch.data(), stream);
    std::vector<double> out(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) out[i] = static_cast<double>(f[i]) / comm->size();
    return out;
}

BlockStackConfig variant_config(const BlockArgs& a, const std::string& name, DType dtype) {
    BackboneShape s;
    s.hidden = a.hidden;
    s.heads = a.heads;
    s.kv_heads = a.kv_heads;
    s.seq_len = a.seq;
    s.causal = !a.bidirectional;
    s.ffn = a.ffn;
    s.activation = a.activation;
    s.dtype = dtype;
    MoeConfig m;
    m.hidden = a.hidden;
    m.ffn = a.ffn;
    m.num_experts = a.experts;
    m.dispatch = a.dispatch;
    m.activation = a.activation;
    m.capacity_factor = a.capacity_factor;
    m.dtype = dtype;
    return block_variant(name, s, m, a.coefficient_gate, a.blocks);
}

// One rank's stack with deterministic parameters and inputs.
struct RankStack {
    std::unique_ptr<BlockStack> stack;
    DeviceBuffer x, gy, out, gx;
    RankStack(const BlockStackConfig& c, Device& device, Stream& stream, std::int64_t T, Communicator* comm, int rank,
              int chunks = 0, IssueOrder order = IssueOrder::kBackboneAhead, int comm_sms = -1) {
        stack = std::make_unique<BlockStack>(c, device, T, comm);
        stack->set_expert_chunks(chunks);
        stack->set_issue_order(order);
        if (comm_sms >= 0) stack->set_comm_sms(comm_sms);
        const ParamSet& p = stack->backbone_params();
        for (std::size_t i = 0; i < p.specs().size(); ++i)
            upload_uniform(device, stream, p[i].data, p[i].dtype, p[i].numel(), 0.05f, 100 + i);
        for (const auto& m : stack->moe_params())
            upload_uniform(device, stream, m->data(), c.moe.dtype, m->numel(), 0.05f, 7 + static_cast<std::uint64_t>(rank));
        const std::int64_t n = T * c.backbone.hidden;
        const std::size_t bytes = static_cast<std::size_t>(n) * dtype_size(c.backbone.dtype);
        x = DeviceBuffer(device, bytes);
        gy = DeviceBuffer(device, bytes);
        out = DeviceBuffer(device, bytes);
        gx = DeviceBuffer(device, bytes);
        upload_uniform(device, stream, x.data(), c.backbone.dtype, n, 1.0f, 1000 + static_cast<std::uint64_t>(rank));
        upload_uniform(device, stream, gy.data(), c.backbone.dtype, n, 1.0f, 2000 + static_cast<std::uint64_t>(rank));
    }
    Tensor t(const DeviceBuffer& b) const {
        const auto& c = stack->config().backbone;
        return Tensor(b.data(), c.dtype, {static_cast<std::int64_t>(b.bytes() / dtype_size(c.dtype)) / c.hidden, c.hidden});
    }
    void step(bool train, bool overlap, Tracer* trace = nullptr) {
        stack->forward(t(x), t(out), overlap, trace);
        if (train) stack->backward(t(gy), t(gx), overlap, trace);
        stack->synchronize();
    }
};

// The host time fn takes, on the device's host clock (the emulated host's on emu).
double elapsed_ms(Device& device, const std::function<void()>& fn) {
    const double t0 = device.host_time_us();
    fn();
    return (device.host_time_us() - t0) / 1000.0;
}

double ms_of(const Schedule& s, double Schedule::Branch::*field) {
    double t = 0;
    for (const auto& b : s.branches) t += b.*field;
    return t;
}

// The link for --comm-share: the top-2 MoE layer's compute per step of `tokens` tokens measured
// without a link, the all-to-all payload per step from an EmulatedLink's model at a huge bandwidth,
// then the bandwidth at which the a2a takes `share` of compute + a2a.
LinkModel calibrate_link(const BlockArgs& a, std::int64_t tokens, Device& device, Stream& stream, Communicator* comm,
                         int rank, std::vector<std::string>& notes) {
    const BlockStackConfig c = variant_config(a, "top2", device.compute_dtype());
    double moe_compute_ms = 0, huge_us = 0;
    {
        RankStack rs(c, device, stream, tokens, comm, rank);
        rs.stack->calibrate(rs.t(rs.x), rs.t(rs.gy), 2);
        for (const Schedule* s : {&rs.stack->forward_schedule(), &rs.stack->backward_schedule()}) {
            if (s == &rs.stack->backward_schedule() && !a.train) break;
            moe_compute_ms += ms_of(*s, &Schedule::Branch::pre_ms) + ms_of(*s, &Schedule::Branch::expert_ms) +
                              ms_of(*s, &Schedule::Branch::post_ms) + ms_of(*s, &Schedule::Branch::consume_ms);
        }
    }
    if (comm) {
        const LinkModel huge{"huge", 1e6, 0.0};
        EmulatedLink probe(*comm, huge);
        RankStack rs(c, device, stream, tokens, &probe, rank);
        probe.reset_counters();
        rs.step(a.train, false);
        huge_us = probe.counters(LinkOp::kAllToAllV).modelled_us;
    }
    const auto agreed = mean_over_ranks(comm, device, stream, {moe_compute_ms, huge_us});
    const double target_ms = a.comm_share / (1.0 - a.comm_share) * agreed[0];
    SCMOE_CHECK(agreed[1] > 0, "--comm-share needs expert parallelism (--ranks > 1 or mpirun): one rank sends nothing");
    LinkModel link{"comm-share", 1e6 * agreed[1] / (1000.0 * target_ms), 0.0};
    char line[256];
    std::snprintf(line, sizeof line,
                  "comm-share %.2f: top-2 MoE compute %.3f ms per %s step of %lld tokens (mean over ranks) -> a2a "
                  "target %.3f ms -> emulated link %.3f GB/s, latency %.1f us%s",
                  a.comm_share, agreed[0], a.train ? "train" : "forward", static_cast<long long>(tokens), target_ms,
                  link.gbps, link.latency_us, a.tokens.size() > 1 ? " (kept for every token count)" : "");
    notes.push_back(line);
    return link;
}

// What one rank's measurements of one token count share: the device, the communicator behind the
// link, and the link itself (switched off and back for link_cost).
struct RankContext {
    const BlockArgs& a;
    const CommonArgs& common;
    Device& device;
    Stream& stream;
    Communicator* ep;       // the communicator the stacks use (behind `wrapped` when there is a link)
    EmulatedLink* wrapped;  // null: no link
    std::optional<LinkModel> link;
    int rank;
};

// Every variant at `tokens` tokens per rank: appends one result per variant to out.results, and on
// rank 0 the chosen schedules to out.notes.
void run_token_count(const RankContext& ctx, std::int64_t tokens, bool first, RankOutput& out) {
    const BlockArgs& a = ctx.a;
    const CommonArgs& common = ctx.common;
    Device& device = ctx.device;
    Stream& stream = ctx.stream;
    Communicator* ep = ctx.ep;
    EmulatedLink* wrapped = ctx.wrapped;
    const int rank = ctx.rank;
    const bool sweep = a.tokens.size() > 1;
    const std::string prefix = sweep ? "tokens " + std::to_string(tokens) + ", " : "";
    auto barrier = [&] {
        if (ep) ep->barrier(stream), stream.synchronize();
    };
    // Every variant's stack, calibrated (slots and chunks chosen) one after the other.
    const std::size_t nv = a.variants.size();
    std::vector<std::unique_ptr<RankStack>> stacks;
    std::vector<VariantResult> results(nv);
    for (std::size_t v = 0; v < nv; ++v) {
        const std::string& name = a.variants[v];
        const BlockStackConfig c = variant_config(a, name, device.compute_dtype());
        stacks.push_back(
            std::make_unique<RankStack>(c, device, stream, tokens, ep, rank, a.chunks, a.issue_order, a.comm_sms));
        RankStack& rs = *stacks.back();
        rs.stack->calibrate(rs.t(rs.x), rs.t(rs.gy), 2);
        if (rank == 0 && v == 0 && first) {
            const int sms = device.sm_count(), r = rs.stack->comm_sms();
            const std::string source = a.comm_sms >= 0 ? "--comm-sms" : default_comm_sms(ep).source;
            out.notes.push_back(
                "SMs for the exchange: R = " + std::to_string(r) + " (" + source + "); backbone ops beside an exchange " +
                (sms > 0 && r > 0 ? "run on " + std::to_string(std::max(1, sms - r)) + " of " + std::to_string(sms) + " SMs"
                                  : "run on every SM (" + std::string(sms > 0 ? "R = 0" : "no SMs: the CPU") + ")"));
        }
        if (rank == 0) {
            std::string text = rs.stack->describe_schedule();
            for (std::size_t p = 0, q; p < text.size(); p = q + 1) {
                q = text.find('\n', p);
                if (q == std::string::npos) q = text.size();
                out.notes.push_back(prefix + name + ": " + text.substr(p, q - p));
            }
        }
        VariantResult& r = results[v];
        const Schedule& f = rs.stack->forward_schedule();
        const Schedule& b = rs.stack->backward_schedule();
        r.slot = f.branches.empty() ? -1 : f.branches.front().slot;
        r.fwd_chunks = f.branches.empty() ? 0 : f.branches.front().chunks;
        r.bwd_chunks = b.branches.empty() ? 0 : b.branches.back().chunks;  // the same block's backward branch
        double seg = 0;
        for (double s : f.segment_ms) seg += s;
        r.backbone_ms = seg;
        r.a2a_ms = f.comm_ms();
        r.serial_ms = f.serial_ms();
        if (a.train) {
            for (double s : b.segment_ms) r.backbone_ms += s;
            r.a2a_ms += b.comm_ms();
            r.serial_ms += b.serial_ms();
        }
        for (int i = 0; i < common.warmup; ++i) rs.step(a.train, true);
    }
    // Timed steps, the variants interleaved (a change in the machine's load hits every variant
    // alike) and each step started together on every rank: the mean over the steps of each.
    auto timed = [&](bool train, double VariantResult::*field) {
        for (int i = 0; i < common.iters; ++i)
            for (std::size_t v = 0; v < nv; ++v) {
                barrier();
                results[v].*field += elapsed_ms(device, [&] { stacks[v]->step(train, true); }) / common.iters;
            }
    };
    timed(false, &VariantResult::fwd_ms);
    if (a.train) timed(true, &VariantResult::train_ms);
    if (wrapped) {
        // The same schedules with the link off: what the steps cost without their communication.
        wrapped->set_model({"off", 1e9, 0.0});
        timed(false, &VariantResult::fwd_nolink_ms);
        if (a.train) timed(true, &VariantResult::train_nolink_ms);
        wrapped->set_model(*ctx.link);
    }
    // Exposed communication from traced steps (interleaved the same way); the first one of each
    // variant is its --trace file.
    Tracer trace(device, rank);
    trace.set_pass(a.train ? "train step" : "forward");
    for (int i = 0; i < common.iters; ++i)
        for (std::size_t v = 0; v < nv; ++v) {
            barrier();
            trace.clear();
            stacks[v]->step(a.train, true, &trace);
            trace.collect();
            const OverlapSummary o = summarize_overlap(trace.entries());
            results[v].exposed_us += o.exposed_us;
            results[v].traced_us += o.span_us;
            results[v].backbone_idle_us += lane_idle_us(trace.entries(), "backbone") / common.iters;
            if (i == 0 && !a.trace.empty())
                trace.write(a.trace + (sweep ? ".tokens" + std::to_string(tokens) : "") + "." + a.variants[v] +
                            ".rank" + std::to_string(rank) + ".json");
        }
    if (common.check) {
        for (std::size_t v = 0; v < nv; ++v) {
            RankStack& rs = *stacks[v];
            const std::size_t bytes = rs.out.bytes();
            rs.step(a.train, false);
            const auto out_off = download_bytes(rs.stack->stream(), rs.out.data(), bytes);
            const auto gx_off = download_bytes(rs.stack->stream(), rs.gx.data(), bytes);
            rs.step(a.train, true);
            const auto out_on = download_bytes(rs.stack->stream(), rs.out.data(), bytes);
            const auto gx_on = download_bytes(rs.stack->stream(), rs.gx.data(), bytes);
            const std::size_t es = dtype_size(rs.stack->config().backbone.dtype);
            for (std::size_t i = 0; i < bytes; i += es) {
                results[v].wrong += std::memcmp(&out_off[i], &out_on[i], es) != 0;
                if (a.train) results[v].wrong += std::memcmp(&gx_off[i], &gx_on[i], es) != 0;
            }
        }
    }
    out.results.insert(out.results.end(), results.begin(), results.end());
}

RankOutput run_rank(const BlockArgs& a, const CommonArgs& common, Communicator* comm, int rank) {
    std::unique_ptr<Device> device = make_bench_device(common);
    auto stream = device->create_stream();
    RankOutput out;
    // One link for the whole sweep (--comm-share calibrates it at the first token count): the rows of
    // a sweep then compare the token counts over the same interconnect.
    std::optional<LinkModel> link = a.link;
    if (a.comm_share > 0) link = calibrate_link(a, a.tokens.front(), *device, *stream, comm, rank, out.notes);
    std::unique_ptr<EmulatedLink> wrapped;
    if (comm && link) wrapped = std::make_unique<EmulatedLink>(*comm, *link);
    const RankContext ctx{a, common, *device, *stream, wrapped ? wrapped.get() : comm, wrapped.get(), link, rank};
    for (std::size_t t = 0; t < a.tokens.size(); ++t) run_token_count(ctx, a.tokens[t], t == 0, out);
    if (device->backend() == Backend::kEmu && rank == 0) {
        emu::EmuDevice& e = emu::as_emu(*device);
        const emu::MemoryStats m = e.memory();
        const emu::TimelineStats t = e.timeline().stats();
        char line[384];
        std::snprintf(line, sizeof line,
                      "emu rank 0: peak device memory %.2f GiB of %.1f GiB; %llu ops emulated; %llu ops started late "
                      "(%.1f us; 0 in a faithful run); %llu waited for SMs their blocks fit (%.1f us in all)",
                      static_cast<double>(m.peak) / (1 << 30), static_cast<double>(m.capacity) / (1 << 30),
                      static_cast<unsigned long long>(t.works), static_cast<unsigned long long>(t.late_starts),
                      t.late_us, static_cast<unsigned long long>(t.residency_waits), t.residency_wait_us);
        out.notes.push_back(line);
    }
    return out;
}

// The table from every rank's results, one row per token count and variant: times are the slowest
// rank's, #wrong the sum (empty when `checked` is false).
int report_results(Report& report, const BlockArgs& a, bool checked, const std::vector<RankOutput>& ranks) {
    for (const std::string& n : ranks.front().notes) report.note(n);
    report.note("a2a/moe = a2a / (serial - backbone): the all-to-alls' share of the MoE layers' time, op by op "
                "(the ScMoE paper's Fig. 1 measure)");
    report.note("times: the slowest rank's mean over the timed steps (the variants interleaved step by step, each "
                "step started after a barrier); backbone and a2a: measured op by op (serially) during calibration; "
                "exposed = time with an a2a running and no compute running, as a share of the traced steps (the "
                "mean over the ranks; exposed_max: the largest rank's); bb_idle = the backbone stream's idle time "
                "between its first and last op in a traced step (the largest rank's mean); beyond_serial = max(0, step - (serial - "
                "a2a)) / step (includes the ranks' contention for the cores); link_cost = max(0, step - step with "
                "the link off) / step (the same schedule; the link's time not hidden); K = the first MoE branch's "
                "forward slot; chunks = its pipeline pieces forward/backward (--chunks " +
                (a.chunks == 0 ? std::string("auto") : std::to_string(a.chunks)) + ")");
    report.note("check: outputs" + std::string(a.train ? " and input gradients" : "") +
                " with overlap on vs off, bitwise (wrong = differing elements, all ranks)");
    report.begin_table({{"tokens", "tokens", "", 7, 0},
                        {"variant", "variant", "", 16, 0},
                        {"fwd_us", "fwd_time", "(us)", 10, 1},
                        {"train_us", "train_time", "(us)", 10, 1},
                        {"backbone_us", "backbone", "(us)", 10, 1},
                        {"a2a_us", "a2a", "(us)", 10, 1},
                        {"a2a_of_moe_pct", "a2a/moe", "(%)", 7, 1},
                        {"exposed_comm_pct", "exposed", "(%)", 7, 1},
                        {"exposed_comm_max_rank_pct", "exposed_max", "(%)", 11, 1},
                        {"backbone_idle_us", "bb_idle", "(us)", 9, 1},
                        {"beyond_serial_pct", "beyond_serial", "(%)", 13, 1},
                        {"link_cost_pct", "link_cost", "(%)", 9, 1},
                        {"slot", "K", "", 3, 0},
                        {"chunks", "chunks", "", 6, 0},
                        {"speedup_vs_top2_fwd", "fwd_speedup", "(x)", 11, 3},
                        {"speedup_vs_top2_train", "train_speedup", "(x)", 13, 3},
                        {"wrong", "#wrong", "", 6, 0}});
    const std::size_t nv = a.variants.size(), nt = a.tokens.size();
    for (std::size_t t = 0; t < nt; ++t) {
        std::vector<VariantResult> worst(nv);
        std::vector<double> exposed_mean(nv), exposed_max(nv);  // over the ranks
        for (std::size_t v = 0; v < nv; ++v) {
            VariantResult& w = worst[v];
            double wrong = 0;
            for (const RankOutput& r : ranks) {
                const VariantResult& x = r.results[t * nv + v];
                w.fwd_ms = std::max(w.fwd_ms, x.fwd_ms);
                w.train_ms = std::max(w.train_ms, x.train_ms);
                w.backbone_ms = std::max(w.backbone_ms, x.backbone_ms);
                w.a2a_ms = std::max(w.a2a_ms, x.a2a_ms);
                w.serial_ms = std::max(w.serial_ms, x.serial_ms);
                w.fwd_nolink_ms = std::max(w.fwd_nolink_ms, x.fwd_nolink_ms);
                w.train_nolink_ms = std::max(w.train_nolink_ms, x.train_nolink_ms);
                w.backbone_idle_us = std::max(w.backbone_idle_us, x.backbone_idle_us);
                exposed_mean[v] += x.exposed_pct() / static_cast<double>(ranks.size());
                exposed_max[v] = std::max(exposed_max[v], x.exposed_pct());
                wrong += x.wrong;
            }
            const VariantResult& first = ranks.front().results[t * nv + v];
            w.slot = first.slot;
            w.fwd_chunks = first.fwd_chunks;
            w.bwd_chunks = first.bwd_chunks;
            w.wrong = wrong;
        }
        const auto top2 = std::find(a.variants.begin(), a.variants.end(), "top2");
        const VariantResult* base =
            top2 == a.variants.end() ? nullptr : &worst[static_cast<std::size_t>(top2 - a.variants.begin())];
        for (std::size_t v = 0; v < nv; ++v) {
            const VariantResult& w = worst[v];
            const double step = a.train ? w.train_ms : w.fwd_ms;
            const double beyond_serial = std::max(0.0, step - (w.serial_ms - w.a2a_ms)) / step * 100.0;
            const double nolink = a.train ? w.train_nolink_ms : w.fwd_nolink_ms;
            const Cell link_cost = nolink > 0 ? Cell(std::max(0.0, step - nolink) / step * 100.0) : Cell();
            report.add_row(
                {a.tokens[t], a.variants[v], 1000.0 * w.fwd_ms, a.train ? Cell(1000.0 * w.train_ms) : Cell(),
                 1000.0 * w.backbone_ms, 1000.0 * w.a2a_ms,
                 w.serial_ms - w.backbone_ms > 0 ? Cell(100.0 * w.a2a_ms / (w.serial_ms - w.backbone_ms)) : Cell(),
                 exposed_mean[v], exposed_max[v], w.backbone_idle_us, beyond_serial, link_cost,
                 w.slot >= 0 ? Cell(static_cast<std::int64_t>(w.slot)) : Cell(),
                 w.fwd_chunks > 0 ? Cell(std::to_string(static_cast<int>(w.fwd_chunks)) +
                                         (a.train ? "/" + std::to_string(static_cast<int>(w.bwd_chunks)) : ""))
                                  : Cell(),
                 base ? Cell(base->fwd_ms / w.fwd_ms) : Cell(),
                 base && a.train ? Cell(base->train_ms / w.train_ms) : Cell(),
                 checked ? Cell(static_cast<std::int64_t>(w.wrong)) : Cell()});
        }
    }
    return report.finish({});
}

int run_local(const CommonArgs& common, const BlockArgs& a, const std::string& command) {
    std::unique_ptr<Device> device = make_bench_device(common);
    Report report(std::cout, "block", command, *device, common, block_args_json(common, a));
    report.print_preamble();
    const bool emulated = common.backend == "emu";
    report.note(std::to_string(a.ranks) + " in-process rank(s) (" +
                (emulated ? "EmuCommunicator on " + describe(a.topology) : "LocalCommunicator") +
                "), pid " + std::to_string(getpid()) +
                (a.link ? ", EmulatedLink " + describe_link_model(*a.link) : std::string()) + "; tokens " +
                comma_list(a.tokens) + " per rank");
    if (emulated) {
        for (const std::string& n : a.cluster_notes) report.note(n);
        report.note("emu: times are the emulator's predictions for " + device->description() +
                    ", not measurements; nothing is computed, so there is no check");
    }
    for (const std::string& note : a.preset_notes) report.note(note);
    std::vector<RankOutput> outputs(static_cast<std::size_t>(a.ranks));
    std::vector<std::string> errors(outputs.size());
    std::shared_ptr<LocalGroup> group = a.ranks > 1 && !emulated ? LocalGroup::create(a.ranks) : nullptr;
    std::shared_ptr<EmuGroup> emu_group;
    if (emulated && a.ranks > 1) {
        std::vector<int> ranks(static_cast<std::size_t>(a.ranks));
        for (int r = 0; r < a.ranks; ++r) ranks[static_cast<std::size_t>(r)] = r;
        emu_group = EmuGroup::create(launch::emulated_topology(a.topology, common.stack), ranks);
    }
    std::vector<std::thread> threads;
    for (int r = 0; r < a.ranks; ++r) {
        threads.emplace_back([&, r] {
            try {
                std::unique_ptr<Communicator> comm = group       ? group->communicator(r)
                                                     : emu_group ? emu_group->communicator(r)
                                                                 : nullptr;
                outputs[static_cast<std::size_t>(r)] = run_rank(a, common, comm.get(), r);
            } catch (const std::exception& e) {
                errors[static_cast<std::size_t>(r)] = e.what();
            }
        });
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < a.ranks; ++r)
        if (!errors[static_cast<std::size_t>(r)].empty())
            throw Error("rank " + std::to_string(r) + ": " + errors[static_cast<std::size_t>(r)]);
    return report_results(report, a, common.check, outputs);
}

#if SCMOE_WITH_MPI
int run_mpi(CommonArgs common, const BlockArgs& a, const std::string& command) {
    launch::init_mpi_serialized();
    int status = kExitOk, me = 0, n = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    try {
        std::unique_ptr<Device> device = make_bench_device(common);
        MpiCommunicator comm(MPI_COMM_WORLD);
        std::ostream null_stream(nullptr);
        if (me != 0) common.json_path.clear();
        Report report(me == 0 ? std::cout : null_stream, "block", command, *device, common, block_args_json(common, a));
        report.print_preamble();
        for (const std::string& line : mpi_rank_lines(a.link)) report.note(line);
        for (const std::string& note : a.preset_notes) report.note(note);
        RankOutput mine = run_rank(a, common, &comm, me);
        const std::size_t rows = a.tokens.size() * a.variants.size();  // results per rank
        const int k = VariantResult::kPacked * static_cast<int>(rows);
        std::vector<double> packed(static_cast<std::size_t>(k)), all(static_cast<std::size_t>(k * n));
        for (std::size_t v = 0; v < mine.results.size(); ++v) mine.results[v].pack(packed.data() + v * VariantResult::kPacked);
        MPI_Allgather(packed.data(), k, MPI_DOUBLE, all.data(), k, MPI_DOUBLE, MPI_COMM_WORLD);
        std::vector<RankOutput> outputs(static_cast<std::size_t>(n));
        for (int r = 0; r < n; ++r)
            for (std::size_t i = 0; i < rows; ++i)
                outputs[static_cast<std::size_t>(r)].results.push_back(
                    VariantResult::unpack(all.data() + r * k + static_cast<int>(i) * VariantResult::kPacked));
        outputs[0].notes = mine.notes;  // rank 0's notes are the ones printed
        status = report_results(report, a, common.check, outputs);
    } catch (const std::exception& e) {
        std::cerr << "scmoe-bench block: rank " << me << ": error: " << e.what() << "\n" << std::flush;
        MPI_Abort(MPI_COMM_WORLD, kExitError);
    }
    MPI_Finalize();
    return status;
}
#endif

}  // namespace

int run_block_bench(int argc, char** argv, const std::string& command) {
    cxxopts::Options options = block_options();
    const cxxopts::ParseResult result = options.parse(argc, argv);
    if (result.count("help")) {
        std::cout << options.help({"common", "block"});
        return kExitOk;
    }
    reject_unmatched(result);
    CommonArgs common = read_common_options(result);
    BlockArgs args = read_block_args(result);
    resolve_emu_cluster(common, args);
    std::unique_ptr<Device> probe = make_bench_device(common);
    common.backend = backend_name(probe->backend());
    resolve_iters(common, probe->backend());
    probe.reset();
    if (args.mpi) {
#if SCMOE_WITH_MPI
        return run_mpi(common, args, command);
#else
        throw UsageError("mpirun but this scmoe was built without MPI (SCMOE_WITH_MPI)");
#endif
    }
    return run_local(common, args, command);
}

}  // namespace scmoe::bench
