#!/usr/bin/env python3
"""Every row the ScMoE paper reports, predicted by the emulator and compared with the paper.

The paper (Cai et al., ICML 2025; docs/scmoe-paper-setup.md quotes every number and its place)
reports speedups over top-2 MoE (Tables 1, 2 and 4, one iteration, train and inference), the
all-to-all's share of the MoE time (Fig. 1) and how much of the communication ScMoE overlaps with
block-level speedups (Fig. 8). This script states each of those rows once (ROWS below), runs the
emulator commands that predict them (`scmoe-train --backend emu` for the language models end to end,
`scmoe-bench block --backend emu` for block rows and for SwinV2-MoE-S end to end, composed from its four
stages' block runs: COMPOSED), and prints each row with its error, the mean and largest
|error|, and whether every sign (faster or slower than top-2) and every ranking of the variants
within a table agrees with the paper.

  python3 launch/paper_table.py --bin build-emu                    # run everything, print markdown
  python3 launch/paper_table.py --bin build-emu --stack paper -J t.json -o outputs/
  python3 launch/paper_table.py --dry-run                          # the commands only
  python3 launch/paper_table.py --replay outputs/                  # recompute from saved outputs

Rows whose workload the emulator cannot run (a variant, preset or flag it refuses) are listed as
"not run" with the tool's error, never dropped. Errors are relative: predicted / paper - 1. The
summary's mean and max are over the speedup rows (Tables 1, 2, 4 and Fig. 8's block speedups); the
share rows (Fig. 1, Fig. 8's overlap) are listed with their error beside them. These are emulator
predictions, not measurements.
"""
import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile

# --- The runs: one emulator command each; several rows read one run. -----------------------------
# Shapes and settings from docs/scmoe-paper-setup.md (Table 8 and 9); where the paper is silent
# (batch, the 2-node network, GPT3-MoE-XL's shortcut position) the choice is named in `assumed`.
TRAIN = "scmoe-train"
BLOCK = "scmoe-bench"

