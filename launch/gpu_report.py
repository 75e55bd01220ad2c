#!/usr/bin/env python3
"""The report of launch/gpu_check.sh, and the small jobs the script hands to it.

  gpu_report.py skips JUNIT [--json OUT]
      The GPU tests' outcome from ctest's JUnit file; exit 1 when one failed or skipped although a GPU is
      present (launch/gpu_test_skips.py).
  gpu_report.py spec --gpu-name NAME --bench SCMOE_BENCH --json OUT [--peak-tflops X]
      The dense bf16 peak of one GPU for the MFU, from scmoe's built-in GPU specs (launch/gpu_peak.py).
  gpu_report.py step --raw DIR --name NAME --status ok|failed|skipped|"not available" [--rc N] [--seconds S]
                     [--json FILE] [--note TEXT] -- CMD...
      Appends one step's outcome to DIR/steps.jsonl.
  gpu_report.py report --raw DIR --out DIR [--context KEY=VALUE ...] [--bundle BUNDLE_JSON]
      Merges DIR's results into OUT/report.json and OUT/report.md; exit 1 when a test or a benchmark failed
      or was skipped (the deadline); --bundle adds the offline bundle's machine facts and load checks
      (launch/gpu_bundle.py run).

The inputs of `report` (all in --raw; a missing one leaves its section saying so): steps.jsonl, tests.json,
<step>.json (scmoe-bench -J, launch/attention_torch.py), <step>.log, train.metrics.jsonl (scmoe-train
--metrics), spec.json, nvidia-smi-query.csv (nvidia-smi --query-gpu=index,name,driver_version,compute_cap,
memory.total --format=csv,noheader), nvidia-smi.txt, nvcc.txt, reruns.json (launch/gpu_test_rerun.py).
"""

import argparse
import json
import os
import re
import statistics
import sys

sys.dont_write_bytecode = True  # no __pycache__ in launch/ from the two modules below
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_peak import cmd_spec  # noqa: E402  (launch/gpu_peak.py)
from gpu_test_skips import cmd_skips  # noqa: E402  (launch/gpu_test_skips.py)

# ---- step ---------------------------------------------------------------------------------------------


def cmd_step(a):
    rec = {
        "name": a.name,
        "status": a.status,
        "rc": int(a.rc) if a.rc not in (None, "") else None,
        "seconds": int(a.seconds) if a.seconds not in (None, "") else None,
        "json": a.json or None,
        "note": a.note or "",
        "command": a.command,
    }
    with open(os.path.join(a.raw, "steps.jsonl"), "a") as f:
        f.write(json.dumps(rec) + "\n")
    return 0


# ---- report -------------------------------------------------------------------------------------------


def fmt(v):
    """A number as the markdown tables print it (the JSON keeps every digit)."""
    if v is None:
        return ""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if v != v or v in (float("inf"), float("-inf")):
            return str(v)
        if abs(v) >= 100:
            return f"{v:.0f}"
        if abs(v) >= 1:
            return f"{v:.2f}"
        return f"{v:.3g}"
    return str(v).replace("|", "\\|")


def md_table(rows, columns):
    """columns: (key, header) pairs; keys missing from every row are left out."""
    columns = [(k, h) for k, h in columns if any(k in r for r in rows)]
    if not rows or not columns:
        return "(no rows)\n"
    out = "| " + " | ".join(h for _, h in columns) + " |\n"
    out += "|" + "|".join("---" for _ in columns) + "|\n"
    for r in rows:
        out += "| " + " | ".join(fmt(r.get(k)) for k, _ in columns) + " |\n"
    return out


def generic_columns(rows):
    cols = []
    for r in rows:
        for k, v in r.items():
            if not isinstance(v, (dict, list)) and k not in cols:
                cols.append(k)
    return [(k, k) for k in cols]


GEMM_COLUMNS = [
    ("load", "load"),
    ("provider", "provider"),
    ("tokens", "tokens"),
    ("rows", "rows"),
    ("max_rows_per_expert", "max rows/expert"),
    ("grouped_us", "grouped µs"),
    ("grouped_tflops", "grouped TFLOP/s"),
    ("dense_us", "dense µs"),
    ("dense_tflops", "dense TFLOP/s"),
    ("ratio", "dense/grouped"),
    ("wrong", "#wrong"),
]
LAYER_COLUMNS = [
    ("dispatch", "dispatch"),
    ("tokens", "tokens"),
    ("fwd_us", "fwd µs"),
    ("fwd_tokens_per_s", "fwd tokens/s"),
    ("fwd_bwd_us", "fwd+bwd µs"),
    ("train_tokens_per_s", "fwd+bwd tokens/s"),
    ("experts_tflops", "experts fwd TFLOP/s"),
    ("experts_bwd_tflops", "experts bwd TFLOP/s"),
    ("dropped", "dropped"),
    ("wrong", "#wrong"),
]
BLOCK_COLUMNS = [
    ("tokens", "tokens"),
    ("variant", "variant"),
    ("fwd_us", "fwd µs"),
    ("train_us", "train µs"),
    ("backbone_us", "backbone µs"),
    ("a2a_us", "a2a µs"),
    ("a2a_of_moe_pct", "a2a/MoE %"),
    ("exposed_comm_pct", "exposed comm %"),
    ("link_cost_pct", "link cost %"),
    ("slot", "K"),
    ("chunks", "chunks"),
    ("speedup_vs_top2_fwd", "fwd speedup"),
    ("speedup_vs_top2_train", "train speedup"),
    ("wrong", "#wrong"),
]


