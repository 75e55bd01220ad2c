#!/usr/bin/env python3
"""PyTorch's torch.nn.functional.scaled_dot_product_attention on the shapes of
`scmoe-bench attention`, timed the same way, written as the same JSON (-J): causal, bf16, the same
qkv layout ([batch, seq, 3, heads, head_dim] viewed as [batch, heads, seq, head_dim], no copies),
forward, backward and forward+backward, TFLOP/s from the same FLOP counts (scmoe/kernels/attention.h
op_cost: forward 2*b*h*s*s*d for the causal half, backward 2.5x that).

  python3 launch/attention_torch.py --batch 8 --seq 1024,4096 --heads 12 --head-dim 64,128 -J torch.json
  scmoe-bench attention --backend cuda --batch 8 --seq 1024,4096 --heads 12 --head-dim 64,128 \\
      --provider cudnn,own -J scmoe.json

--sdpa-backend picks PyTorch's kernel (auto: PyTorch chooses; flash, cudnn, efficient, math).
Exit status: 0 ok, 2 bad command line, 3 torch or a CUDA GPU not available (with a message).
"""
import argparse
import os
import platform
import sys

sys.dont_write_bytecode = True  # no __pycache__ in launch/ from the module below
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_peer import EXIT_OK, parse_sizes, run_context, tflops, time_us, unavailable, write_report  # noqa: E402

PROGRAM = "attention_torch.py"


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=8, help="sequences per batch (default 8)")
    p.add_argument("--seq", default="1024", help="sequence lengths, comma list, K suffix (default 1024)")
    p.add_argument("--heads", type=int, default=12, help="attention heads (default 12)")
    p.add_argument("--head-dim", default="64", help="head dimensions, comma list (default 64)")
    p.add_argument("--sdpa-backend", default="auto", choices=["auto", "flash", "cudnn", "efficient", "math"],
                   help="PyTorch's SDPA kernel (default auto: PyTorch chooses)")
    p.add_argument("-n", "--iters", type=int, default=20, help="timed iterations (default 20)")
    p.add_argument("-w", "--warmup", type=int, default=2, help="untimed iterations before the timed loop (default 2)")
    p.add_argument("--seed", type=int, default=1234, help="seed of the random inputs (default 1234)")
    p.add_argument("-J", "--json", help="also write the results as JSON to this file")
    a = p.parse_args(argv)
    if a.batch < 1 or a.heads < 1:
        p.error("--batch and --heads must be >= 1")
    if a.iters < 1 or a.warmup < 0:
        p.error("--iters must be >= 1 and --warmup >= 0")
    a.seqs = parse_sizes(p, a.seq, "--seq")
    a.head_dims = parse_sizes(p, a.head_dim, "--head-dim")
    return a


def forward_flops(b, s, h, d):
    return 2.0 * b * h * s * s * d  # scmoe/kernels/attention.h op_cost(AttentionArgs)