RUNS = {
    # Table 1 is SwinV2-MoE-S end to end: its four stages, each a block run of its preset (scmoe-bench
    # block --preset swinv2-moe-s-stageN, bench/block_presets.cpp), composed below (COMPOSED) as the
    # model runs them: 2 + 2 + 18 + 2 blocks, MoE only in stages 3 and 4.
    "swin-s1": {
        "tool": BLOCK,
        "paper_stack": "paper-swin",
        "args": "block --backend emu --gpu a30 --ranks 8 --preset swinv2-moe-s-stage1 --variants dense -n 3 -w 2 -c 0",
        "assumed": "stage 1 (2 dense blocks): 128 images per GPU; Swin's shifted windows not costed",
    },
    "swin-s2": {
        "tool": BLOCK,
        "paper_stack": "paper-swin",
        "args": "block --backend emu --gpu a30 --ranks 8 --preset swinv2-moe-s-stage2 --variants dense -n 3 -w 2 -c 0",
        "assumed": "as swin-s1, stage 2",
    },
    "swin-s3": {
        "tool": BLOCK,
        "paper_stack": "paper-swin",
        "args": "block --backend emu --gpu a30 --ranks 8 --preset swinv2-moe-s-stage3 "
                "--variants top2,top1,shared,scmoe-pos1,scmoe-pos2,scmoe-pos3 -n 3 -w 2 -c 0",
        "assumed": "stage 3 (9 [dense, MoE] pairs), where every variant applies: 128 images per GPU",
    },
    "swin-s4": {
        "tool": BLOCK,
        "paper_stack": "paper-swin",
        "args": "block --backend emu --gpu a30 --ranks 8 --preset swinv2-moe-s-stage4 --variants top2 -n 3 -w 2 -c 0",
        "assumed": "stage 4 (a [dense, MoE] pair) stays top-2 in every variant (the paper applies ScMoE to "
                   "stage 3 only and says nothing of stage 4 for its other variants)",
    },
    "t2-gpt2": {
        "tool": TRAIN,
        "args": "--backend emu --gpu a800 --preset gpt2-moe-medium --vocab 50257 --ranks 8 --steps 4 --batch 4 "
                "--capacity-factor 2.0 --variants top2,shared,scmoe-pos2 --infer-passes 2 --quiet",
        "assumed": "4 sequences of 2048 per GPU (the paper gives no batch); 8 experts (Table 8 says 16, "
                   "Table 7 and Fig. 13 say 8)",
    },
    "t2-llama": {
        "tool": TRAIN,
        "args": "--backend emu --gpu a800 --preset llama2-moe --ranks 8 --steps 4 --batch 2 "
                "--capacity-factor 2.0 --variants every-block-top2,every-block-shared,every-block-pos1 "
                "--infer-passes 2 --quiet",
        "assumed": "2 sequences of 2048 per GPU (the paper gives no batch: the largest power of two whose "
                   "training fits 80 GB under the paper stack, whose unfused attention keeps its scores); SwiGLU "
                   "intermediate size from LLaMA's rule (the paper gives none); under the paper stack, LLaMA-2's "
                   "reference model code in fairseq's loop (fairseq defines no LLaMA)",
        # LLaMA-2's reference attention and RMSNorm (meta-llama/llama llama/model.py) in fairseq's loop.
        "paper_stack": "docs/emu/stack/paper-llama.json",
    },
    "t4": {
        "tool": TRAIN,
        "args": "--backend emu --gpu a800 --preset gpt3-moe-xl --vocab 50257 --ranks 8 --steps 4 --batch 1 "
                "--capacity-factor 2.0 --variants top2,scmoe-pos2,top3,scmoe2 --infer-passes 2 --quiet",
        "assumed": "1 sequence of 2048 per GPU (the largest power of two whose training fits 80 GB under the "
                   "paper stack); ScMoE at Pos-2 (the paper's GPT default; Table 4 does not say)",
        # fairseq's GPT-3 architectures train without dropout (base_gpt3_architecture).
        "paper_stack": "docs/emu/stack/paper-gpt3.json",
    },
    # Fig. 1 and Fig. 8: a block pair [dense, MoE] of SwinV2-MoE-S's stage 3 (preset of scmoe-bench).
    "blk-a30": {
        "tool": BLOCK,
        "paper_stack": "paper-swin",
        "args": "block --backend emu --gpu a30 --ranks 8 --preset swinv2-moe-s-stage3 "
                "--variants top2,top1,shared,scmoe-pos2 -n 3 -w 2 -c 0",
        "assumed": "ScMoE at Pos-2 in Fig. 8 (not stated); 128 images per GPU; the stack's pipeline",
    },
    "blk-a800": {
        "tool": BLOCK,
        "paper_stack": "paper-swin",
        "args": "block --backend emu --gpu a800 --ranks 8 --preset swinv2-moe-s-stage3 "
                "--variants top2,top1,shared,scmoe-pos2 -n 3 -w 2 -c 0",
        "assumed": "as blk-a30",
    },
    "blk-2node": {
        "tool": BLOCK,
        "paper_stack": "paper-swin",
        "args": "block --backend emu --gpu a800 --cluster a800-2x8 --ranks 16 --preset swinv2-moe-s-stage3 "
                "--experts 16 --variants top2,top1,shared,scmoe-pos2 -n 3 -w 2 -c 0",
        "assumed": "the 2-node network is the a800-2x8 preset's (the paper says only 'Ethernet'); 16 experts",
    },
    # Fig. 8 names its pipelined baselines: "Top2P" and "Top1P" are top-k with Tutel's pipelining
    # (--chunks auto: scmoe's pipeline, which with one expert per GPU slices its rows as Tutel's
    # a2a_ffn_overlap_degree does); "Top1+SE1", the shared expert, carries no P (--chunks 1).
    "blk-a30-piped": {
        "tool": BLOCK,
        "paper_stack": "paper-swin",
        "args": "block --backend emu --gpu a30 --ranks 8 --preset swinv2-moe-s-stage3 --variants top2,top1 "
                "--chunks auto -n 3 -w 2 -c 0",
        "assumed": "Top2P/Top1P pipelined at the count scmoe's scheduler picks (Tutel's degree is not stated)",
        "chunks": None,
    },
    "blk-a30-whole": {
        "tool": BLOCK,
        "paper_stack": "paper-swin",
        "args": "block --backend emu --gpu a30 --ranks 8 --preset swinv2-moe-s-stage3 --variants shared "
                "--chunks 1 -n 3 -w 2 -c 0",
        "assumed": "the shared-expert baseline unpipelined (Fig. 8's Top1+SE1 has no P)",
        "chunks": None,
    },
    "blk-2node-piped": {
        "tool": BLOCK,
        "paper_stack": "paper-swin",
        "args": "block --backend emu --gpu a800 --cluster a800-2x8 --ranks 16 --preset swinv2-moe-s-stage3 "
                "--experts 16 --variants top2,top1 --chunks auto -n 3 -w 2 -c 0",
        "assumed": "as blk-a30-piped",
        "chunks": None,
    },
    "blk-2node-whole": {
        "tool": BLOCK,
        "paper_stack": "paper-swin",
        "args": "block --backend emu --gpu a800 --cluster a800-2x8 --ranks 16 --preset swinv2-moe-s-stage3 "
                "--experts 16 --variants shared --chunks 1 -n 3 -w 2 -c 0",
        "assumed": "as blk-a30-whole",
        "chunks": None,
    },
}