ATTENTION_COLUMNS = [
    ("source", "source"),
    ("provider", "provider"),
    ("batch", "batch"),
    ("seq", "seq"),
    ("heads", "heads"),
    ("head_dim", "head_dim"),
    ("dtype", "dtype"),
    ("fwd_us", "fwd µs"),
    ("fwd_tflops", "fwd TFLOP/s"),
    ("bwd_us", "bwd µs"),
    ("fwd_bwd_us", "fwd+bwd µs"),
    ("fwd_bwd_tflops", "fwd+bwd TFLOP/s"),
    ("torch_over_scmoe_fwd", "torch/scmoe fwd"),
    ("torch_over_scmoe_fwd_bwd", "torch/scmoe fwd+bwd"),
    ("wrong", "#wrong"),
]
SHAPE = ("batch", "seq", "heads", "head_dim")


def attention_comparison(benchmarks):
    """Per shape tag: scmoe's rows and PyTorch's in one table, scmoe's rows with PyTorch's time / scmoe's for
    the same shape (the fastest PyTorch row of that shape), forward and forward+backward."""
    tags = sorted(
        {
            k[len("attention_") :]
            for k in benchmarks
            if k.startswith("attention_") and not k.startswith("attention_torch_")
        }
        | {k[len("attention_torch_") :] for k in benchmarks if k.startswith("attention_torch_")}
    )
    result = {}
    for tag in tags:
        ours, theirs = rows_of(benchmarks.get("attention_" + tag)), rows_of(benchmarks.get("attention_torch_" + tag))
        rows, other = [], []
        best = {}
        for r in theirs:
            if all(k in r for k in SHAPE):
                key = tuple(r[k] for k in SHAPE)
                for t in ("fwd_us", "fwd_bwd_us"):
                    if isinstance(r.get(t), (int, float)) and r[t] > 0:
                        best.setdefault(key, {})[t] = min(best.get(key, {}).get(t, float("inf")), r[t])
        for r in ours:
            row = dict(r, source="scmoe")
            theirs_best = best.get(tuple(r.get(k) for k in SHAPE), {})
            for t, col in (("fwd_us", "torch_over_scmoe_fwd"), ("fwd_bwd_us", "torch_over_scmoe_fwd_bwd")):
                if t in theirs_best and isinstance(r.get(t), (int, float)) and r[t] > 0:
                    row[col] = theirs_best[t] / r[t]
            rows.append(row)
        torch_shaped = [dict(r, source="PyTorch SDPA") for r in theirs if all(k in r for k in SHAPE)]
        rows += torch_shaped
        if len(torch_shaped) < len(theirs):
            other.append([r for r in theirs if not all(k in r for k in SHAPE)])
        result[tag] = {"rows": rows, "other_rows": other}
    return result


def layer_comparison(benchmarks):
    """scmoe's dropless layer rows against Mixtral's block (launch/moe_layer_torch.py) at the same token
    count: PyTorch's time / scmoe's, forward and forward+backward (> 1: scmoe is faster)."""
    ours = {r.get("tokens"): r for r in rows_of(benchmarks.get("layer")) if r.get("dispatch") == "dropless"}
    rows = []
    for t in rows_of(benchmarks.get("layer_torch")):
        o = ours.get(t.get("tokens"))
        row = {"tokens": t.get("tokens"), "peer": t.get("provider"), "peer_fwd_us": t.get("fwd_us"),
               "peer_fwd_bwd_us": t.get("fwd_bwd_us")}
        if o:
            row.update(scmoe_fwd_us=o.get("fwd_us"), scmoe_fwd_bwd_us=o.get("fwd_bwd_us"))
            for a, b, col in (("peer_fwd_us", "scmoe_fwd_us", "peer_over_scmoe_fwd"),
                              ("peer_fwd_bwd_us", "scmoe_fwd_bwd_us", "peer_over_scmoe_fwd_bwd")):
                if isinstance(row.get(a), (int, float)) and isinstance(row.get(b), (int, float)) and row[b] > 0:
                    row[col] = row[a] / row[b]
        rows.append(row)
    return rows


def train_comparison(benchmarks):
    """scmoe-train's rows and the PyTorch model's (launch/gpt2_moe_torch.py, eager and compiled): tokens/s
    and MFU, and scmoe's tokens/s over each PyTorch row's of the same variant (> 1: scmoe is faster)."""
    ours = {r["variant"]: r for r in (benchmarks.get("train") or {}).get("rows", [])}
    rows = [dict(r, source="scmoe") for r in ours.values()]
    for t in rows_of(benchmarks.get("train_torch")):
        row = dict(t, source=f"PyTorch {t.get('mode', '?')}")
        o = ours.get(t.get("variant"))
        if o and isinstance(t.get("tokens_per_s"), (int, float)) and t["tokens_per_s"] > 0:
            row["scmoe_over_peer"] = o["tokens_per_s"] / t["tokens_per_s"]
        # The median step: a compiled model's second and third steps can still be compiling (an H100 run:
        # 107 and 36 ms, then 25), which the mean over the steps after the first counts.
        if o and isinstance(t.get("median_step_ms"), (int, float)) and o.get("median_step_ms"):
            row["scmoe_over_peer_median"] = t["median_step_ms"] / o["median_step_ms"]
        rows.append(row)
    return rows