def main(argv):
    args = parse_args(argv)
    try:
        import torch
        import torch.nn.functional as F
    except ImportError as e:
        unavailable(PROGRAM, f"PyTorch is not available ({e}); pip install torch")
    if not torch.cuda.is_available():
        unavailable(PROGRAM, "no CUDA GPU available to PyTorch (torch.cuda.is_available() is False)")

    sdpa_kernel, backends = None, {}
    if args.sdpa_backend != "auto":
        try:
            from torch.nn.attention import SDPBackend, sdpa_kernel
        except ImportError:
            unavailable(PROGRAM, f"--sdpa-backend {args.sdpa_backend} needs torch.nn.attention (PyTorch 2.3+)")
        backends = {"flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION", "efficient": "EFFICIENT_ATTENTION",
                    "math": "MATH"}
        if not hasattr(SDPBackend, backends[args.sdpa_backend]):
            unavailable(PROGRAM, f"--sdpa-backend {args.sdpa_backend}: this PyTorch ({torch.__version__}) lacks it")

    device = torch.device("cuda")
    context = run_context(torch, "cuda", argv)
    description, command, date = context
    print(f"# attention_torch.py: torch {torch.__version__}, CUDA {torch.version.cuda}, "
          f"cuDNN {torch.backends.cudnn.version()}")
    print(f"# device: {description}")
    print(f"# date: {date}  host: {platform.node()}")
    print(f"# command: {command}")
    print(f"# torch.nn.functional.scaled_dot_product_attention(is_causal=True), bf16, sdpa backend "
          f"{args.sdpa_backend}; qkv [batch, seq, 3, heads, head_dim] viewed as [batch, heads, seq, head_dim]")
    header = ["provider", "batch", "seq", "heads", "head_dim", "dtype", "fwd_time", "fwd_tflops", "bwd_time",
              "bwd_tflops", "fwdbwd_time", "fwdbwd_tflops"]
    units = ["", "", "", "", "", "", "(us)", "(TFLOP/s)", "(us)", "(TFLOP/s)", "(us)", "(TFLOP/s)"]
    widths = [max(len(h), len(u), 8) for h, u in zip(header, units)]
    print("#" + " ".join(h.rjust(w) for h, w in zip(header, widths)))
    print("#" + " ".join(u.rjust(w) for u, w in zip(units, widths)))

    provider = "torch-sdpa" if args.sdpa_backend == "auto" else f"torch-{args.sdpa_backend}"
    rows, notes = [], []
    torch.manual_seed(args.seed)
    for d in args.head_dims:
        for s in args.seqs:
            b, h = args.batch, args.heads
            qkv = (torch.rand(b, s, 3, h, d, device=device) * 2 - 1).to(torch.bfloat16).requires_grad_(True)
            grad_out = (torch.rand(b, h, s, d, device=device) * 2 - 1).to(torch.bfloat16)

            def forward():
                q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)

            def in_backend(fn):
                if sdpa_kernel is None:
                    return fn()
                with sdpa_kernel(getattr(SDPBackend, backends[args.sdpa_backend])):
                    return fn()

            # Training forward (autograd records it; SDPA keeps its logsumexp as scmoe's forward keeps lse).
            def fwd():
                forward()

            saved = {}

            # Gradients returned, not accumulated into qkv.grad (no extra add per iteration).
            def bwd():
                torch.autograd.grad(saved["out"], qkv, grad_out, retain_graph=True)

            def fwd_bwd():
                torch.autograd.grad(forward(), qkv, grad_out)

            try:
                fwd_us = in_backend(lambda: time_us(torch, "cuda", fwd, args.iters, args.warmup))
                saved["out"] = in_backend(forward)
                bwd_us = in_backend(lambda: time_us(torch, "cuda", bwd, args.iters, args.warmup))
                fwd_bwd_us = in_backend(lambda: time_us(torch, "cuda", fwd_bwd, args.iters, args.warmup))
            except RuntimeError as e:  # e.g. no kernel of the forced backend for this shape
                print(f"# skipped: batch={b} seq={s} heads={h} head_dim={d}: {str(e).splitlines()[0]}")
                notes.append(f"skipped batch={b} seq={s} heads={h} head_dim={d}: {e}")
                continue
            finally:
                saved.clear()
            ff = forward_flops(b, s, h, d)
            row = {"provider": provider, "batch": b, "seq": s, "heads": h, "head_dim": d, "dtype": "bf16",
                   "fwd_us": fwd_us, "fwd_tflops": tflops(ff, fwd_us), "bwd_us": bwd_us,
                   "bwd_tflops": tflops(2.5 * ff, bwd_us), "fwd_bwd_us": fwd_bwd_us,
                   "fwd_bwd_tflops": tflops(3.5 * ff, fwd_bwd_us), "wrong": None}
            rows.append(row)
            cells = [provider, b, s, h, d, "bf16"] + [f"{row[k]:.1f}" if k.endswith("_us") else f"{row[k]:.3f}"
                                                      for k in ("fwd_us", "fwd_tflops", "bwd_us", "bwd_tflops",
                                                                "fwd_bwd_us", "fwd_bwd_tflops")]
            print(" " + " ".join(str(c).rjust(w) for c, w in zip(cells, widths)))
            del qkv, grad_out
            torch.cuda.empty_cache()

    if args.json:
        write_report(args.json, "attention", f"torch {torch.__version__}",
                     {"batch": args.batch, "seq": args.seqs, "heads": args.heads, "head_dim": args.head_dims,
                      "provider": [provider], "dtype": "bf16", "iters": args.iters, "warmup": args.warmup,
                      "seed": args.seed, "sdpa_backend": args.sdpa_backend},
                     context, "cuda", rows, notes=notes, wrong=0)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