# Runs composed from others: a model whose parts are separate block runs, one after the other in its
# iteration (a stage waits for the one before it), so its time is the sum of its parts' times, each
# counted as often as the model has it. A part's variant None is the row's (or its baseline's).
# Not in the sum: the patch embedding, the 2x2 patch mergings between stages, the classifier head,
# the optimizer and the data-parallel gradient all-reduce (overlapped with the backward by PyTorch's
# DDP in Swin's main_moe.py): the same for every variant but for the shared expert's parameters.
COMPOSED = {
    "t1": {"parts": [("swin-s1", 1, "dense"), ("swin-s2", 1, "dense"), ("swin-s3", 9, None), ("swin-s4", 1, "top2")],
           "assumed": "SwinV2-MoE-S end to end = stage 1 + stage 2 + 9 x stage 3's pair + stage 4's pair; patch "
                      "embedding and merging, head, optimizer and gradient all-reduce left out"},
}


def composed_time(parsed, parts, variant, metric):
    """The composed model's time for `variant` (train_us or fwd_us); KeyError naming what is missing."""
    key = "train_us" if metric == "train" else "fwd_us"
    total = 0.0
    for run, count, fixed in parts:
        v = fixed or variant
        if v not in parsed[run]:
            raise KeyError(f"variant {v} missing from {run}'s output")
        total += count * parsed[run][v][key]
    return total


# The pipeline of every other run is the stack's: the paper stack's Tutel runs unpipelined (its
# fairseq example passes no a2a_ffn_overlap_degree, whose default is 1: tutel 82af7aa
# tutel/impls/moe_layer.py, "a2a_ffn_overlap_degree=1"; nor does Swin-Transformer's MoEMlp), so those
# runs get --chunks 1 under --stack paper; under any other stack scmoe's default, --chunks auto.
# (The requested stack decides: paper's runs, on whichever of its stacks, run unpipelined.)
def stack_chunks(stack):
    return ["--chunks", "1"] if stack == "paper" else []


# The paper ran its language models on fairseq and SwinV2-MoE-S on Swin-Transformer's training code
# (both with Tutel): under --stack paper a run with a "paper_stack" takes that one instead, a built-in
# name (the Swin runs: paper-swin, that code's, scmoe/kernels/emu/stack.cpp) or a stack file under
# docs/emu/stack/ (relative to the repository, printed relative to the working directory; fairseq's
# GPT-3 runs without dropout, LLaMA-2 runs its reference model code). Every other stack is passed as it is.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_stack(run, stack):
    own = RUNS[run].get("paper_stack") if stack == "paper" else None
    if not own:
        return stack
    return os.path.relpath(os.path.join(ROOT, own)) if own.endswith(".json") else own

