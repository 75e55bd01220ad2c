#!/usr/bin/env python3
"""Writes the "Best configuration per variant" sections of docs/plan/README.md from scmoe-plan's
JSON reports (and the commands from the .txt output beside each).

Each section starts at the line "**CLUSTER** (`PLAN.json`)" and runs to the commands indented under
"N runs, ...". For every PLAN.json named, the section is rebuilt: the cluster's assumptions, the best
configuration per variant (the highest tokens/s among the runs that neither ran out of memory nor
failed) with its step time, tokens/s and the plan's error band, exposed communication split into the
all-to-all and the gradient all-reduce, dropped tokens and peak memory; then the run count, the
search-edge warnings and the printed commands (best: mpirun, slurm:, replay-train:).

    python3 launch/plan_readme.py docs/plan/README.md docs/plan/gpt2-moe-small.*-*.json          # in place
    python3 launch/plan_readme.py --check docs/plan/README.md docs/plan/gpt2-moe-small.*-*.json  # exit 1 if stale

Every number it writes is an emulator prediction (scmoe-plan), not a measurement.
"""
import argparse
import json
import os
import re
import sys


def section(plan, fname):
    """The section's lines (without the commands) for the report `plan` saved as `fname`."""
    out = [f"**{plan['cluster_label']}** (`{fname}`)", ""]
    out += [f"- {a}" for a in plan["assumed"]]
    out.append("")
    out += ["| variant | best configuration | step ms | tokens/s (band) | exposed % (a2a + grad) | dropped/step | peak GiB |",
            "|---|---|---|---|---|---|---|"]
    best = {}
    for c in plan["cases"]:
        if c["out_of_memory"] or c["error"]:
            continue
        if c["variant"] not in best or c["tokens_per_s"] > best[c["variant"]]["tokens_per_s"]:
            best[c["variant"]] = c
    band = plan["error_band"]
    for c in sorted(best.values(), key=lambda c: -c["tokens_per_s"]):
        dispatch = "dropless" if c["dispatch"] == "dropless" else "capacity " + format(c["capacity_factor"], "g")
        config = f"ep {c['ep']} x dp {c['dp']}, {dispatch}, batch {c['batch']}"
        if c["chunks"] != "auto":
            config += f", chunks {c['chunks']}"
        t = round(c["tokens_per_s"])
        low, high = t / (1 + band["high"]), t / (1 + band["low"])
        out.append(f"| {c['variant']} | {config} | {c['step_ms']:.1f} | {c['tokens_per_s']:.0f} ({low:.0f}-{high:.0f}) | "
                   f"{c['exposed_comm_pct']:.1f} ({c['exposed_a2a_pct']:.1f} + {c['exposed_grad_pct']:.1f}) | "
                   f"{c['dropped_tokens_per_step']:.0f} | {c['peak_gib']:.2f} |")
    oom = sum(1 for c in plan["cases"] if c["out_of_memory"])
    warned = "; ".join(plan["warnings"]) if plan["warnings"] else (
        "no search-edge warning (each winner's batch is the largest that fits: the next ran out of memory)")
    out += ["", f"{len(plan['cases'])} runs, {oom} out of memory; {warned}", ""]
    return out


def commands(txt_path):
    """The best configuration's commands from scmoe-plan's text output, indented as code."""
    found = {}
    with open(txt_path) as f:
        for line in f:
            for key in ("best: ", "slurm: ", "replay-train: "):
                if line.startswith(key):
                    found[key] = line[len(key):].rstrip("\n")
    return ["    " + found[k] for k in ("best: ", "slurm: ", "replay-train: ") if k in found]


def replace_section(readme, fname, new_lines):
    lines = readme.split("\n")
    heads = [i for i, l in enumerate(lines) if l.startswith("**") and l.endswith(f"(`{fname}`)")]
    if len(heads) != 1:
        raise SystemExit(f"plan_readme: the README has {len(heads)} sections for {fname} (expected one "
                         f"line \"**CLUSTER** (`{fname}`)\")")
    start = heads[0]
    runs = next((i for i in range(start, len(lines)) if re.match(r"^\d+ runs, ", lines[i])), None)
    if runs is None:
        raise SystemExit(f"plan_readme: the section for {fname} has no \"N runs, ...\" line")
    end = runs + 2
    while end < len(lines) and lines[end].startswith("    "):
        end += 1
    return "\n".join(lines[:start] + new_lines + lines[end:])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Every number written is an emulator prediction, not a measurement.")
    ap.add_argument("readme", help="the README to update (docs/plan/README.md)")
    ap.add_argument("plans", nargs="+", help="scmoe-plan -J reports; each PLAN.json needs PLAN.txt beside it")
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 naming the sections that differ")
    args = ap.parse_args()
    with open(args.readme) as f:
        old = f.read()
    text, stale = old, []
    for path in args.plans:
        fname = os.path.basename(path)
        txt = path[:-len(".json")] + ".txt" if path.endswith(".json") else None
        if not txt or not os.path.exists(txt):
            ap.error(f"{path}: expected a PLAN.json with PLAN.txt (scmoe-plan's output) beside it")
        with open(path) as f:
            plan = json.load(f)
        updated = replace_section(text, fname, section(plan, fname) + commands(txt))
        if updated != text:
            stale.append(fname)
        text = updated
    if args.check:
        if stale:
            print(f"plan_readme: {args.readme} differs from: {', '.join(stale)}", file=sys.stderr)
            return 1
        print(f"plan_readme: {args.readme} matches {len(args.plans)} plan(s)")
        return 0
    if text != old:
        with open(args.readme, "w") as f:
            f.write(text)
    print(f"plan_readme: {len(stale)} of {len(args.plans)} section(s) rewritten in {args.readme}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
