#!/usr/bin/env python3
"""The PyTorch peers of the GPU acceptance run, without a GPU:

  peers_test.py moe-layer ROOT [--parts cli,torch]   launch/moe_layer_torch.py
  peers_test.py gpt2-moe  ROOT [--parts cli,torch]   launch/gpt2_moe_torch.py

  cli    with this interpreter, its site-packages off (-S: no torch, whatever is installed): --help
         names every flag, bad command lines exit 2, a run exits 3 with a one-line message
  torch  with $SCMOE_PEER_PYTHON (an interpreter with torch, and transformers for moe-layer): tiny runs on
         the CPU, every JSON field there and its numbers positive and finite, the TFLOP/s and MFU from the
         FLOP counts scmoe uses; exit 3 for --device cuda without a GPU (and for moe-layer without
         transformers). Without $SCMOE_PEER_PYTHON the torch part prints SKIP lines: the test then exits 0
         when the cli part ran too, and 77 (ctest's SKIP_RETURN_CODE) when the torch part was all asked for.
"""

import json
import math
import os
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_check_util import check, finish, write  # noqa: E402

EXIT_SKIP = 77
CASE, ROOT = sys.argv[1], os.path.abspath(sys.argv[2])
PARTS = sys.argv[4].split(",") if len(sys.argv) > 4 and sys.argv[3] == "--parts" else ["cli", "torch"]
SCRIPT = os.path.join(ROOT, "launch", {"moe-layer": "moe_layer_torch.py", "gpt2-moe": "gpt2_moe_torch.py"}[CASE])
PEER_PYTHON = os.environ.get("SCMOE_PEER_PYTHON", "")


def run(python, args, env=None, timeout=100):
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run(python + [SCRIPT] + args, capture_output=True, text=True, env=e, timeout=timeout)


def positive_finite(row, keys):
    return all(isinstance(row.get(k), (int, float)) and math.isfinite(row[k]) and row[k] > 0 for k in keys)


def close(a, b):
    return abs(a - b) <= 1e-9 * max(abs(a), abs(b))


# ---- cli: no torch -------------------------------------------------------------------------------------

FLAGS = {
    "moe-layer": ["--tokens", "--hidden", "--ffn", "--experts", "--top-k", "--dtype", "--experts-impl", "--device",
                  "--iters", "--warmup", "--seed", "--json", "swiglu", "--dispatch dropless", "Exit status"],
    "gpt2-moe": ["--mode", "--variants", "--preset", "--layers", "--hidden", "--heads", "--seq", "--ffn", "--experts",
                 "--expert-ffn", "--vocab", "--steps", "--batch", "--peak-tflops", "--compile-budget-s", "--device",
                 "--seed", "--json", "scmoe-train --preset gpt2-moe-small", "Exit status"],
}
BAD = {
    "moe-layer": [["--bogus"], ["--tokens", "0"], ["--tokens", "1X"], ["--top-k", "9", "--experts", "8"],
                  ["--experts-impl", "fast"], ["--dtype", "f16"], ["-n", "0"], ["extra"]],
    "gpt2-moe": [["--bogus"], ["--mode", "jit"], ["--variants", "top9"], ["--steps", "1"], ["--layers", "3"],
                 ["--hidden", "30", "--heads", "4"], ["--compile-budget-s", "0"], ["--vocab", "100"]],
}
RUN_ARGS = {"moe-layer": ["--device", "cpu", "--tokens", "64"], "gpt2-moe": ["--device", "cpu", "--steps", "2"]}


def part_cli():
    python = [sys.executable, "-S"]
    r = run(python, ["--help"])
    missing = [f for f in FLAGS[CASE] if f not in r.stdout]
    check(r.returncode == 0 and not missing, "--help exits 0 and names every flag, the scmoe command and the exit "
          "statuses", f"rc {r.returncode}, missing {missing}\n{r.stderr}")
    for args in BAD[CASE]:
        r = run(python, args)
        check(r.returncode == 2 and "error:" in r.stderr, f"bad command line {args}: exit 2 with the reason",
              f"rc {r.returncode}\n{r.stderr}")
    r = run(python, RUN_ARGS[CASE])
    lines = r.stderr.strip().splitlines()
    check(r.returncode == 3 and len(lines) == 1 and "PyTorch is not available" in lines[0] and not r.stdout,
          "without torch: exit 3 and a one-line message", f"rc {r.returncode}\n{r.stdout}{r.stderr}")


