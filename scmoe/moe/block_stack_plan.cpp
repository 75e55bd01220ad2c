// BlockStack schedule plans: the backbone segments of a forward and a backward pass in program
// order, and one split-phase branch per MoE block with the indices where its input exists (ready)
// and where its result is consumed (join). The LayerScheduler decides which stream runs what.
//
// NOTES: every accumulation into a residual-stream gradient happens in a backbone op or in a
// branch's consume (also on the backbone stream), in the order of this plan, so the sums are the
// same with overlap on and off. Branches are listed forward in block order and backward in reverse
// block order, so at a shared index a branch's consume precedes the next branch's start.
#include <algorithm>
#include <string>
#include <vector>

#include "scmoe/kernels/elementwise.h"
#include "scmoe/kernels/error.h"
#include "scmoe/moe/block_stack.h"
#include "scmoe/moe/detail/block.h"

namespace scmoe {

void BlockStack::build_plans(std::int64_t T) {
    if (T == plan_tokens_) return;
    plan_tokens_ = T;
    const std::size_t n = blocks_.size();
    const std::int64_t H = config_.backbone.hidden;
    const DType dt = config_.backbone.dtype;
    auto slice = [](const ParamSet& set, std::size_t first, std::size_t count) {
        return std::vector<Tensor>(set.tensors().begin() + static_cast<std::ptrdiff_t>(first),
                                   set.tensors().begin() + static_cast<std::ptrdiff_t>(first + count));
    };
    auto a = [this, T](void* p) { return act(p, T); };
    auto name = [](const char* what, std::size_t b) { return std::string(what) + std::to_string(b); };
    const ParamSet& P = backbone_params_;
    const ParamSet& G = backbone_grads_;

    // ---- forward ----
    SchedulePlan f;
    f.name = "forward";
    std::vector<int> mark_h(n + 1), mark_hmh(n), mark_x(n), end(n);
    for (std::size_t b = 0; b < n; ++b) {
        Block& k = *blocks_[b];
        const std::size_t off = k.param_offset;
        mark_h[b] = static_cast<int>(f.segments.size());
        f.segments.push_back({name("attn", b), [this, &k, a, b, p = slice(P, off, 3)](Stream& s) {
                                  k.attn->forward(a(h_[b]), p, a(hmh_[b]), s);
                              }});
        mark_hmh[b] = static_cast<int>(f.segments.size());
        if (!k.moe) {
            f.segments.push_back({name("mlp", b), [this, &k, a, b, p = slice(P, off + 3, 3)](Stream& s) {
                                      k.mlp->forward(a(hmh_[b]), p, a(h_[b + 1]), s);
                                  }});
        } else {
            f.segments.push_back({name("norm_x", b), [this, &k, a, b, w = P[off + 3]](Stream& s) {
                                      k.norm_x->forward(a(hmh_[b]), w, a(k.x), s);
                                  }});
            mark_x[b] = static_cast<int>(f.segments.size());
            if (config_.moe.shared_expert) {
                f.segments.push_back({name("shared", b), [this, &k, a](Stream& s) {
                                          k.moe->shared_expert_compute(a(k.x), moe_params_[static_cast<std::size_t>(k.moe_index)]->view(), s);
                                      }});
            }
        }
        end[b] = static_cast<int>(f.segments.size());
    }
    mark_h[n] = static_cast<int>(f.segments.size());
    for (std::size_t b = 0; b < n; ++b) {
        Block& k = *blocks_[b];
        if (!k.moe) continue;
        const MoeParams& mp = moe_params_[static_cast<std::size_t>(k.moe_index)]->view();
        BranchPlan br;
        br.name = name("moe", b);
        void* shortcut = nullptr;
        switch (k.spec.shortcut) {
            case ShortcutSource::kCurrent: br.ready = mark_x[b]; break;
            case ShortcutSource::kPos1: br.ready = mark_h[b], shortcut = h_[b]; break;
            case ShortcutSource::kPos2: br.ready = mark_hmh[b - 1], shortcut = hmh_[b - 1]; break;
            case ShortcutSource::kPos3: br.ready = mark_h[b - 1], shortcut = h_[b - 1]; break;
        }
        br.join = end[b];
        const Tensor norm_s_w = shortcut ? P[k.param_offset + 4] : Tensor();
        br.pre = {"gate", [&k, a, shortcut, norm_s_w, &mp](Stream& s) {
                      if (shortcut) k.norm_s->forward(a(shortcut), norm_s_w, a(k.s), s);
                      k.moe->route(a(shortcut ? k.s : k.x), mp, s);
                      k.moe->permute(s);
                  }};
        br.expert = {"experts", [&k, &mp](Stream& s) { k.moe->experts(mp, s); }};
        if (k.moe->ep_size() > 1) {  // one rank exchanges nothing: no all-to-all ops (nor trace entries)
            br.send = {"dispatch", [&k](Stream& s) { k.moe->dispatch(s); }, true};
            br.receive = {"collect", [&k](Stream& s) { k.moe->collect(s); }, true};
        }
        br.max_chunks = k.moe->max_chunks();
        br.send_chunks = {"dispatch", [&k](int c, int pieces, Stream& s) {
                              if (c == 0) k.moe->dispatch_counts(s);
                              k.moe->dispatch_chunk(c, pieces, s);
                          }, true};
        br.expert_chunks = {"experts", [&k, &mp](int c, int pieces, Stream& s) { k.moe->experts_chunk(mp, c, pieces, s); }};
        br.receive_chunks = {"collect", [&k](int c, int pieces, Stream& s) { k.moe->collect_chunk(c, pieces, s); }, true};
        br.post = {"combine", [&k, a](Stream& s) { k.moe->combine(a(k.y), s); }};
        br.consume = {"moe_add", [this, &k, a, b, T, H, dt](Stream& s) {
                          if (config_.moe.shared_expert) k.moe->shared_expert_add(a(k.y), s);
                          s.copy(h_[b + 1], hmh_[b], static_cast<std::size_t>(T * H) * dtype_size(dt));
                          gated_add({T, H, dt, nullptr, k.y, h_[b + 1]}, s);
                      }};
        f.branches.push_back(std::move(br));
    }

    // ---- backward ----
    SchedulePlan g;
    g.name = "backward";
    std::vector<int> start(n), after_shared(n), after_ffn(n), after_attn(n);
    for (std::size_t i = n; i-- > 0;) {
        const std::size_t b = i;
        Block& k = *blocks_[b];
        const std::size_t off = k.param_offset;
        start[b] = static_cast<int>(g.segments.size());
        if (!k.moe) {
            g.segments.push_back({name("mlp_bwd", b), [this, &k, a, b, p = slice(P, off + 3, 3), q = slice(G, off + 3, 3)](
                                                           Stream& s) {
                                      k.mlp->backward(a(grad_h_[b + 1]), p, q, a(grad_hmh_[b]), s);
                                  }});
            after_shared[b] = static_cast<int>(g.segments.size());
        } else {
            const std::size_t m = static_cast<std::size_t>(k.moe_index);
            g.segments.push_back({name("shared_bwd", b), [this, &k, a, b, m, T, H, dt](Stream& s) {
                                      if (config_.moe.shared_expert)
                                          k.moe->shared_expert_backward(a(grad_h_[b + 1]), moe_params_[m]->view(),
                                                                        moe_grads_[m]->view(), a(k.grad_x), false, s);
                                      else
                                          s.fill_zero(k.grad_x, static_cast<std::size_t>(T * H) * dtype_size(dt));
                                  }});
            after_shared[b] = static_cast<int>(g.segments.size());
            g.segments.push_back({name("norm_x_bwd", b), [this, &k, a, b, T, H, dt, w = P[off + 3], gw = G[off + 3]](
                                                              Stream& s) {
                                      s.copy(grad_hmh_[b], grad_h_[b + 1], static_cast<std::size_t>(T * H) * dtype_size(dt));
                                      k.norm_x->backward(a(k.grad_x), w, gw, a(grad_hmh_[b]), true, s);
                                  }});
        }
        after_ffn[b] = static_cast<int>(g.segments.size());
        g.segments.push_back({name("attn_bwd", b), [this, &k, a, b, p = slice(P, off, 3), q = slice(G, off, 3)](Stream& s) {
                                  k.attn->backward(a(grad_hmh_[b]), p, q, a(grad_h_[b]), s);
                              }});
        after_attn[b] = static_cast<int>(g.segments.size());
    }
    // A block's gradients are final after its attention backward (its MLP, norm_x and shared expert
    // come before it) and after its MoE branch's consume (below).
    grads_ready_index_ = after_attn;
    for (std::size_t i = n; i-- > 0;) {
        const std::size_t b = i;
        Block& k = *blocks_[b];
        if (!k.moe) continue;
        const MoeParams& mp = moe_params_[static_cast<std::size_t>(k.moe_index)]->view();
        const MoeGrads& mg = moe_grads_[static_cast<std::size_t>(k.moe_index)]->view();
        BranchPlan br;
        br.name = name("moe", b);
        br.ready = start[b];
        void* target = nullptr;  // gradient of the shortcut's source
        switch (k.spec.shortcut) {
            case ShortcutSource::kCurrent: br.join = after_shared[b]; break;
            case ShortcutSource::kPos1: br.join = after_attn[b], target = grad_h_[b]; break;
            case ShortcutSource::kPos2: br.join = after_ffn[b - 1], target = grad_hmh_[b - 1]; break;
            case ShortcutSource::kPos3: br.join = after_attn[b - 1], target = grad_h_[b - 1]; break;
        }
        br.pre = {"combine_bwd", [this, &k, a, b](Stream& s) { k.moe->combine_backward(a(grad_h_[b + 1]), s); }};
        br.expert = {"experts_bwd", [&k, &mp, &mg](Stream& s) { k.moe->experts_backward(mp, mg, s); }};
        if (k.moe->ep_size() > 1) {
            br.send = {"collect_bwd", [&k](Stream& s) { k.moe->collect_backward(s); }, true};
            br.receive = {"dispatch_bwd", [&k](Stream& s) { k.moe->dispatch_backward(s); }, true};
        }
        br.max_chunks = k.moe->max_chunks();
        br.send_chunks = {"collect_bwd", [&k](int c, int pieces, Stream& s) { k.moe->collect_backward_chunk(c, pieces, s); },
                          true};
        br.expert_chunks = {"experts_bwd", [&k, &mp, &mg](int c, int pieces, Stream& s) {
                                k.moe->experts_backward_chunk(mp, mg, c, pieces, s);
                            }};
        br.receive_chunks = {"dispatch_bwd",
                             [&k](int c, int pieces, Stream& s) { k.moe->dispatch_backward_chunk(c, pieces, s); }, true};
        br.post = {"router_bwd", [&k, a, &mp, &mg](Stream& s) {
                       k.moe->permute_backward(a(k.grad_s), false, s);
                       k.moe->route_backward(mp, mg, a(k.grad_s), s);
                   }};
        const Tensor w = target ? P[k.param_offset + 4] : Tensor(), gw = target ? G[k.param_offset + 4] : Tensor();
        br.consume = {"shortcut_add", [&k, a, target, w, gw, T, H, dt](Stream& s) {
                          if (target)
                              k.norm_s->backward(a(k.grad_s), w, gw, a(target), true, s);
                          else
                              gated_add({T, H, dt, nullptr, k.grad_s, k.grad_x}, s);  // grad_x += routed path
                      }};
        grads_ready_index_[b] = std::max(grads_ready_index_[b], br.join);  // norm_s, router, experts
        g.branches.push_back(std::move(br));
    }
    f.validate();
    g.validate();
    fwd_plan_ = std::move(f);
    bwd_plan_ = std::move(g);
    if (!calibrated_) {
        // Every expert FFN at its earliest slot, unchunked unless chunks are forced, until
        // calibrate() measures better ones.
        for (auto [plan, sched] : {std::pair{&fwd_plan_, &fwd_schedule_}, std::pair{&bwd_plan_, &bwd_schedule_}}) {
            sched->segment_ms.assign(plan->segments.size(), 0.0);
            sched->branches.assign(plan->branches.size(), Schedule::Branch{});
            choose_slots(*plan, *sched);
            choose_chunks(*plan, *sched, expert_chunks_);
        }
    }
}

}  // namespace scmoe