# What the emulator is compared on, per benchmark: the fields that name a case and the times.
EMU_CASES = {
    "gemm": (("load", "tokens"), ("grouped_us", "dense_us")),
    "attention": (("provider", "batch", "seq", "heads", "head_dim"), ("fwd_us", "bwd_us", "fwd_bwd_us")),
    "layer": (("dispatch", "tokens"), ("fwd_us", "fwd_bwd_us")),
    "train": (("variant",), ("step_ms",)),
}


def emulator_comparison(benchmarks):
    """Every measured gemm, attention, layer and train time next to the emulator's prediction for this GPU's
    built-in spec and for the profile made from this run, with the error in percent ((predicted -
    measured) / measured)."""
    def rows_by_case(sec, keys):
        """The first row of each case (the gemm step lists the provider auto picks first)."""
        rows = sec.get("rows", []) if sec and "rows" in sec else rows_of(sec)
        cases = {}
        for r in rows:
            if all(k in r for k in keys):
                cases.setdefault(tuple(r.get(k) for k in keys), r)
        return cases

    out = []
    for name in benchmarks:
        if name.startswith("emu_") or name.endswith("_torch") or "_torch_" in name:
            continue
        kind = "attention" if name.startswith("attention_") else name
        if kind not in EMU_CASES:
            continue
        keys, metrics = EMU_CASES[kind]
        measured = rows_by_case(benchmarks[name], keys)
        predicted = {k: rows_by_case(benchmarks.get(f"emu_{k}_{name}"), keys) for k in ("spec", "profile")}
        for case, m in measured.items():
            for metric in metrics:
                if not isinstance(m.get(metric), (int, float)) or m[metric] <= 0:
                    continue
                row = {"benchmark": name, "case": ", ".join(f"{k} {v}" for k, v in zip(keys, case)),
                       "metric": metric, "measured": m[metric]}
                for k in ("spec", "profile"):
                    p = predicted[k].get(case, {}).get(metric)
                    if isinstance(p, (int, float)):
                        row[k] = p
                        row[f"{k}_error_pct"] = 100.0 * (p - m[metric]) / m[metric]
                out.append(row)
    return out


# ---- where the train step's time goes: the last step's trace, measured and emulated -------------------

TRACE_NUMBER = re.compile(r"\d+")


