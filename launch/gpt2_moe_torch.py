#!/usr/bin/env python3
"""scmoe's gpt2-moe-small language model written in plain PyTorch, trained for --steps steps with AdamW
under bf16 autocast on random byte tokens, eager and/or torch.compile'd: tokens/s and MFU with the FLOPs
per token scmoe-train counts, as a peer of scmoe-train on the same GPU.

  python3 launch/gpt2_moe_torch.py --mode eager,compile --variants scmoe-pos2 --steps 50 --batch 8 \\
      --peak-tflops 989 -J torch_train.json
  scmoe-train --preset gpt2-moe-small --backend cuda --variants scmoe-pos2 --steps 50 --batch 8 \\
      --peak-tflops 989 --metrics scmoe_train.jsonl

The model (scmoe/models/lm_config.cpp lm_preset, scmoe/models/lm.h, scmoe/moe/block_stack.h, scmoe/moe/backbone.h):
  byte tokens (vocab 256) -> token embedding + learned positions -> blocks -> RMSNorm -> tied LM head
  (logits = h . embed^T) -> mean cross-entropy + the MoE router losses (0.01 x load-balancing aux loss
  + 0.001 x z-loss per MoE layer). Blocks: pre-RMSNorm causal multi-head attention (Wqkv [H, 3H], Wo,
  no biases) and a pre-RMSNorm GELU (tanh) MLP (W1 [H, F], W2 [F, H]). The variants place the MoE as
  scmoe/moe/block_stack.cpp block_variant does: the pair variants tile [dense, MoE] (an MoE in every 2nd
  block); scmoe-pos2 (the default, scmoe-train's) routes top-1 on the shortcut RMSNorm_s(H_{b-1}^MH)
  (the dense block's post-attention state) and adds the shared expert on x = RMSNorm_x(H_b^MH) scaled
  by the CG-1 gate sigmoid(w_cg . x). Experts: GELU, 8 of FFN width 3072, capacity dispatch with factor
  1.25 (C = ceil(1.25 T k / E) rows per expert over the batch's T tokens, first choices in token order
  first, the rest dropped), softmax router in f32 (the top-2 weights renormalised). Initialisation as
  scmoe/models/lm.cpp: N(0, 0.02), output projections / sqrt(2 layers), positions 0.01, norms 1.
  AdamW: betas (0.9, 0.95), eps 1e-8, no weight decay, gradient clipping at norm 1 (scmoe-train's).

Differences from scmoe a reader of a comparison must know:
  - Precision: f32 parameters and master weights, matmuls in bf16 under torch.autocast, the residual
    stream f32; scmoe keeps bf16 parameters and activations with f32 gradients and f32 master weights
    in its AdamW. Both do the same FLOPs.
  - Data: uniformly random bytes generated on the device (scmoe-train reads text files): the work per
    step is the same (capacity dispatch computes C rows per expert however the tokens route).
  - Learning rate constant 3e-4 (scmoe-train: warmup + cosine); it changes no speed. Losses are not
    comparable (random bytes cannot be learned: the loss tends to ln 256 = 5.55).
  - Attention is PyTorch's scaled_dot_product_attention (flash / cuDNN on a GPU); the experts run as
    one batched matmul over [E, C, H]; nothing overlaps the MoE with other work (no all-to-all on one
    GPU anyway). Only capacity dispatch (scmoe-train --dispatch dropless is not mirrored).
Times and MFU (launch/train_main.cpp, launch/train_report.cpp, scmoe/models/lm.cpp train_flops_per_token):
each step's wall time from the batch to the optimizer's end, synchronized; tokens/s = batch x seq /
step time, averaged over the steps after the first; model TFLOP/s = tokens/s x FLOPs per token / 1e12,
FLOPs per token = 6 x the parameters a token uses (every tensor but the position table, the experts
counted top_k times, the tied head once) + 6 x layers x hidden x seq; MFU = model TFLOP/s / --peak-tflops.

--mode compile: torch.compile(model) for forward and backward (the optimizer stays eager). Every mode
and variant runs in a process of its own; a compile run that has not finished its first step
--compile-budget-s seconds after its process started is killed with its compile workers and reported
with status "timeout" ("not compiled within budget"), and the other runs go on.
Exit status: 0 ok (timeouts included), 1 a run failed (its row says why), 2 bad command line, 3 torch
or a CUDA GPU not available (with a message).
"""
import argparse
import json
import math
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

