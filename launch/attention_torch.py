#!/usr/bin/env python3
"""PyTorch's torch.nn.functional.scaled_dot_product_attention on the shapes of
`scmoe-bench attention`, timed the same way, written as the same JSON (-J): causal, bf16, the same
qkv layout ([batch, seq, 3, heads, head_dim] viewed as [batch, heads, seq, head_dim], no copies),
forward, backward and forward+backward, TFLOP/s from the same FLOP counts (kernels/attention.h
op_cost: forward 2*b*h*s*s*d for the causal half, backward 2.5x that).

  python3 launch/attention_torch.py --batch 8 --seq 1024,4096 --heads 12 --head-dim 64,128 -J torch.json
  scmoe-bench attention --backend cuda --batch 8 --seq 1024,4096 --heads 12 --head-dim 64,128 \\
      --provider cudnn,own -J scmoe.json

--sdpa-backend picks PyTorch's kernel (auto: PyTorch chooses; flash, cudnn, efficient, math).
Exit status: 0 ok, 2 bad command line, 3 torch or a CUDA GPU not available (with a message).
"""
import argparse
import datetime
import json
import os
import platform
import shlex
import sys

EXIT_OK, EXIT_USAGE, EXIT_UNAVAILABLE = 0, 2, 3


def parse_sizes(parser, text, flag):
    sizes = []
    for item in filter(None, text.split(",")):
        scale = 1
        if item[-1] in "kK":
            scale, item = 1024, item[:-1]
        try:
            value = int(item) * scale
        except ValueError:
            value = 0
        if value <= 0:
            parser.error(f"{flag} '{text}': expected positive sizes such as 1024 or 4K")
        sizes.append(value)
    if not sizes:
        parser.error(f"{flag}: empty list")
    return sizes


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


def unavailable(message):
    print(f"attention_torch.py: {message}", file=sys.stderr)
    sys.exit(EXIT_UNAVAILABLE)


def forward_flops(b, s, h, d):
    return 2.0 * b * h * s * s * d  # kernels/attention.h op_cost(AttentionArgs)


def tflops(flops, us):
    return flops / (us * 1e-6) / 1e12 if us > 0 else 0.0


def main(argv):
    args = parse_args(argv)
    try:
        import torch
        import torch.nn.functional as F
    except ImportError as e:
        unavailable(f"PyTorch is not available ({e}); pip install torch")
    if not torch.cuda.is_available():
        unavailable("no CUDA GPU available to PyTorch (torch.cuda.is_available() is False)")

    sdpa_kernel, backends = None, {}
    if args.sdpa_backend != "auto":
        try:
            from torch.nn.attention import SDPBackend, sdpa_kernel
        except ImportError:
            unavailable(f"--sdpa-backend {args.sdpa_backend} needs torch.nn.attention (PyTorch 2.3+)")
        backends = {"flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION", "efficient": "EFFICIENT_ATTENTION",
                    "math": "MATH"}
        if not hasattr(SDPBackend, backends[args.sdpa_backend]):
            unavailable(f"--sdpa-backend {args.sdpa_backend}: this PyTorch ({torch.__version__}) lacks it")

    device = torch.device("cuda")
    props = torch.cuda.get_device_properties(device)
    description = f"cuda:{torch.cuda.current_device()} {props.name} (sm_{props.major}{props.minor})"
    command = " ".join(shlex.quote(x) for x in [sys.argv[0]] + list(argv))
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
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

    def time_us(fn):
        for _ in range(args.warmup):
            fn()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(args.iters):
            fn()
        stop.record()
        stop.synchronize()
        return 1000.0 * start.elapsed_time(stop) / args.iters

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
                fwd_us = in_backend(lambda: time_us(fwd))
                saved["out"] = in_backend(forward)
                bwd_us = in_backend(lambda: time_us(bwd))
                fwd_bwd_us = in_backend(lambda: time_us(fwd_bwd))
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
        report = {
            "benchmark": "attention",
            "version": f"torch {torch.__version__}",
            "args": {"batch": args.batch, "seq": args.seqs, "heads": args.heads, "head_dim": args.head_dims,
                     "provider": [provider], "dtype": "bf16", "iters": args.iters, "warmup": args.warmup,
                     "seed": args.seed, "sdpa_backend": args.sdpa_backend},
            "command": command,
            "device": description,
            "backend": "cuda",
            "date": date,
            "host": platform.node(),
            "environment": {k: v for k, v in os.environ.items()
                            if k.startswith(("SCMOE_", "TORCH_", "CUDNN_")) or k == "CUDA_VISIBLE_DEVICES"},
            "notes": notes,
            "rows": rows,
            "summary": {},
            "wrong": 0,
        }
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
            f.write("\n")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
