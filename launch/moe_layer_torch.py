#!/usr/bin/env python3
"""Hugging Face transformers' MixtralSparseMoeBlock on the shapes of `scmoe-bench layer`, timed the
same way, written as the same kind of JSON (-J): forward and forward+backward (gradients of the input
and of every weight) after warm-up, mean over the timed iterations, bf16 by default.

  python3 launch/moe_layer_torch.py --tokens 8K,32K --hidden 768 --ffn 3072 --experts 8 --top-k 2 \\
      -n 20 -w 3 -J torch_layer.json
  scmoe-bench layer --backend cuda --tokens 8K,32K --hidden 768 --ffn 3072 --experts 8 --top-k 2 \\
      --activation swiglu --dispatch dropless -n 20 -w 3 -J scmoe_layer.json

What is compared (also in the JSON's "peer_note"):
  - Mixtral's experts are SwiGLU: silu(x W1) * (x W3), then W2, three matrices per expert. scmoe's
    --activation swiglu is the same computation (its W1 [H, 2F] holds gate and up) with the same FLOPs;
    scmoe's --activation gelu has two matrices (2/3 of the FLOPs) and is NOT comparable: the layer step
    of launch/gpu_check.sh runs gelu, so compare against a swiglu run as above.
  - Mixtral is dropless (every token reaches its top-k experts): compare with --dispatch dropless.
  - Routing is the same rule (softmax, top-k, the k >= 2 weights renormalised to sum to 1); Mixtral's
    block computes no load-balancing or z-loss (scmoe's backward includes their gradients) and keeps
    its weight gradients in bf16 (scmoe's are f32).
  - Weights and inputs: uniform in [-1, 1), weights / sqrt(fan_in), as scmoe-bench layer (different
    values, the same distribution, so the routing is as balanced).
TFLOP/s: the routed experts' GEMM FLOPs, counted as bench/layer_common.cpp's expert_forward_flops
counts them for dropless dispatch (2 x tokens x top_k x hidden x (2F + F)), over the whole layer's time;
forward+backward does 3x the forward's. (scmoe-bench's own experts_tflops divides the same FLOPs by
its experts stage alone; compare the times and tokens/s.)

--experts-impl picks transformers' experts code (transformers 5.x: eager = the per-expert loop,
grouped_mm, batched_mm; auto = what a model loaded with from_pretrained gets: grouped_mm where this
transformers has it, else eager). A comma list gives one row per implementation.
Exit status: 0 ok, 2 bad command line, 3 torch, transformers (or the asked experts implementation) or
a CUDA GPU not available (with a message).
"""
import argparse
import math
import os
import platform
import sys

sys.dont_write_bytecode = True  # no __pycache__ in launch/ from the module below
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_peer import EXIT_OK, parse_sizes, run_context, tflops, time_us, unavailable, write_report  # noqa: E402

PROGRAM = "moe_layer_torch.py"
IMPLS = ("auto", "eager", "grouped_mm", "batched_mm")


def parse_args(argv):
    p = argparse.ArgumentParser(prog="moe_layer_torch.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-s", "--tokens", default="2048",
                   help="tokens per case, comma list, K/M suffixes (default 2048, as scmoe-bench layer)")
    p.add_argument("--hidden", type=int, default=1024, help="model width H (default 1024)")
    p.add_argument("--ffn", type=int, default=2048, help="expert FFN width F (default 2048)")
    p.add_argument("-E", "--experts", type=int, default=8, help="routed experts (default 8)")
    p.add_argument("-k", "--top-k", type=int, default=2, help="experts per token (default 2)")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "f32"], help="weights and activations (default bf16)")
    p.add_argument("--experts-impl", default="auto",
                   help="transformers' experts implementation(s), comma list of " + ", ".join(IMPLS) +
                        " (default auto)")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                   help="cuda (default) or cpu (for tests at tiny sizes)")
    p.add_argument("-n", "--iters", type=int,
                   help="timed iterations (default 20 on cuda, 5 on cpu, as scmoe-bench)")
    p.add_argument("-w", "--warmup", type=int, default=2, help="untimed iterations before the timed loop (default 2)")
    p.add_argument("--seed", type=int, default=1234, help="seed of the random inputs and weights (default 1234)")
    p.add_argument("-J", "--json", help="also write the results as JSON to this file")
    a = p.parse_args(argv)
    if a.hidden < 1 or a.ffn < 1:
        p.error("--hidden and --ffn must be >= 1")
    if a.experts < 1 or not 1 <= a.top_k <= a.experts:
        p.error("--experts must be >= 1 and --top-k in [1, experts]")
    if a.iters is None:
        a.iters = 20 if a.device == "cuda" else 5
    if a.iters < 1 or a.warmup < 0:
        p.error("--iters must be >= 1 and --warmup >= 0")
    a.token_counts = parse_sizes(p, a.tokens, "--tokens")
    a.impls = [x for x in a.experts_impl.split(",") if x]
    bad = [x for x in a.impls if x not in IMPLS]
    if bad or not a.impls:
        p.error(f"--experts-impl '{a.experts_impl}': expected a comma list of " + ", ".join(IMPLS))
    return a