sys.dont_write_bytecode = True  # no __pycache__ in launch/ from the module below
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_peer import EXIT_FAILED, EXIT_OK, run_context, unavailable, write_report  # noqa: E402

PROGRAM = "gpt2_moe_torch.py"

# scmoe/models/lm_config.cpp lm_preset: layers, hidden, heads, seq, ffn (dense and expert), experts; GELU.
PRESETS = {
    "tiny": (4, 128, 4, 64, 256, 8),
    "gpt2-moe-small": (12, 768, 12, 1024, 3072, 8),
    "gpt2-moe-medium": (24, 1024, 16, 2048, 4096, 8),
}
# scmoe/moe/block_stack.cpp block_variant: top_k, shared expert (with the CG-1 gate), the MoE's shortcut.
VARIANTS = {
    "top2": (2, False, "current"),
    "top1": (1, False, "current"),
    "shared": (1, True, "current"),
    "scmoe-pos1": (1, True, "pos1"),
    "scmoe-pos2": (1, True, "pos2"),
    "scmoe-pos3": (1, True, "pos3"),
    "scmoe2": (2, True, "pos2"),
    "every-block-pos1": (1, True, "pos1"),
    "top3": (3, False, "current"),
    "every-block-top2": (2, False, "current"),
    "every-block-shared": (1, True, "current"),
}
EVERY_BLOCK = {"every-block-pos1", "every-block-top2", "every-block-shared"}  # an MoE in every block
MODES = ("eager", "compile")
CAPACITY_FACTOR, AUX_LOSS_COEF, Z_LOSS_COEF, NORM_EPS = 1.25, 0.01, 0.001, 1e-5  # scmoe/moe/config.h, scmoe/moe/backbone.h
LR, BETAS, EPS, CLIP = 3e-4, (0.9, 0.95), 1e-8, 1.0


def comma_list(parser, text, flag, allowed):
    items = [x for x in text.split(",") if x]
    bad = [x for x in items if x not in allowed]
    if bad or not items:
        parser.error(f"{flag} '{text}': expected a comma list of " + ", ".join(allowed))
    return list(dict.fromkeys(items))