# --- The rows. kind: speedup (variant over the baseline) or share (percent). ---------------------
# metric for scmoe-train runs: train | infer; for block runs: train | a2a_share | overlap.
ROWS = [
    # Table 1: SwinV2-MoE-S, 8x A30 PCIe, speedup over top-2 (train / inference, one iteration).
    *[{"table": "Table 1", "run": "t1", "variant": v, "label": l, "metric": m, "paper": p, "kind": "speedup"}
      for v, l, tr, inf in [("top1", "top-1", 1.27, 1.39), ("shared", "shared expert", 1.24, 1.35),
                            ("scmoe-pos1", "ScMoE Pos-1", 1.36, 1.54), ("scmoe-pos2", "ScMoE Pos-2", 1.43, 1.66),
                            ("scmoe-pos3", "ScMoE Pos-3", 1.49, 1.82)]
      for m, p in (("train", tr), ("infer", inf))],
    # Table 2: 8x A800 NVLink.
    *[{"table": "Table 2 GPT2-MoE-Medium", "run": "t2-gpt2", "variant": v, "label": l, "metric": m, "paper": p,
       "kind": "speedup"}
      for v, l, tr, inf in [("shared", "shared expert", 1.04, 1.06), ("scmoe-pos2", "ScMoE (Pos-2)", 1.12, 1.17)]
      for m, p in (("train", tr), ("infer", inf))],
    *[{"table": "Table 2 LLaMA2-MoE", "run": "t2-llama", "variant": v, "label": l, "metric": m, "paper": p,
       "kind": "speedup", "baseline": "every-block-top2"}
      for v, l, tr, inf in [("every-block-shared", "shared expert", 1.06, 1.11),
                            ("every-block-pos1", "ScMoE (Pos-1)", 1.14, 1.21)]
      for m, p in (("train", tr), ("infer", inf))],
    # Table 4: GPT3-MoE-XL, 8x A800 NVLink.
    *[{"table": "Table 4 GPT3-MoE-XL", "run": "t4", "variant": v, "label": l, "metric": m, "paper": p,
       "kind": "speedup"}
      for v, l, tr, inf in [("scmoe-pos2", "ScMoE", 1.12, 1.18), ("top3", "top-3", 0.94, 0.92),
                            ("scmoe2", "ScMoE-2", 1.05, 1.08)]
      for m, p in (("train", tr), ("infer", inf))],
    # Fig. 1: the all-to-all's share of top-2's MoE time (percent).
    {"table": "Fig. 1", "run": "blk-a30", "variant": "top2", "label": "a2a share, 8x A30", "metric": "a2a_share",
     "paper": 60.0, "kind": "share"},
    {"table": "Fig. 1", "run": "blk-a800", "variant": "top2", "label": "a2a share, 8x A800", "metric": "a2a_share",
     "paper": 15.0, "kind": "share"},
    {"table": "Fig. 1", "run": "blk-2node", "variant": "top2", "label": "a2a share, 2x8 A800", "metric": "a2a_share",
     "paper": 50.0, "kind": "share"},
    # Fig. 8: share of ScMoE's communication overlapped (percent) and block-level speedups.
    {"table": "Fig. 8", "run": "blk-a30", "variant": "scmoe-pos2", "label": "ScMoE overlap, 8x A30",
     "metric": "overlap", "paper": 70.0, "kind": "share"},
    {"table": "Fig. 8", "run": "blk-a800", "variant": "scmoe-pos2", "label": "ScMoE overlap, 8x A800",
     "metric": "overlap", "paper": 100.0, "kind": "share"},
    {"table": "Fig. 8", "run": "blk-2node", "variant": "scmoe-pos2", "label": "ScMoE overlap, 2x8 A800",
     "metric": "overlap", "paper": 100.0, "kind": "share"},
    {"table": "Fig. 8 A30", "run": "blk-a30", "variant": "scmoe-pos2", "baseline": "shared",
     "baseline_run": "blk-a30-whole", "label": "ScMoE vs shared expert", "metric": "train", "paper": 1.27,
     "kind": "speedup"},
    {"table": "Fig. 8 A30", "run": "blk-a30", "variant": "scmoe-pos2", "baseline": "top2",
     "baseline_run": "blk-a30-piped", "label": "ScMoE vs pipelined top-2", "metric": "train", "paper": 1.42, "kind": "speedup"},
    {"table": "Fig. 8 A30", "run": "blk-a30", "variant": "scmoe-pos2", "baseline": "top1",
     "baseline_run": "blk-a30-piped", "label": "ScMoE vs pipelined top-1", "metric": "train", "paper": 1.15, "kind": "speedup"},
    {"table": "Fig. 8 2-node", "run": "blk-2node", "variant": "scmoe-pos2", "baseline": "shared",
     "baseline_run": "blk-2node-whole", "label": "ScMoE vs shared expert", "metric": "train", "paper": 1.24,
     "kind": "speedup"},
    {"table": "Fig. 8 2-node", "run": "blk-2node", "variant": "scmoe-pos2", "baseline": "top2",
     "baseline_run": "blk-2node-piped", "label": "ScMoE vs pipelined top-2", "metric": "train", "paper": 1.43, "kind": "speedup"},
]