def expert_forward_flops(tokens, hidden, ffn, top_k):
    # bench/layer_common.cpp expert_forward_flops, dropless: rows = tokens * top_k, inner width 2F (SwiGLU).
    return 2.0 * tokens * top_k * hidden * (2 * ffn + ffn)


def experts_implementations():
    """The experts implementations this transformers offers: eager always; 5.x adds its ExpertsInterface's,
    chosen through the config's _experts_implementation."""
    from transformers import MixtralConfig

    try:
        from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS
    except ImportError:  # transformers 4.x: the per-expert loop only
        return ["eager"]
    if not hasattr(MixtralConfig(), "_experts_implementation"):
        return ["eager"]
    return ["eager"] + sorted(ALL_EXPERTS_FUNCTIONS.keys())


def build_block(torch, hidden, ffn, experts, top_k, impl, dtype, device):
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    config = MixtralConfig(hidden_size=hidden, intermediate_size=ffn, num_local_experts=experts,
                           num_experts_per_tok=top_k, router_jitter_noise=0.0)
    if hasattr(config, "_experts_implementation"):
        # transformers 5.x reads the implementation from the config (a standalone block would get None:
        # eager, with a warning); 4.x has only eager and no such field.
        config._experts_implementation = impl
    # The constructor is MixtralSparseMoeBlock(config) in 4.x and 5.x alike.
    block = MixtralSparseMoeBlock(config).to(device=device, dtype=dtype)
    block.train()
    # scmoe-bench layer's init_params: uniform in [-1, 1) / sqrt(fan_in). Every Mixtral weight, in
    # 4.x (nn.Linear [out, in]) and 5.x (router [E, H], gate_up_proj [E, 2F, H], down_proj [E, H, F]),
    # has its input dimension last. 5.x creates them with torch.empty: they must be set.
    with torch.no_grad():
        for p in block.parameters():
            p.uniform_(-1.0, 1.0).div_(math.sqrt(p.shape[-1]))
    return block