def parse_args(argv):
    p = argparse.ArgumentParser(prog="gpt2_moe_torch.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", default="eager", help="eager, compile or both as a comma list (default eager)")
    p.add_argument("--variants", default="scmoe-pos2",
                   help="block variants, comma list: " + ", ".join(VARIANTS) + " (default scmoe-pos2)")
    p.add_argument("--preset", default="gpt2-moe-small", choices=list(PRESETS),
                   help="model preset (default gpt2-moe-small)")
    p.add_argument("--layers", type=int, help="transformer blocks (default: the preset's)")
    p.add_argument("--hidden", type=int, help="model width (default: the preset's)")
    p.add_argument("--heads", type=int, help="attention heads (default: the preset's)")
    p.add_argument("--seq", type=int, help="sequence length (default: the preset's)")
    p.add_argument("--ffn", type=int, help="dense MLP width (default: the preset's)")
    p.add_argument("--experts", type=int, help="routed experts per MoE layer (default: the preset's)")
    p.add_argument("--expert-ffn", type=int, help="expert FFN width (default: the preset's)")
    p.add_argument("--vocab", type=int, default=256, help="vocabulary (default 256: byte tokens)")
    p.add_argument("--steps", type=int, default=20, help="training steps, >= 2 (default 20)")
    p.add_argument("--batch", type=int, default=8, help="sequences per step (default 8)")
    p.add_argument("--peak-tflops", type=float, default=0.0,
                   help="peak dense TFLOP/s of the device for the MFU (e.g. 989 for H100 SXM bf16; default 0: no MFU)")
    p.add_argument("--compile-budget-s", type=float, default=240.0,
                   help="compile mode: seconds from the run's start to the end of its first step (default 240)")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                   help="cuda (default) or cpu (for tests at tiny sizes)")
    p.add_argument("--seed", type=int, default=1234, help="seed of the parameters and the tokens (default 1234)")
    p.add_argument("-J", "--json", help="also write the results as JSON to this file")
    # One run (variant, mode) in a process of its own, started by the program itself.
    p.add_argument("--worker", nargs=3, metavar=("VARIANT", "MODE", "RESULT"), help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    a.modes = comma_list(p, a.mode, "--mode", MODES)
    a.variant_list = comma_list(p, a.variants, "--variants", list(VARIANTS))
    layers, hidden, heads, seq, ffn, experts = PRESETS[a.preset]
    a.layers = layers if a.layers is None else a.layers
    a.hidden = hidden if a.hidden is None else a.hidden
    a.heads = heads if a.heads is None else a.heads
    a.seq = seq if a.seq is None else a.seq
    a.experts = experts if a.experts is None else a.experts
    a.expert_ffn = ffn if a.expert_ffn is None else a.expert_ffn
    a.ffn = ffn if a.ffn is None else a.ffn
    if min(a.layers, a.hidden, a.heads, a.seq, a.ffn, a.experts, a.expert_ffn, a.batch) < 1:
        p.error("model sizes and --batch must be >= 1")
    if a.hidden % a.heads:
        p.error(f"--hidden {a.hidden} is not a multiple of --heads {a.heads}")
    if a.vocab < 256:
        p.error(f"--vocab {a.vocab}: the data has 256 byte tokens")
    if a.steps < 2:
        p.error("--steps must be >= 2 (the first step is not timed)")
    if a.peak_tflops < 0 or a.compile_budget_s <= 0:
        p.error("--peak-tflops must be >= 0 and --compile-budget-s > 0")
    for v in a.variant_list:
        if v not in EVERY_BLOCK and a.layers % 2:
            p.error(f"--layers {a.layers} must be even for the pair variant '{v}'")
        if VARIANTS[v][0] > a.experts:
            p.error(f"--variants {v}: top-{VARIANTS[v][0]} needs at least that many experts")
    return a


# ---- the model -------------------------------------------------------------------------------------


def make_lm(torch, a, variant):
    """The LM of scmoe/models/lm.h for `variant`, its parameters named and shaped as scmoe names them
    ("embed", "blocks.1.moe.expert_w1", ...: weights [in, out]), so that the FLOP count below reads
    the same tensors scmoe/models/lm.cpp does."""
    nn, F = torch.nn, torch.nn.functional
    top_k, shared, shortcut = VARIANTS[variant]
    H, V, S, E = a.hidden, a.vocab, a.seq, a.experts
    moe_blocks = [True] * a.layers if variant in EVERY_BLOCK else [b % 2 == 1 for b in range(a.layers)]

    def tensors(**shapes):
        m = nn.Module()
        for name, shape in shapes.items():
            m.register_parameter(name, nn.Parameter(torch.empty(shape)))
        return m

    def rms(x, w):
        return F.rms_norm(x, (H,), w, NORM_EPS)

    def gelu(x):
        return F.gelu(x, approximate="tanh")

    class ByteMoeLm(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Parameter(torch.empty(V, H))
            self.pos = nn.Parameter(torch.empty(S, H))
            self.final_norm = nn.Parameter(torch.empty(H))
            self.blocks = nn.ModuleList()
            for is_moe in moe_blocks:
                block = nn.Module()
                block.attn = tensors(norm_w=(H,), wqkv=(H, 3 * H), wo=(H, H))
                if not is_moe:
                    block.mlp = tensors(norm_w=(H,), w1=(H, a.ffn), w2=(a.ffn, H))
                else:
                    shapes = {"norm_x": (H,)}
                    if shortcut != "current":
                        shapes["norm_s"] = (H,)
                    shapes.update(gate_w=(H, E), expert_w1=(E, H, a.expert_ffn), expert_w2=(E, a.expert_ffn, H))
                    if shared:  # the shared expert's width is the experts' (MoeConfig.shared_ffn = 0)
                        shapes.update(shared_w1=(H, a.expert_ffn), shared_w2=(a.expert_ffn, H), cg_w=(H, 1))
                    block.moe = tensors(**shapes)
                self.blocks.append(block)
            self.reset_parameters()

        def reset_parameters(self):  # scmoe/models/lm.cpp init_std
            with torch.no_grad():
                for name, p in self.named_parameters():
                    short = name.rsplit(".", 1)[-1]
                    if short in ("norm_w", "norm_x", "norm_s", "final_norm"):
                        p.fill_(1.0)
                    elif name == "pos":
                        p.normal_(0.0, 0.01)
                    elif short in ("wo", "w2") or short.endswith("_w2"):
                        p.normal_(0.0, 0.02 / math.sqrt(2.0 * a.layers))
                    else:
                        p.normal_(0.0, 0.02)

        def attention(self, p, h, B, T):
            heads, hd = a.heads, H // a.heads
            qkv = (rms(h, p.norm_w) @ p.wqkv).view(B, T, 3, heads, hd).permute(2, 0, 3, 1, 4)
            o = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=True)
            return o.transpose(1, 2).reshape(B * T, H) @ p.wo

        def moe(self, p, s):
            """Routed experts on s, capacity dispatch (scmoe/kernels/router.h, scmoe/kernels/layout.h): returns
            the combined output and the weighted router losses."""
            T = s.shape[0]
            logits = s.float() @ p.gate_w.float()
            probs = logits.softmax(-1)
            weight, index = probs.topk(top_k, dim=-1)
            if top_k >= 2:  # the k weights renormalised to sum to 1
                weight = weight / weight.sum(-1, keepdim=True)
            # Assignments in priority order: every first choice in token order, then the second choices.
            choice_expert = index.t().reshape(-1)
            onehot = (choice_expert[:, None] == torch.arange(E, device=s.device)).to(torch.int32)
            share = onehot.sum(0).float() / (T * top_k)  # f_e: not differentiated
            aux = E * (share * probs.mean(0)).sum()
            z = torch.logsumexp(logits, -1).square().mean()
            capacity = max(1, math.ceil(CAPACITY_FACTOR * T * top_k / E))
            rank = (onehot.cumsum(0) * onehot).sum(-1) - 1  # place of each assignment in its expert
            kept = rank < capacity
            # Dropped assignments point at a spare zero row (E * C) so every shape stays static.
            slot = torch.where(kept, choice_expert * capacity + rank, E * capacity)
            token = torch.arange(top_k * T, device=s.device) % T
            row_token = torch.full((E * capacity + 1,), T, device=s.device, dtype=token.dtype)
            row_token = row_token.scatter(0, slot, token)[: E * capacity]  # empty rows read the zero row T
            xp = torch.cat([s, s.new_zeros(1, H)])[row_token].view(E, capacity, H)
            yp = torch.bmm(gelu(torch.bmm(xp, p.expert_w1)), p.expert_w2).view(E * capacity, H)
            y_choice = torch.cat([yp, yp.new_zeros(1, H)])[slot].view(top_k, T, H)
            y = (y_choice * (weight.t() * kept.view(top_k, T)).unsqueeze(-1).to(y_choice.dtype)).sum(0)
            return y, AUX_LOSS_COEF * aux + Z_LOSS_COEF * z

        def forward(self, ids, targets):
            B, T = ids.shape
            h = (self.embed[ids] + self.pos[:T]).view(B * T, H)
            prev_in = prev_mh = None
            router_loss = 0.0
            for block, is_moe in zip(self.blocks, moe_blocks):
                h_in = h
                h = h + self.attention(block.attn, h, B, T)  # H_b^MH
                if not is_moe:
                    m = block.mlp
                    out = h + gelu(rms(h, m.norm_w) @ m.w1) @ m.w2
                else:
                    m = block.moe
                    x = rms(h, m.norm_x)
                    # The shortcut: pos1 = H_b (this block's input), pos2 = H_{b-1}^MH, pos3 = H_{b-1}.
                    source = {"current": None, "pos1": h_in, "pos2": prev_mh, "pos3": prev_in}[shortcut]
                    y, loss = self.moe(m, x if source is None else rms(source, m.norm_s))
                    router_loss = router_loss + loss
                    if shared:
                        y = y + torch.sigmoid(x @ m.cg_w) * (gelu(x @ m.shared_w1) @ m.shared_w2)
                    out = h + y
                prev_in, prev_mh, h = h_in, h, out
            logits = rms(h, self.final_norm) @ self.embed.t()  # tied head
            ce = F.cross_entropy(logits.float(), targets.reshape(-1))
            return ce + router_loss, ce.detach()

    return ByteMoeLm()


def train_flops_per_token(model, a, variant):
    """scmoe/models/lm.cpp LanguageModel::train_flops_per_token: 6 x the parameters a token uses (every
    tensor but the position table; an expert tensor [E, ...] counted top_k times, i.e. numel / E x
    top_k; the tied head once) + 6 x layers x hidden x seq for causal attention."""
    top_k = VARIANTS[variant][0]
    params = 0.0
    for name, p in model.named_parameters():
        if name == "pos":
            continue
        expert = name.endswith(("expert_w1", "expert_w2"))
        params += p.numel() / p.shape[0] * top_k if expert else p.numel()
    return 6.0 * params + 6.0 * a.layers * a.hidden * a.seq


# ---- one run, in its own process ---------------------------------------------------------------------


def run_worker(a):
    """Trains one (variant, mode) and writes its row to the result file; after the first step (for
    compile mode: compiled) touches RESULT.first-step, which the parent's compile budget waits for."""
    variant, mode, result = a.worker
    row = {"variant": variant, "mode": mode, "status": "failed"}
    try:
        import torch

        device = torch.device(a.device)
        torch.manual_seed(a.seed)
        model = make_lm(torch, a, variant).to(device)
        row["flops_per_token"] = train_flops_per_token(model, a, variant)
        row["params"] = sum(p.numel() for p in model.parameters())
        optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=0.0,
                                      fused=device.type == "cuda")
        step_fn = torch.compile(model, dynamic=False) if mode == "compile" else model
        generator = torch.Generator(device=device).manual_seed(a.seed)
        tokens = a.batch * a.seq
        losses, rates, times = [], [], []
        for step in range(1, a.steps + 1):
            t0 = time.perf_counter()
            ids = torch.randint(0, 256, (a.batch, a.seq + 1), device=device, generator=generator)
            with torch.autocast(device.type, dtype=torch.bfloat16):
                loss, ce = step_fn(ids[:, :-1], ids[:, 1:])
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(ce.item())
            if device.type == "cuda":
                torch.cuda.synchronize()
            step_s = time.perf_counter() - t0
            times.append(step_s)
            rates.append(tokens / step_s)
            if step == 1:
                row["first_step_s"] = step_s  # compile mode: compiling the forward and backward included
                open(result + ".first-step", "w").close()
            print(f"{variant} {mode}: step {step:5d}/{a.steps}  loss {losses[-1]:.4f}  {rates[-1]:.0f} tok/s  "
                  f"{1000 * step_s:.1f} ms/step", flush=True)
        timed = slice(1, None)  # the steps after the first, as scmoe-train's summary
        tail = max(1, a.steps // 10)  # the final loss: the mean over the last tenth of the steps
        row.update(status="ok", steps=a.steps, tokens_per_s=sum(rates[timed]) / len(rates[timed]),
                   step_ms=1000 * sum(times[timed]) / len(times[timed]),
                   median_step_ms=1000 * statistics.median(times[timed]), first_loss=losses[0],
                   final_loss=sum(losses[-tail:]) / tail)
        if device.type == "cuda":
            row["max_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    except Exception as e:  # reported in the row; the parent goes on with the other runs
        traceback.print_exc()
        lines = str(e).strip().splitlines()
        row["note"] = f"{type(e).__name__}: {lines[0] if lines else ''}"
    with open(result, "w") as f:
        json.dump(row, f)
    return EXIT_OK if row["status"] == "ok" else EXIT_FAILED


class Runner:
    """Starts each run as a child process in a session of its own, so that the child and everything it
    started (Inductor's compile workers) can be killed together: on the compile budget, and when this
    process is told to stop (SIGTERM, SIGINT, SIGHUP: gpu_check.sh's timeout)."""

    def __init__(self):
        self.child = None
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self.stop)

    def kill_group(self):
        if self.child is not None:
            try:
                os.killpg(self.child.pid, signal.SIGKILL)
            except ProcessLookupError:  # the group has gone already
                pass

    def stop(self, signum, _frame):
        self.kill_group()
        print(f"gpt2_moe_torch.py: stopped by {signal.Signals(signum).name}; the run in progress was killed",
              file=sys.stderr)
        sys.exit(128 + signum)

    def run(self, argv, variant, mode, budget_s, result):
        cmd = [sys.executable, os.path.abspath(__file__)] + list(argv) + ["--worker", variant, mode, result]
        started = time.monotonic()
        self.child = subprocess.Popen(cmd, start_new_session=True)
        timed_out = False
        while self.child.poll() is None:
            waiting = mode == "compile" and not os.path.exists(result + ".first-step")
            if waiting and time.monotonic() - started > budget_s:
                self.kill_group()
                timed_out = True
                break
            time.sleep(0.1)
        rc = self.child.wait()
        self.kill_group()  # compile workers that outlived their parent
        self.child = None
        if timed_out:
            return {"variant": variant, "mode": mode, "status": "timeout",
                    "note": f"not compiled within budget: no first step {budget_s:g} s after the start "
                            "(--compile-budget-s); killed with its compile workers"}
        try:
            with open(result) as f:
                return json.load(f)
        except (OSError, ValueError):
            why = f"killed by signal {-rc}" if rc < 0 else f"exit status {rc}"
            return {"variant": variant, "mode": mode, "status": "failed", "note": f"the run died ({why}), no result"}


def main(argv):
    args = parse_args(argv)
    if args.worker:
        return run_worker(args)
    try:
        import torch
    except ImportError as e:
        unavailable(PROGRAM, f"PyTorch is not available ({e}); pip install torch")
    if args.device == "cuda" and not torch.cuda.is_available():
        unavailable(PROGRAM, "no CUDA GPU available to PyTorch (torch.cuda.is_available() is False)")
    context = run_context(torch, args.device, argv)
    description, command, date = context
    shape = (f"--layers {args.layers} --hidden {args.hidden} --heads {args.heads} --seq {args.seq} --ffn {args.ffn} "
             f"--experts {args.experts} --expert-ffn {args.expert_ffn} --vocab {args.vocab}")
    compare_with = (f"scmoe-train --preset {args.preset} {shape} --backend {args.device} --variants {args.variants} "
                    f"--steps {args.steps} --batch {args.batch}"
                    + (f" --peak-tflops {args.peak_tflops:g}" if args.peak_tflops else ""))
    peer_note = ("plain PyTorch LM of scmoe/models/lm.h: byte tokens, learned positions, RMSNorm, tied head, GELU MLP, "
                 "capacity-dispatch MoE (factor 1.25) placed as scmoe/moe/block_stack.cpp block_variant; f32 parameters "
                 "with bf16 autocast (scmoe: bf16 parameters, f32 master weights); random bytes; constant lr; "
                 "PyTorch SDPA attention; no MoE overlap. tokens/s: mean over the steps after the first; "
                 "MFU FLOPs per token as scmoe/models/lm.cpp train_flops_per_token.")
    print(f"# gpt2_moe_torch.py: torch {torch.__version__}"
          + (f", CUDA {torch.version.cuda}" if args.device == "cuda" else ""))
    print(f"# device: {description}")
    print(f"# date: {date}  host: {platform.node()}")
    print(f"# command: {command}")
    print(f"# model: {args.preset} {shape}, batch {args.batch}, bf16 autocast")
    print(f"# compare with: {compare_with}")
    print(f"# {peer_note}", flush=True)

    runner = Runner()
    rows = []
    with tempfile.TemporaryDirectory(prefix="gpt2_moe_torch.") as tmp:
        for variant in args.variant_list:
            for mode in args.modes:
                result = os.path.join(tmp, f"{variant}.{mode}.json")
                row = runner.run(argv, variant, mode, args.compile_budget_s, result)
                row.update(preset=args.preset, layers=args.layers, hidden=args.hidden, heads=args.heads,
                           seq=args.seq, ffn=args.ffn, experts=args.experts, expert_ffn=args.expert_ffn,
                           top_k=VARIANTS[variant][0], vocab=args.vocab, batch=args.batch,
                           dtype="bf16-autocast", peak_tflops=args.peak_tflops or None)
                if row["status"] == "ok":
                    row["model_tflops_per_gpu"] = row["tokens_per_s"] * row["flops_per_token"] / 1e12
                    row["mfu_pct"] = (100.0 * row["model_tflops_per_gpu"] / args.peak_tflops
                                      if args.peak_tflops else None)
                rows.append(row)

    print("#\n# summary (tok/s, ms/step: mean over the steps after the first; loss: first step, mean of the "
          "last 10% of steps)")
    print("#  variant            mode       status      tok/s   ms/step  first loss  final loss  model TF/s    MFU%")
    for r in rows:
        if r["status"] == "ok":
            mfu = f"{r['mfu_pct']:8.1f}" if r["mfu_pct"] is not None else "     N/A"
            print(f"   {r['variant']:<18} {r['mode']:<10} {r['status']:<8} {r['tokens_per_s']:10.0f} "
                  f"{r['step_ms']:9.1f} {r['first_loss']:11.4f} {r['final_loss']:11.4f} "
                  f"{r['model_tflops_per_gpu']:11.3f} {mfu}")
        else:
            print(f"   {r['variant']:<18} {r['mode']:<10} {r['status']:<8} {r.get('note', '')}")
    sys.stdout.flush()
    if args.json:
        write_report(args.json, "train", f"torch {torch.__version__}",
                     {"preset": args.preset, "layers": args.layers, "hidden": args.hidden, "heads": args.heads,
                      "seq": args.seq, "ffn": args.ffn, "experts": args.experts, "expert_ffn": args.expert_ffn,
                      "vocab": args.vocab, "variants": args.variant_list, "mode": args.modes, "steps": args.steps,
                      "batch": args.batch, "peak_tflops": args.peak_tflops or None,
                      "compile_budget_s": args.compile_budget_s, "seed": args.seed, "dtype": "bf16-autocast"},
                     context, args.device, rows,
                     notes=[f"{r['variant']} {r['mode']}: {r['note']}" for r in rows if r.get("note")],
                     compare_with=compare_with, peer_note=peer_note)
    return EXIT_FAILED if any(r["status"] == "failed" for r in rows) else EXIT_OK


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