# The language-model rows run at the paper's stated capacity factor (Table 8: 2.00), which Tutel pads
# every expert to. --lm-dispatch dropless is a sensitivity, not the comparison: Tutel's own fairseq
# example passes 'capacity_factor': 0.0 (tutel 82af7aa fairseq_patch.diff), whose capacity is the
# largest expert load (fast_dispatch.py, "capacity = locations2.max()"); under the emulator's
# balanced routing every expert's load is the same, so scmoe's dropless dispatch runs those rows.
LM_DISPATCH = ("capacity", "dropless")


def command(run, bin_dir, stack, lm_dispatch="capacity"):
    spec = RUNS[run]
    exe = spec["tool"]
    if bin_dir:  # an install prefix's bin/ holds both tools; a build folder has launch/ and bench/
        flat = os.path.join(bin_dir, spec["tool"])
        exe = flat if os.path.exists(flat) else os.path.join(bin_dir, "launch" if spec["tool"] == TRAIN else "bench",
                                                             spec["tool"])
    args = shlex.split(spec["args"])
    if lm_dispatch == "dropless" and spec["tool"] == TRAIN:
        i = args.index("--capacity-factor")
        args[i:i + 2] = ["--dispatch", "dropless"]
    if stack:
        args += ["--stack", run_stack(run, stack)]
    if spec.get("chunks", "stack") == "stack":
        args += stack_chunks(stack)
    return [exe] + args


# --- Reading the tools' outputs. --------------------------------------------------------------------
def parse_train_summary(text):
    """scmoe-train's summary table: {variant: {"train_ms": .., "fwd_ms": ..}}."""
    out, header = {}, None
    for line in text.splitlines():
        if line.startswith("#  variant"):
            header = True
            continue
        if header and line.strip() and not line.startswith("#"):
            f = line.split()
            # variant steps first final tok/s ms/step exposed% dropped speedup loss-vs-first [fwd-ms fwd-speedup]
            if len(f) >= 10:
                out[f[0]] = {"train_ms": float(f[5]), "fwd_ms": float(f[10]) if len(f) >= 12 else None,
                             "exposed_pct": float(f[6])}
        elif header and line.startswith("#"):
            header = None if out else header
    return out


def parse_block_json(doc):
    """scmoe-bench block -J: {variant: row} (the first token count's rows)."""
    out = {}
    for row in doc.get("rows", []):
        out.setdefault(row["variant"], row)
    return out


def metric_value(run, results, variant, metric, baseline, baseline_results=None):
    """The predicted value of a row, or raise KeyError naming what is missing. The baseline comes
    from `baseline_results` (another run's) when given, else from the same run."""
    tool = RUNS[run]["tool"]
    if variant not in results:
        raise KeyError(f"variant {variant} missing from the run's output")
    base = results if baseline_results is None else baseline_results
    if baseline not in base:
        raise KeyError(f"baseline {baseline} missing from the run's output")
    r, b = results[variant], base[baseline]
    if tool == TRAIN:
        key = "train_ms" if metric == "train" else "fwd_ms"
        if r[key] is None or b[key] is None:
            raise KeyError(f"{key} missing (no --infer-passes?)")
        return b[key] / r[key]
    if metric == "train":
        return b["train_us"] / r["train_us"]
    if metric == "fwd":
        return b["fwd_us"] / r["fwd_us"]
    if metric == "a2a_share":
        return r["a2a_of_moe_pct"]
    if metric == "overlap":
        # exposed_comm_pct: time with an a2a running and no compute, as a share of the traced train
        # steps; a2a_us: the step's all-to-alls measured op by op. Overlapped = 1 - exposed / a2a.
        exposed_us = r["exposed_comm_pct"] / 100.0 * r["train_us"]
        return 100.0 * max(0.0, 1.0 - exposed_us / r["a2a_us"]) if r["a2a_us"] > 0 else float("nan")
    raise KeyError(f"unknown metric {metric}")