def main(argv):
    args = parse_args(argv)
    try:
        import torch
    except ImportError as e:
        unavailable(PROGRAM, f"PyTorch is not available ({e}); pip install torch")
    try:
        import transformers
        from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock  # noqa: F401
    except ImportError as e:
        unavailable(PROGRAM, f"transformers' Mixtral is not available ({e}); pip install transformers")
    if args.device == "cuda" and not torch.cuda.is_available():
        unavailable(PROGRAM, "no CUDA GPU available to PyTorch (torch.cuda.is_available() is False)")
    offered = experts_implementations()
    default_impl = "grouped_mm" if "grouped_mm" in offered else "eager"
    impls = [default_impl if x == "auto" else x for x in args.impls]
    missing = [x for x in impls if x not in offered]
    if missing:
        unavailable(PROGRAM, f"--experts-impl {','.join(missing)}: transformers {transformers.__version__} offers "
                    f"{', '.join(offered)}")

    device = torch.device(args.device)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    context = run_context(torch, device.type, argv)
    description, command, date = context
    compare_with = (f"scmoe-bench layer --backend {args.device} --tokens {','.join(map(str, args.token_counts))} "
                    f"--hidden {args.hidden} --ffn {args.ffn} --experts {args.experts} --top-k {args.top_k} "
                    f"--activation swiglu --dispatch dropless -n {args.iters} -w {args.warmup}")
    peer_note = ("transformers MixtralSparseMoeBlock: SwiGLU experts (3 matrices: W1 gate, W3 up, W2 down) = "
                 "scmoe --activation swiglu (W1 [H, 2F] = gate|up, W2 [F, H]), same FLOPs; scmoe's gelu experts "
                 "have 2 matrices and 2/3 of the FLOPs, not comparable. Dropless like scmoe --dispatch dropless. "
                 "Same routing rule (softmax, top-k, k >= 2 weights renormalised); no aux/z-loss; bf16 weight "
                 "gradients (scmoe: f32). TFLOP/s = expert GEMM FLOPs (bench/layer_common.cpp "
                 "expert_forward_flops, dropless) over the whole layer's time.")
    print(f"# moe_layer_torch.py: torch {torch.__version__}, transformers {transformers.__version__}"
          + (f", CUDA {torch.version.cuda}" if device.type == "cuda" else ""))
    print(f"# device: {description}")
    print(f"# date: {date}  host: {platform.node()}")
    print(f"# command: {command}")
    print(f"# compare with: {compare_with}")
    print(f"# {peer_note}")
    header = ["provider", "experts", "top_k", "tokens", "fwd_time", "fwd_tok/s", "fwd_TF/s", "train_time",
              "train_tok/s", "train_TF/s"]
    units = ["", "", "", "", "(us)", "(tok/s)", "", "(us)", "(tok/s)", ""]
    widths = [max(len(h), len(u), 8) for h, u in zip(header, units)]
    widths[0] = max(widths[0], 22)
    print("#" + " ".join(h.rjust(w) for h, w in zip(header, widths)))
    print("#" + " ".join(u.rjust(w) for u, w in zip(units, widths)))

    def measure(block, T):
        """(forward us, forward+backward us) of `block` on T tokens."""
        weights = list(block.parameters())
        # [batch 1, T, H]: the block flattens batch and sequence into T tokens, as scmoe's layer sees them.
        x = x_all[:T].view(1, T, H).detach().requires_grad_(True)
        dy = dy_all[:T].view(1, T, H)

        def forward():
            y = block(x)
            return y[0] if isinstance(y, tuple) else y  # 4.x returns (output, router_logits)

        # Training forward: autograd records it, as scmoe's forward keeps what its backward needs.
        def fwd():
            forward()

        # Gradients returned, not accumulated into .grad (no extra add per iteration); dy as
        # scmoe-bench's grad_y. allow_unused: in 4.x an expert that no token reached has its own
        # weights outside the graph.
        def fwd_bwd():
            torch.autograd.grad(forward(), [x] + weights, dy, allow_unused=True)

        return (time_us(torch, device.type, fwd, args.iters, args.warmup),
                time_us(torch, device.type, fwd_bwd, args.iters, args.warmup))

    torch.manual_seed(args.seed)
    rows = []
    max_tokens, H = max(args.token_counts), args.hidden
    x_all = (torch.rand(max_tokens, H, device=device) * 2 - 1).to(dtype)
    dy_all = (torch.rand(max_tokens, H, device=device) * 2 - 1).to(dtype)
    for impl in impls:
        block = build_block(torch, H, args.ffn, args.experts, args.top_k, impl, dtype, device)
        provider = f"torch-mixtral-{impl}"
        for T in args.token_counts:
            fwd_us, fwd_bwd_us = measure(block, T)
            ff = expert_forward_flops(T, H, args.ffn, args.top_k)
            row = {"provider": provider, "experts": args.experts, "top_k": args.top_k, "dispatch": "dropless",
                   "tokens": T, "hidden": H, "ffn": args.ffn, "activation": "swiglu", "dtype": args.dtype,
                   "fwd_us": fwd_us, "fwd_tokens_per_s": T / (fwd_us * 1e-6), "fwd_tflops": tflops(ff, fwd_us),
                   "fwd_bwd_us": fwd_bwd_us, "train_tokens_per_s": T / (fwd_bwd_us * 1e-6),
                   "fwd_bwd_tflops": tflops(3 * ff, fwd_bwd_us), "wrong": None}
            rows.append(row)
            cells = [provider, args.experts, args.top_k, T, f"{fwd_us:.1f}", f"{row['fwd_tokens_per_s']:.0f}",
                     f"{row['fwd_tflops']:.3f}", f"{fwd_bwd_us:.1f}", f"{row['train_tokens_per_s']:.0f}",
                     f"{row['fwd_bwd_tflops']:.3f}"]
            print(" " + " ".join(str(c).rjust(w) for c, w in zip(cells, widths)), flush=True)
        block = None  # its memory goes back before the next implementation's block
        if device.type == "cuda":
            torch.cuda.empty_cache()

    summary = {"Avg fwd tokens/s": f"{sum(r['fwd_tokens_per_s'] for r in rows) / len(rows):.0f}",
               "Avg train tokens/s": f"{sum(r['train_tokens_per_s'] for r in rows) / len(rows):.0f}"}
    for label, value in summary.items():
        print(f"# {label} : {value}")
    if args.json:
        write_report(args.json, "layer", f"torch {torch.__version__}, transformers {transformers.__version__}",
                     {"tokens": args.token_counts, "hidden": H, "ffn": args.ffn, "experts": args.experts,
                      "top_k": args.top_k, "dispatch": ["dropless"], "activation": "swiglu", "dtype": args.dtype,
                      "experts_impl": impls, "iters": args.iters, "warmup": args.warmup, "seed": args.seed},
                     context, device.type, rows, summary, compare_with=compare_with, peer_note=peer_note, wrong=0)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