# ---- torch: tiny CPU runs --------------------------------------------------------------------------------

TOP_FIELDS = ["benchmark", "version", "args", "command", "compare_with", "peer_note", "device", "backend", "date",
              "host", "environment", "notes", "rows", "summary"]


def cuda_without_gpu(python, args):
    probe = subprocess.run(python + ["-c", "import torch; print(torch.cuda.is_available())"], capture_output=True,
                           text=True)
    if probe.stdout.strip() == "True":
        print("SKIP: --device cuda without a GPU: this machine has one")
        return
    r = run(python, args)
    check(r.returncode == 3 and "no CUDA GPU" in r.stderr, "--device cuda without a GPU: exit 3 and why",
          f"rc {r.returncode}\n{r.stderr}")


def run_report(python, args, out, benchmark, what):
    """Runs the peer with `args` (which write -J `out`); the report when it exited 0 with the report fields
    of scmoe-bench's and the peer's, for `benchmark` on the CPU backend, else None (the checks say why)."""
    r = run(python, args)
    check(r.returncode == 0, f"{what}: exit 0", f"rc {r.returncode}\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    if r.returncode != 0:
        return None
    with open(out) as f:
        j = json.load(f)
    check(all(x in j for x in TOP_FIELDS) and j["benchmark"] == benchmark and j["backend"] == "cpu",
          "JSON: the report fields of scmoe-bench's and the peer's", str(sorted(j)))
    return j


def torch_moe_layer(python, d):
    out = os.path.join(d, "layer.json")
    H, F, E, k = 32, 48, 4, 2
    j = run_report(python, ["--device", "cpu", "--tokens", "64,128", "--hidden", str(H), "--ffn", str(F), "--experts",
                            str(E), "--top-k", str(k), "-n", "2", "-w", "1", "--experts-impl", "auto,eager", "-J", out],
                   out, "layer", "tiny CPU run")
    if j is None:
        return
    check("--activation swiglu --dispatch dropless" in j["compare_with"] and "swiglu" in j["peer_note"],
          "JSON: the scmoe command to compare with and the note on the experts' activation", j["compare_with"])
    rows = j["rows"]
    check([(x["provider"].rsplit("-", 1)[-1] if "eager" in x["provider"] else "auto", x["tokens"]) for x in rows]
          == [("auto", 64), ("auto", 128), ("eager", 64), ("eager", 128)],
          "a row per implementation and token count", json.dumps(rows)[:400])
    ok = True
    for x in rows:
        flops = 2.0 * x["tokens"] * k * H * (2 * F + F)  # bench/layer_common.cpp expert_forward_flops, dropless
        ok &= (positive_finite(x, ["fwd_us", "fwd_tokens_per_s", "fwd_tflops", "fwd_bwd_us", "train_tokens_per_s",
                                   "fwd_bwd_tflops"])
               and (x["experts"], x["top_k"], x["hidden"], x["ffn"], x["dispatch"], x["activation"], x["dtype"])
               == (E, k, H, F, "dropless", "swiglu", "bf16")
               and close(x["fwd_tflops"], flops / (x["fwd_us"] * 1e-6) / 1e12)
               and close(x["fwd_bwd_tflops"], 3 * flops / (x["fwd_bwd_us"] * 1e-6) / 1e12)
               and close(x["train_tokens_per_s"], x["tokens"] / (x["fwd_bwd_us"] * 1e-6)))
    check(ok, "rows: the shape, positive finite times and rates, TFLOP/s from scmoe's expert FLOP count",
          json.dumps(rows, indent=1)[:1500])
    cuda_without_gpu(python, ["--tokens", "64"])
    # transformers missing while torch is there: a package of that name that fails to import.
    os.makedirs(os.path.join(d, "fake", "transformers"))
    write(os.path.join(d, "fake", "transformers", "__init__.py"), "raise ImportError('no transformers here')\n")
    r = run(python, ["--device", "cpu", "--tokens", "64"], env={"PYTHONPATH": os.path.join(d, "fake")})
    check(r.returncode == 3 and "transformers" in r.stderr and len(r.stderr.strip().splitlines()) == 1,
          "without transformers: exit 3 and a one-line message", f"rc {r.returncode}\n{r.stderr}")


def torch_gpt2_moe(python, d):
    out = os.path.join(d, "train.json")
    L, H, S, F, E, B, steps, peak = 2, 32, 16, 64, 4, 2, 3, 0.5
    shape = ["--layers", str(L), "--hidden", str(H), "--heads", "2", "--seq", str(S), "--ffn", str(F), "--expert-ffn",
             str(F), "--experts", str(E)]
    # The compile budget is shorter than starting Python with torch: that run must come back as a timeout
    # (killed) while the eager ones finish.
    j = run_report(python, ["--device", "cpu"] + shape + ["--batch", str(B), "--steps", str(steps), "--variants",
                                                          "scmoe-pos2,top2", "--mode", "eager,compile",
                                                          "--compile-budget-s", "0.5", "--peak-tflops", str(peak),
                                                          "-J", out],
                   out, "train", "tiny CPU run, eager and a compile run over its budget")
    if j is None:
        return
    check(j["compare_with"].startswith("scmoe-train --preset gpt2-moe-small") and "--variants scmoe-pos2,top2"
          in j["compare_with"], "JSON: the scmoe-train command to compare with", j["compare_with"])
    rows = j["rows"]
    check([(x["variant"], x["mode"], x["status"]) for x in rows]
          == [("scmoe-pos2", "eager", "ok"), ("scmoe-pos2", "compile", "timeout"), ("top2", "eager", "ok"),
              ("top2", "compile", "timeout")], "a row per variant and mode; compile over budget: 'timeout'",
          json.dumps(rows)[:600])
    check(all("not compiled within budget" in x["note"] for x in rows if x["status"] == "timeout"),
          "a timeout row says 'not compiled within budget'")
    # scmoe/models/lm.cpp train_flops_per_token, counted here from the shapes: 6 x the parameters a token uses
    # (no position table, experts top_k times) + 6 x layers x hidden x seq.
    attn, mlp = H + 3 * H * H + H * H, H + 2 * H * F
    moe_top1 = 2 * H + H * E + 2 * H * F + 2 * H * F + H  # norms x, s; router; one expert; shared; CG
    moe_top2 = H + H * E + 2 * 2 * H * F
    lm = 256 * H + H
    expected = {v: 6.0 * (lm + 2 * attn + mlp + moe) + 6.0 * L * H * S
                for v, moe in (("scmoe-pos2", moe_top1), ("top2", moe_top2))}
    ok = True
    for x in [x for x in rows if x["status"] == "ok"]:
        ok &= (positive_finite(x, ["tokens_per_s", "step_ms", "median_step_ms", "first_loss", "final_loss",
                                   "flops_per_token", "model_tflops_per_gpu", "mfu_pct", "first_step_s", "params"])
               and x["steps"] == steps and x["batch"] == B and x["seq"] == S and x["peak_tflops"] == peak
               and x["flops_per_token"] == expected[x["variant"]]
               and close(x["model_tflops_per_gpu"], x["tokens_per_s"] * x["flops_per_token"] / 1e12)
               and close(x["mfu_pct"], 100 * x["model_tflops_per_gpu"] / peak))
    check(ok, "ok rows: positive finite numbers, FLOPs per token as scmoe-train's, TFLOP/s and MFU from them",
          json.dumps(rows, indent=1)[:2000])
    cuda_without_gpu(python, ["--steps", "2"])


def part_torch():
    if not PEER_PYTHON:
        print("SKIP: the torch part: SCMOE_PEER_PYTHON is not set (an interpreter with torch"
              + (" and transformers" if CASE == "moe-layer" else "") + "; e.g. python3 -m venv /opt/peer-venv && "
              "/opt/peer-venv/bin/pip install torch transformers)")
        return False
    with tempfile.TemporaryDirectory() as d:
        {"moe-layer": torch_moe_layer, "gpt2-moe": torch_gpt2_moe}[CASE]([PEER_PYTHON], d)
    return True


if "cli" in PARTS:
    part_cli()
torch_ran = "torch" in PARTS and part_torch()
if PARTS == ["torch"] and not torch_ran:
    sys.exit(EXIT_SKIP)
finish(f"peers_test {CASE}" + ("" if torch_ran or "torch" not in PARTS else " (torch part skipped)"))