def first_error(text, returncode):
    """The line that says why a tool refused: the first naming an error, else the first line."""
    lines = [l.strip() for l in text.splitlines() if l.strip()]
    named = [l for l in lines if re.search(r"error|does not exist|unknown|not a|must|refus", l, re.I)]
    return ((named or lines or [f"exit status {returncode}"])[0])[:300]


def run_all(args):
    outputs = {}
    for run in RUNS:
        if args.only and run not in args.only:
            continue
        cmd = command(run, args.bin, args.stack, args.lm_dispatch)
        if args.replay:
            path = os.path.join(args.replay, run + (".txt" if RUNS[run]["tool"] == TRAIN else ".json"))
            if not os.path.exists(path):
                outputs[run] = {"error": f"no saved output {path}", "command": cmd}
                continue
            with open(path) as f:
                text = f.read()
            err_path = os.path.join(args.replay, run + ".error")
            outputs[run] = {"text": text, "command": cmd}
            if os.path.exists(err_path):
                with open(err_path) as f:
                    outputs[run] = {"error": f.read().strip(), "command": cmd}
            continue
        json_path = None
        if args.outdir:  # a run's earlier output (or error) must not outlive this one
            for ext in (".txt", ".json", ".error"):
                stale = os.path.join(args.outdir, run + ext)
                if os.path.exists(stale):
                    os.remove(stale)
        if RUNS[run]["tool"] == BLOCK:
            if args.outdir:
                os.makedirs(args.outdir, exist_ok=True)
            json_path = (os.path.join(args.outdir, run + ".json") if args.outdir
                         else os.path.join(tempfile.gettempdir(), f"paper_table_{os.getpid()}_{run}.json"))
            cmd = cmd + ["-J", json_path]
        print(f"# running {run}: {shlex.join(cmd)}", file=sys.stderr, flush=True)
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            outputs[run] = {"error": first_error(p.stderr + "\n" + p.stdout, p.returncode), "command": cmd}
        else:
            text = open(json_path).read() if json_path else p.stdout
            outputs[run] = {"text": text, "command": cmd}
        if args.outdir:
            os.makedirs(args.outdir, exist_ok=True)
            ext = ".txt" if RUNS[run]["tool"] == TRAIN else ".json"
            if "text" in outputs[run]:
                if not json_path:  # the block runs wrote their JSON there already
                    with open(os.path.join(args.outdir, run + ext), "w") as f:
                        f.write(outputs[run]["text"])
            else:
                with open(os.path.join(args.outdir, run + ".error"), "w") as f:
                    f.write(outputs[run]["error"] + "\n")
    return outputs


def evaluate(outputs):
    parsed = {}
    for run, o in outputs.items():
        if "text" in o:
            parsed[run] = (parse_train_summary(o["text"]) if RUNS[run]["tool"] == TRAIN
                           else parse_block_json(json.loads(o["text"])))
    rows = []
    for row in ROWS:
        r = dict(row)
        run = row["run"]
        baseline = row.get("baseline", "top2")
        r["baseline"] = baseline
        if run in COMPOSED:
            parts = COMPOSED[run]["parts"]
            if any(p not in outputs for p, _, _ in parts):
                continue
            failed = [p for p, _, _ in parts if p not in parsed]
            if failed:
                r["status"] = "not run: " + outputs[failed[0]]["error"]
            else:
                try:
                    r["predicted"] = (composed_time(parsed, parts, baseline, row["metric"]) /
                                      composed_time(parsed, parts, row["variant"], row["metric"]))
                    r["error"] = r["predicted"] / row["paper"] - 1.0
                    r["status"] = "ok"
                except KeyError as e:
                    r["status"] = "not run: " + str(e).strip("'\"")
            rows.append(r)
            continue
        base_run = row.get("baseline_run", run)
        if run not in outputs or base_run not in outputs:
            continue
        if run not in parsed or base_run not in parsed:
            r["status"] = "not run: " + outputs[run if run not in parsed else base_run]["error"]
        else:
            try:
                r["predicted"] = metric_value(run, parsed[run], row["variant"], row["metric"], baseline,
                                              parsed[base_run] if base_run != run else None)
                r["error"] = r["predicted"] / row["paper"] - 1.0
                r["status"] = "ok"
            except KeyError as e:
                r["status"] = "not run: " + str(e).strip("'\"")
        rows.append(r)
    return rows