def trace_ops(path):
    """A trace written by scmoe-train --trace (scmoe/moe/trace.h's JSON), its ops summed by name with the
    block and layer numbers taken out ("attn_bwd11" -> "attn_bwd#", "experts[moe3]" -> "experts[moe#]"),
    per lane: ({(op, lane): [count, total_us]}, span_us), or None when the file is missing or unreadable."""
    j = read_json(path)
    if not isinstance(j, dict) or not isinstance(j.get("traceEvents"), list):
        return None
    lanes = {e.get("tid"): e.get("args", {}).get("name", "?") for e in j["traceEvents"]
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
    ops, first, last = {}, None, None
    for e in j["traceEvents"]:
        if e.get("ph") != "X":
            continue
        key = (TRACE_NUMBER.sub("#", e["name"]), lanes.get(e.get("tid"), str(e.get("tid"))))
        agg = ops.setdefault(key, [0, 0.0])
        agg[0] += 1
        agg[1] += e["dur"]
        first = e["ts"] if first is None else min(first, e["ts"])
        last = e["ts"] + e["dur"] if last is None else max(last, e["ts"] + e["dur"])
    return (ops, last - first) if ops else None


def trace_paths(raw, stem, variants):
    """{variant: path} of STEM.rank0.json (one variant) or STEM.<variant>.rank0.json (several)."""
    if len(variants) == 1:
        return {variants[0]: os.path.join(raw, f"{stem}.rank0.json")}
    return {v: os.path.join(raw, f"{stem}.{v}.rank0.json") for v in variants}


def step_breakdown(raw, benchmarks, min_share_pct=1.0):
    """Per variant of the train step: each op of the measured trace (raw/train_trace...) with its count,
    total time and share of the traced span, beside the emulator's total for the same op (the spec's and
    the profile's traces, raw/emu_{spec,profile}_train_trace...) and its error; ops under min_share_pct of
    the span are summed into one "other" row. Rows ordered by measured time."""
    variants = [r["variant"] for r in (benchmarks.get("train") or {}).get("rows", [])]
    if not variants:
        return []
    measured = trace_paths(raw, "train_trace", variants)
    predicted = {k: trace_paths(raw, f"emu_{k}_train_trace", variants) for k in ("spec", "profile")}
    rows = []
    for v in variants:
        m = trace_ops(measured[v])
        if not m:
            continue
        ops, span = m
        emu = {k: trace_ops(predicted[k][v]) for k in predicted}
        head = {"variant": v, "op": "(the traced step)", "lane": "", "count": sum(c for c, _ in ops.values()),
                "measured_ms": span / 1000.0, "share_pct": 100.0}
        body, other = [], None
        for (op, lane), (count, us) in sorted(ops.items(), key=lambda kv: -kv[1][1]):
            row = {"variant": v, "op": op, "lane": lane, "count": count, "measured_ms": us / 1000.0,
                   "share_pct": 100.0 * us / span if span > 0 else 0.0}
            for k, e in emu.items():
                if e and (op, lane) in e[0]:
                    row[f"{k}_ms"] = e[0][(op, lane)][1] / 1000.0
            if row["share_pct"] >= min_share_pct:
                body.append(row)
            else:
                if other is None:
                    other = {"variant": v, "op": "(other ops)", "lane": "", "count": 0, "measured_ms": 0.0,
                             "share_pct": 0.0}
                other["count"] += count
                other["measured_ms"] += row["measured_ms"]
                other["share_pct"] += row["share_pct"]
                for k in emu:
                    if f"{k}_ms" in row:
                        other[f"{k}_ms"] = other.get(f"{k}_ms", 0.0) + row[f"{k}_ms"]
        for k, e in emu.items():
            if e:
                head[f"{k}_ms"] = e[1] / 1000.0
        for row in [head] + body + ([other] if other else []):
            for k in emu:
                if isinstance(row.get(f"{k}_ms"), float) and row["measured_ms"] > 0:
                    row[f"{k}_error_pct"] = 100.0 * (row[f"{k}_ms"] - row["measured_ms"]) / row["measured_ms"]
            rows.append(row)
    return rows


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def read_text(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def read_steps(raw):
    steps = {}
    for line in read_text(os.path.join(raw, "steps.jsonl")).splitlines():
        if line.strip():
            rec = json.loads(line)
            steps[rec["name"]] = rec  # a later record of the same step wins
    return steps


def gpu_context(raw):
    gpus = []
    for line in read_text(os.path.join(raw, "nvidia-smi-query.csv")).splitlines():
        f = [x.strip() for x in line.split(",")]
        if len(f) >= 5:
            gpus.append({"index": f[0], "name": f[1], "driver": f[2], "compute_capability": f[3], "memory": f[4]})
    smi = read_text(os.path.join(raw, "nvidia-smi.txt"))
    m = re.search(r"CUDA Version:\s*([0-9.]+)", smi)
    nvcc = read_text(os.path.join(raw, "nvcc.txt"))
    n = re.search(r"release ([0-9.]+), V([0-9.]+)", nvcc)
    configure = [
        l[len("-- scmoe:") :].strip()
        for l in read_text(os.path.join(raw, "configure.txt")).splitlines()
        if l.startswith("-- scmoe:")
    ]
    return {
        "gpus": gpus,
        "driver_cuda_version": m.group(1) if m else None,
        "toolkit_cuda_version": n.group(2) if n else None,
        "configure": configure,
    }


def bench_section(step, raw):
    """One benchmark step: its status, command and (when it wrote one) its JSON report."""
    log = step["name"] + ".log"
    sec = {
        "status": step["status"],
        "rc": step.get("rc"),
        "seconds": step.get("seconds"),
        "note": step.get("note", ""),
        "command": step.get("command", []),
        "log": os.path.join("raw", log) if os.path.exists(os.path.join(raw, log)) else None,
    }
    if step.get("json"):
        data = read_json(step["json"]) or read_json(os.path.join(raw, os.path.basename(step["json"])))
        if data is not None:
            sec["result"] = data
            if isinstance(data, dict) and data.get("wrong"):
                sec["status"] = "failed"
                sec["note"] = (sec["note"] + "; " if sec["note"] else "") + f"{data['wrong']} wrong elements"
        elif step["status"] == "ok":
            sec["status"] = "failed"
            sec["note"] = f"exited 0 but wrote no JSON at {step['json']}"
    return sec


# The benchmarks gpu_check.sh always runs: a report without one of them is incomplete.
REQUIRED_STEPS = ("gemm", "layer", "block", "train")

SUMMARY_TFLOPS = re.compile(
    r"^# (\S+): ([0-9.]+) model TFLOP/s per rank(?:, MFU ([0-9.]+)% of ([0-9.]+) TFLOP/s)?", re.M
)


def train_section(step, raw, spec):
    """gpt2-moe-small: tokens/s and ms/step per variant from the metrics (the mean over the steps after
    the first, as the trainer's summary), the model TFLOP/s the trainer prints, and the MFU against the
    spec's peak."""
    sec = bench_section(step, raw)
    per_variant, unreadable = {}, 0
    for line in read_text(os.path.join(raw, step["name"] + ".metrics.jsonl")).splitlines():
        if not line.strip():
            continue
        try:
            m = json.loads(line)
        except ValueError:
            unreadable += 1
            continue
        if isinstance(m, dict) and "tokens_per_s" in m and "step_ms" in m:
            per_variant.setdefault(m.get("variant", "?"), []).append(m)
    log = read_text(os.path.join(raw, step["name"] + ".log"))
    printed = {m.group(1): m for m in SUMMARY_TFLOPS.finditer(log)}
    peak = spec.get("peak_tflops") if spec else None
    rows = []
    for variant, ms in per_variant.items():
        timed = ms[1:] if len(ms) > 1 else ms
        row = {
            "variant": variant,
            "steps": len(ms),
            "tokens_per_s": sum(m["tokens_per_s"] for m in timed) / len(timed),
            "step_ms": sum(m["step_ms"] for m in timed) / len(timed),
            "median_step_ms": statistics.median(m["step_ms"] for m in timed),
            "final_loss": ms[-1].get("loss"),
        }
        p = printed.get(variant)
        if p:
            row["model_tflops_per_gpu"] = float(p.group(2))
            if p.group(3):
                row["trainer_mfu_pct"] = float(p.group(3))
            if peak:
                row["peak_tflops"] = peak
                row["mfu_pct"] = 100.0 * row["model_tflops_per_gpu"] / peak
        rows.append(row)
    sec["rows"] = rows
    if unreadable:
        sec["note"] = (sec["note"] + "; " if sec["note"] else "") + f"{unreadable} unreadable metrics line(s)"
    if step["status"] == "ok" and not rows:
        sec["status"] = "failed"
        sec["note"] = f"no metrics in {step['name']}.metrics.jsonl"
    return sec


def collect(raw, context):
    steps = read_steps(raw)
    spec = read_json(os.path.join(raw, "spec.json")) or {}
    rep = {
        "context": dict(context),
        "gpu": gpu_context(raw),
        "peak": spec,
        "tests": None,
        "benchmarks": {},
        "failures": [],
    }
    tests_step = steps.get("tests")
    if tests_step and tests_step["status"] == "skipped":
        rep["tests"] = {"status": "skipped", "command": tests_step.get("command", []), "log": None,
                        "summary": None, "reruns": []}
        rep["failures"].append({"step": "tests", "why": tests_step.get("note") or "skipped"})
    elif tests_step:
        t = read_json(os.path.join(raw, "tests.json"))
        rep["tests"] = {
            "status": "ok",
            "command": tests_step.get("command", []),
            "ctest_rc": tests_step.get("rc"),
            "log": "raw/tests.log",
            "summary": t,
            "reruns": (read_json(os.path.join(raw, "reruns.json")) or {}).get("reruns", []),
        }
        if t is None or not t.get("ok") or tests_step.get("rc") not in (0, None):
            rep["tests"]["status"] = "failed"
            why = []
            if t is None:
                why.append("no test summary (tests.json)")
            else:
                if t.get("error"):
                    why.append(t["error"])
                if t.get("total", 0) == 0:
                    why.append("no GPU test ran")
                for key, what in (("failed", "failed"), ("skipped_unexpected", "skipped although a GPU is present")):
                    names = [c["name"] for c in t.get(key, [])]
                    if names:
                        why.append(
                            f"{len(names)} test(s) {what}: "
                            + ", ".join(names[:3])
                            + (f" and {len(names) - 3} more" if len(names) > 3 else "")
                            + " (reasons under GPU tests)"
                        )
            if tests_step.get("rc") not in (0, None):
                why.append(f"ctest {tests_step.get('note') or 'failed'}")
            rep["failures"].append({"step": "tests", "why": "; ".join(why)})
    for name, step in steps.items():
        if name == "tests":
            continue
        try:
            is_train = name == "train" or (name.startswith("emu_") and name.endswith("_train"))
            sec = train_section(step, raw, spec) if is_train else bench_section(step, raw)
        except Exception as e:  # one unreadable output costs its section, not the report
            sec = {
                "status": "failed",
                "note": f"the report could not read its output: {e!r}",
                "rc": step.get("rc"),
                "seconds": step.get("seconds"),
                "command": step.get("command", []),
                "log": None,
            }
        rep["benchmarks"][name] = sec
        if sec["status"] in ("failed", "skipped"):
            rep["failures"].append({"step": name, "why": sec["note"] or "failed", "log": sec["log"]})
    for name in REQUIRED_STEPS:  # the attention steps may be "not available"; these always run
        if name not in steps:
            rep["failures"].append({"step": name, "why": "did not run (no record in steps.jsonl)"})
    rep["attention"] = attention_comparison(rep["benchmarks"])
    rep["layer_vs_torch"] = layer_comparison(rep["benchmarks"])
    rep["train_vs_torch"] = train_comparison(rep["benchmarks"])
    rep["emulator"] = emulator_comparison(rep["benchmarks"])
    rep["step_breakdown"] = step_breakdown(raw, rep["benchmarks"])
    rep["ok"] = not rep["failures"]
    return rep


def add_bundle(rep, bundle, path):
    """The offline bundle's part (launch/gpu_bundle.py run: bundle.json): the machine's facts, the load
    check and the ctest listing; a binary that did not load or a test ctest did not list is a failure."""
    if bundle is None:
        rep["bundle"] = None
        rep["failures"].append({"step": "bundle", "why": f"cannot read {path}"})
    else:
        rep["bundle"] = bundle
        for ph in bundle.get("phases", []):
            if ph["name"].startswith("load_check") and ph.get("failures"):
                rep["failures"].append({"step": "bundle", "why": f"{len(ph['failures'])} binaries did not load "
                                        f"({ph['name']}): " + "; ".join(f"{f['path']}: {f['error']}"
                                                                       for f in ph["failures"][:3])})
        listing = bundle.get("ctest_listing")
        if listing and not listing.get("ok"):
            rep["failures"].append({"step": "bundle", "why": f"ctest lists {listing['listed']} GPU tests, the bundle "
                                    f"has {listing['expected']} (missing: {', '.join(listing['missing'][:5])})"})
    rep["ok"] = not rep["failures"]


def render_bundle(b):
    out = "\n## Machine and bundle\n\n"
    m = b.get("machine", {})
    bun = b.get("bundle", {})
    rows = [
        ("bundle", f"{bun.get('name')} (commit {bun.get('commit')}"
                   f"{', uncommitted changes' if bun.get('uncommitted_changes') else ''}; packed {bun.get('packed')}; "
                   f"CUDA {bun.get('cuda_version')}, architectures {bun.get('cuda_architectures')})"),
        ("GPUs (nvidia-smi)", "; ".join(m.get("gpus", [])) or "none"),
        ("driver check", b.get("driver_check", "")),
        ("CUDA the driver supports", m.get("driver_cuda_version")),
        ("nvcc", m.get("nvcc")),
        ("OS", f"{m.get('os')} (kernel {m.get('kernel')}), {m.get('glibc')}, {m.get('cpus')} CPUs"),
        ("Python, torch", f"{m.get('python')}, torch {m.get('torch')}"),
        ("cmake, ninja, compute-sanitizer", f"{m.get('cmake')}, {m.get('ninja') or 'absent'}, "
                                            f"{m.get('compute_sanitizer') or 'absent'}"),
    ]
    rows += [(name, path or "NOT FOUND") for name, path in m.get("cuda_libraries", {}).items()]
    out += "| | |\n|---|---|\n" + "".join(f"| {fmt(k)} | {fmt(v)} |\n" for k, v in rows)
    out += "\n" + md_table([dict(p, failures=len(p.get("failures", [])) if "failures" in p else None)
                            for p in b.get("phases", [])],
                           [("name", "phase"), ("seconds", "s"), ("loaded", "binaries loaded"), ("binaries", "of"),
                            ("failures", "failed to load"), ("result", "result"), ("why", "why")])
    listing = b.get("ctest_listing")
    if listing:
        out += (f"\nctest lists {listing['listed']} GPU tests; the bundle packed {listing['expected']}"
                f"{'' if listing['ok'] else ' (MISMATCH)'}.\n")
    return out


def md_command(cmd):
    return "`" + " ".join(cmd).replace("`", "'") + "`" if cmd else ""


def section_header(title, sec):
    out = f"\n## {title}\n\n"
    if sec is None:
        return out + "Not run.\n"
    out += f"Status: **{sec['status']}**"
    if sec.get("note"):
        out += f" ({fmt(sec['note'])})"
    if sec.get("seconds") is not None:
        out += f", {sec['seconds']} s"
    out += f". Log: `{sec['log']}`.\n" if sec.get("log") else ".\n"
    if sec.get("command"):
        out += f"\n{md_command(sec['command'])}\n"
    return out


def rows_of(sec):
    res = sec.get("result") if sec else None
    return res.get("rows", []) if isinstance(res, dict) else []


def render_md(rep):
    c, g = rep["context"], rep["gpu"]
    out = "# scmoe GPU check\n\n"
    out += f"Result: **{'PASSED' if rep['ok'] else 'FAILED'}**"
    out += f" ({len(rep['failures'])} failure(s), listed under Failures)\n\n" if rep["failures"] else "\n\n"
    out += "| | |\n|---|---|\n"
    for i, gpu in enumerate(g["gpus"]):
        out += (
            f"| GPU {gpu['index']} | {gpu['name']}, compute capability {gpu['compute_capability']}, "
            f"{gpu['memory']} |\n"
        )
    if g["gpus"]:
        out += f"| driver | {g['gpus'][0]['driver']} (supports CUDA {g['driver_cuda_version'] or '?'}) |\n"
    out += f"| CUDA toolkit | {g['toolkit_cuda_version'] or 'unknown'} |\n"
    for key in (
        "commit",
        "uncommitted_changes",
        "date",
        "host",
        "mode",
        "backend",
        "build_dir",
        "cuda_architectures",
        "seconds",
    ):
        if key in c:
            out += f"| {key.replace('_', ' ')} | {fmt(c[key])} |\n"

    if g.get("configure"):
        out += "\nConfigured with: " + "; ".join(fmt(l) for l in g["configure"]) + ".\n"
    if rep.get("bundle"):
        out += render_bundle(rep["bundle"])
    t = rep["tests"]
    out += "\n## GPU tests\n\n"
    if t is None:
        out += "Not run (--skip-tests).\n"
    elif t["status"] == "skipped":
        out += f"Not run: {fmt(next((f['why'] for f in rep['failures'] if f['step'] == 'tests'), 'skipped'))}.\n"
    else:
        s = t["summary"] or {}
        out += f"Status: **{t['status']}**. Log: `{t['log']}`.\n\n{md_command(t['command'])}\n\n"
        out += md_table(
            [
                {
                    "total": s.get("total", 0),
                    "passed": s.get("passed", 0),
                    "failed": len(s.get("failed", [])),
                    "unexpected": len(s.get("skipped_unexpected", [])),
                    "expected": len(s.get("skipped_expected", [])),
                }
            ],
            [
                ("total", "tests"),
                ("passed", "passed"),
                ("failed", "failed"),
                ("unexpected", "skipped (a failure: a GPU is present)"),
                ("expected", "skipped as expected (cover machines without a GPU)"),
            ],
        )
        listed = (
            [dict(c, kind="failed") for c in s.get("failed", [])]
            + [dict(c, kind="skipped") for c in s.get("skipped_unexpected", [])]
            + [dict(c, kind="skipped (expected)") for c in s.get("skipped_expected", [])]
        )
        if listed:
            out += "\n" + md_table(listed, [("name", "test"), ("kind", "outcome"), ("reason", "reason")])
        if t.get("reruns"):
            out += "\nFailed tests run again, one at a time (launch/gpu_test_rerun.py):\n\n" + md_table(
                t["reruns"], [("name", "test"), ("mode", "run"), ("outcome", "outcome"), ("seconds", "s"),
                              ("first_error", "first error line"), ("log", "log")])

    b = rep["benchmarks"]
    sec = b.get("gemm")
    out += section_header("Grouped GEMM vs cuBLAS dense at equal FLOPs", sec)
    if rows_of(sec):
        out += (
            "\nA [rows, hidden] x W [experts, hidden, ffn] over the expert loads (balanced: rows/E each; "
            "zipf: expert e's share ~ 1/(e+1)^s) against one dense GEMM [rows, hidden] x [hidden, ffn]; "
            "dense/grouped = 1.0: the grouped GEMM is as efficient as dense.\n\n"
        )
        out += md_table(rows_of(sec), GEMM_COLUMNS)

    out += "\n## Attention vs PyTorch scaled_dot_product_attention\n"
    if not rep["attention"]:
        out += "\nNot run.\n"
    for tag, cmp in rep["attention"].items():
        for label, key in (("scmoe-bench attention", "attention_" + tag), ("PyTorch SDPA", "attention_torch_" + tag)):
            out += section_header(f"{label}, {tag}", b.get(key)).replace("\n## ", "\n### ", 1)
        if cmp["rows"]:
            out += (
                "\nCausal attention; torch/scmoe = PyTorch's time / scmoe's time for the same shape (> 1: scmoe "
                "is faster).\n\n"
            )
            out += md_table(cmp["rows"], ATTENTION_COLUMNS)
        for extra in cmp["other_rows"]:  # rows without the shape fields: shown as they are
            out += "\n" + md_table(extra, generic_columns(extra))

    sec = b.get("layer")
    out += section_header("MoE layer forward and forward+backward", sec)
    if rows_of(sec):
        out += "\n" + md_table(rows_of(sec), LAYER_COLUMNS)

    out += section_header("MoE layer vs Hugging Face transformers' MixtralSparseMoeBlock", b.get("layer_torch"))
    if rep["layer_vs_torch"]:
        out += (
            "\nThe same shape, bf16, dropless (Mixtral has no capacity): scmoe's `--activation swiglu` experts do "
            "Mixtral's computation. peer/scmoe > 1: scmoe is faster. The peer's JSON says what else differs "
            "(`peer_note`).\n\n"
        )
        out += md_table(rep["layer_vs_torch"], [
            ("tokens", "tokens"), ("peer", "peer"), ("scmoe_fwd_us", "scmoe fwd µs"), ("peer_fwd_us", "peer fwd µs"),
            ("peer_over_scmoe_fwd", "peer/scmoe fwd"), ("scmoe_fwd_bwd_us", "scmoe fwd+bwd µs"),
            ("peer_fwd_bwd_us", "peer fwd+bwd µs"), ("peer_over_scmoe_fwd_bwd", "peer/scmoe fwd+bwd")])

    sec = b.get("block")
    out += section_header("ScMoE block variants, 4 local ranks, emulated PCIe 4 link", sec)
    if rows_of(sec):
        out += (
            "\nThe 4 ranks share the GPU; the all-to-all runs behind an EmulatedLink (pcie4: 25 GB/s, 10 µs). "
            "Speedups are against top-2; #wrong counts elements that differ bitwise between overlap on and off.\n\n"
        )
        out += md_table(rows_of(sec), BLOCK_COLUMNS)

    sec = b.get("train")
    out += section_header("gpt2-moe-small training: tokens/s and MFU", sec)
    if sec is not None:
        p = rep["peak"] or {}
        out += (
            "\nTimes: the mean over the steps after the first (which calibrates). Model FLOPs per token, as "
            "scmoe-train counts them: 6 x the parameters a token uses (top-k of the experts; positions "
            "excluded) + 6 x layers x hidden x seq for attention. MFU = model TFLOP/s per GPU / peak; peak: "
            + (
                f"{fmt(p['peak_tflops'])} TFLOP/s dense bf16, {p.get('source', '')}"
                if p.get("peak_tflops")
                else f"none ({p.get('why_not', 'unknown GPU')}; gpu_check.sh --peak-tflops X sets it)"
            )
            + ".\n\n"
        )
        out += md_table(
            sec.get("rows", []),
            [
                ("variant", "variant"),
                ("steps", "steps"),
                ("tokens_per_s", "tokens/s"),
                ("step_ms", "ms/step"),
                ("model_tflops_per_gpu", "model TFLOP/s per GPU"),
                ("peak_tflops", "peak TFLOP/s"),
                ("mfu_pct", "MFU %"),
                ("final_loss", "last loss"),
            ],
        )

    out += section_header("gpt2-moe-small training vs the same model in PyTorch", b.get("train_torch"))
    if any(r["source"] != "scmoe" for r in rep["train_vs_torch"]):
        out += (
            "\nlaunch/gpt2_moe_torch.py: the same model, FLOP count and MFU formula; eager and torch.compile "
            "(a compile that does not finish within its budget is reported, not waited for). scmoe/peer > 1: "
            "scmoe is faster. tokens/s and ms/step: means over the steps after the first; the median columns: "
            "the median of those steps (a compiled model's first steps after the first may still compile).\n\n"
        )
        out += md_table(rep["train_vs_torch"], [
            ("source", "source"), ("variant", "variant"), ("status", "status"), ("tokens_per_s", "tokens/s"),
            ("step_ms", "ms/step"), ("median_step_ms", "median ms/step"), ("mfu_pct", "MFU %"),
            ("first_step_s", "first step s"), ("scmoe_over_peer", "scmoe/peer tokens/s"),
            ("scmoe_over_peer_median", "scmoe/peer, median steps"), ("note", "note")])

    out += "\n## Where the train step's time goes (the last step's trace)\n\n"
    if rep.get("step_breakdown"):
        out += (
            "`scmoe-train --trace` of the train step's last step: each op's device time (events on its stream; "
            "block and layer numbers taken out, so `attn_bwd#` sums every block's), its share of the traced span "
            "(lanes run side by side, so shares can sum past 100%), and the emulator's time for the same op "
            "in its trace of the same command (`spec`, `profile`: as in the next section). Ops under 1% of the "
            "span are summed as \"(other ops)\".\n\n"
        )
        out += md_table(rep["step_breakdown"], [
            ("variant", "variant"), ("op", "op"), ("lane", "lane"), ("count", "count"),
            ("measured_ms", "measured ms"), ("share_pct", "% of span"), ("spec_ms", "spec ms"),
            ("spec_error_pct", "spec error %"), ("profile_ms", "profile ms"), ("profile_error_pct", "profile error %")])
    else:
        out += "No trace (the train step wrote none, or did not run).\n"

    out += "\n## The emulator next to the measurements\n\n"
    if rep["emulator"]:
        out += (
            "Each measured time beside the emulator's prediction (`--backend emu`): `spec`, this GPU's built-in "
            "spec (scmoe/kernels/emu/gpu_spec.cpp); `profile`, the spec with the GEMM rate this run's layer step "
            "reached (launch/make_profile.py). Error = (predicted - measured) / measured.\n\n"
        )
        out += md_table(rep["emulator"], [
            ("benchmark", "benchmark"), ("case", "case"), ("metric", "metric"), ("measured", "measured"),
            ("spec", "spec"), ("spec_error_pct", "spec error %"), ("profile", "profile"),
            ("profile_error_pct", "profile error %")])
    else:
        out += "No prediction to compare (no built-in spec for this GPU, or no measurement).\n"

    out += "\n## Failures\n\n"
    if not rep["failures"]:
        out += "None.\n"
    for f in rep["failures"]:
        out += f"- **{f['step']}**: {fmt(f['why'])}" + (f" (log: `{f['log']}`)" if f.get("log") else "") + "\n"
    return out


def cmd_report(a):
    context = {}
    for kv in a.context or []:
        k, _, v = kv.partition("=")
        context[k] = v
    rep = collect(a.raw, context)
    if a.bundle:
        add_bundle(rep, read_json(a.bundle), a.bundle)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "report.json"), "w") as f:
        json.dump(rep, f, indent=1)
    with open(os.path.join(a.out, "report.md"), "w") as f:
        f.write(render_md(rep))
    print(
        f"report: {'PASSED' if rep['ok'] else 'FAILED'}"
        + "".join(f"\n  {f['step']}: {f['why']}" for f in rep["failures"])
    )
    return 0 if rep["ok"] else 1


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("skips")
    p.add_argument("junit")
    p.add_argument("--json")
    p = sub.add_parser("spec")
    p.add_argument("--gpu-name", required=True)
    p.add_argument("--bench", required=True)
    p.add_argument("--json")
    p.add_argument("--peak-tflops", type=float)
    p = sub.add_parser("step")
    p.add_argument("--raw", required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--status", required=True, choices=["ok", "failed", "skipped", "not available"])
    p.add_argument("--rc", default="")
    p.add_argument("--seconds", default="")
    p.add_argument("--json", default="")
    p.add_argument("--note", default="")
    p.add_argument("command", nargs="*")
    p = sub.add_parser("report")
    p.add_argument("--raw", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--context", action="append")
    p.add_argument("--bundle")
    a = ap.parse_args(argv)
    return {"skips": cmd_skips, "spec": cmd_spec, "step": cmd_step, "report": cmd_report}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