def sign_agrees(row):
    """A speedup row: the variant is faster (> 1), or slower (< 1), in both."""
    return (row["paper"] > 1.0) == (row["predicted"] > 1.0)


def order(items, key):
    """Variant names from fastest to slowest by items[key], '=' joining equal values (3 decimals)."""
    ranked = sorted(items, key=lambda t: -t[key])
    out = []
    for i, t in enumerate(ranked):
        tie = i > 0 and round(t[key], 3) == round(ranked[i - 1][key], 3)
        out.append(("= " if tie else "") + t[0])
    return out


def rankings(rows):
    """Per table and metric, the order of the variants (with the baseline at 1.0) by paper and by
    prediction: [(table, metric, paper order, predicted order, agrees)]."""
    groups = {}
    for r in rows:
        if r["kind"] != "speedup" or r["status"] != "ok" or r["table"].startswith("Fig. 8"):
            continue
        groups.setdefault((r["table"], r["metric"]), []).append(r)
    out = []
    for (table, metric), rs in groups.items():
        base = rs[0]["baseline"]
        items = [(base, 1.0, 1.0)] + [(r["variant"], r["paper"], r["predicted"]) for r in rs]
        paper_order = order(items, 1)
        pred_order = order(items, 2)
        # Where the paper orders two variants, the prediction must order them the same way (a tie at
        # the printed 3 decimals does not); where the paper ties them (equal printed values), any order.
        agrees = all(a[1] == b[1] or (a[1] - b[1]) * (round(a[2], 3) - round(b[2], 3)) > 0
                     for i, a in enumerate(items) for b in items[i + 1:])
        out.append((table, metric, paper_order, pred_order, agrees))
    return out


def summarize(rows):
    ok = [r for r in rows if r["status"] == "ok"]
    sp = [r for r in ok if r["kind"] == "speedup"]
    errs = [abs(r["error"]) for r in sp]
    return {
        "rows": len(rows), "run": len(ok), "not_run": len(rows) - len(ok),
        "speedup_rows": len(sp),
        "mean_abs_error": sum(errs) / len(errs) if errs else None,
        "max_abs_error": max(errs) if errs else None,
        "signs_agree": sum(sign_agrees(r) for r in sp), "signs_checked": len(sp),
        "rankings": [{"table": t, "metric": m, "paper": p, "predicted": q, "agrees": a}
                     for t, m, p, q, a in rankings(rows)],
    }


def join_order(names):
    return " ".join(n if n.startswith("= ") else ("> " + n if i else n) for i, n in enumerate(names))


def markdown(rows, summary, stack, lm_dispatch="capacity"):
    sensitivity = (" LM rows dropless (a sensitivity: Tutel's fairseq example's dynamic capacity, not the paper's "
                   "stated factor 2.0)." if lm_dispatch == "dropless" else "")
    swin = " (SwinV2-MoE-S runs: paper-swin)" if run_stack("swin-s3", stack) != stack else ""
    lines = [f"Emulator predictions (stack: {stack or 'default'}{swin}) against the ScMoE paper; error = predicted / "
             "paper - 1." + sensitivity,
             "", "| source | row | metric | paper | predicted | error |", "|---|---|---|---|---|---|"]
    for r in rows:
        unit = "%" if r["kind"] == "share" else "x"
        label = r["label"] + (f" (vs {r['baseline']})" if r["table"].startswith("Fig. 8") and r["kind"] == "speedup" else "")
        if r["status"] == "ok":
            pred = f"{r['predicted']:.1f}{unit}" if unit == "%" else f"{r['predicted']:.3f}x"
            paper = f"{r['paper']:.0f}%" if unit == "%" else f"{r['paper']:.2f}x"
            lines.append(f"| {r['table']} | {label} | {r['metric']} | {paper} | {pred} | {100 * r['error']:+.1f}% |")
        else:
            paper = f"{r['paper']:.0f}%" if unit == "%" else f"{r['paper']:.2f}x"
            lines.append(f"| {r['table']} | {label} | {r['metric']} | {paper} | {r['status']} | |")
    s = summary
    lines.append("")
    if s["mean_abs_error"] is not None:
        lines.append(f"Speedup rows: {s['speedup_rows']}; mean |error| {100 * s['mean_abs_error']:.1f}%, "
                     f"max {100 * s['max_abs_error']:.1f}%; signs agree {s['signs_agree']}/{s['signs_checked']}.")
    for rk in s["rankings"]:
        lines.append(f"Ranking, {rk['table']} {rk['metric']}: paper {join_order(rk['paper'])}; predicted "
                     f"{join_order(rk['predicted'])}: {'agrees' if rk['agrees'] else 'DIFFERS'}.")
    lines.append(f"Rows not run: {s['not_run']} of {s['rows']}.")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Every figure printed is an emulator prediction, not a measurement.")
    ap.add_argument("--bin", help="a build folder (launch/scmoe-train, bench/scmoe-bench) or an install's bin/ (default: PATH)")
    ap.add_argument("--stack", help="pass --stack STACK to every command (scmoe, paper or a JSON file; under paper the "
                                     "SwinV2-MoE-S runs take paper-swin)")
    ap.add_argument("--only", help="comma list of runs: " + ",".join([*RUNS, *COMPOSED]) +
                    " (a composed run: its parts)")
    ap.add_argument("-o", "--outdir", help="save each run's output here (for --replay)")
    ap.add_argument("--replay", help="read the runs' outputs from this folder instead of running them")
    ap.add_argument("-J", "--json", help="also write rows and summary as JSON")
    ap.add_argument("--dry-run", action="store_true", help="print the commands and exit")
    ap.add_argument("--lm-dispatch", choices=LM_DISPATCH, default="capacity",
                    help="the language-model rows' MoE dispatch: capacity at the paper's factor 2.0 (default, the "
                         "comparison) or dropless (a sensitivity: Tutel's fairseq example's capacity_factor 0.0)")
    args = ap.parse_args()
    if args.only:
        args.only = set(args.only.split(","))
        unknown = args.only - set(RUNS) - set(COMPOSED)
        if unknown:
            ap.error(f"--only: unknown run(s) {', '.join(sorted(unknown))}; runs are {', '.join([*RUNS, *COMPOSED])}")
        for name in args.only & set(COMPOSED):  # a composed run is its parts
            args.only |= {p for p, _, _ in COMPOSED[name]["parts"]}
    if args.dry_run:
        for run, spec in RUNS.items():
            if not args.only or run in args.only:
                print(f"# {run} (assumed: {spec['assumed']})\n{shlex.join(command(run, args.bin, args.stack, args.lm_dispatch))}")
        return 0
    outputs = run_all(args)
    rows = evaluate(outputs)
    summary = summarize(rows)
    print(markdown(rows, summary, args.stack, args.lm_dispatch))
    for run in outputs:
        print(f"# {run}: {shlex.join(outputs[run]['command'])}  (assumed: {RUNS[run]['assumed']})")
    for name, c in COMPOSED.items():
        if all(p in outputs for p, _, _ in c["parts"]):
            parts = " + ".join(f"{n} x {p}" + (f" ({v})" if v else "") for p, n, v in c["parts"])
            print(f"# {name}: composed, {parts}  (assumed: {c['assumed']})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"stack": args.stack, "lm_dispatch": args.lm_dispatch, "rows": rows, "summary": summary,
                       "runs": {k: {"command": v["command"], "assumed": RUNS[k]["assumed"],
                                    **({"error": v["error"]} if "error" in v else {})}
                                for k, v in outputs.items()},
                       "composed": {k: {"parts": [list(p) for p in c["parts"]], "assumed": c["assumed"]}
                                    for k, c in COMPOSED.items()}}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
