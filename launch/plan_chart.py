#!/usr/bin/env python3
"""Draws scmoe-plan results: the best predicted step time of each variant, one group of bars per
cluster (one scmoe-plan -J file each). Needs matplotlib (pip install matplotlib).

Usage: plan_chart.py OUT.png PLAN.json [PLAN.json ...]   (PLAN.json: scmoe-plan -J output)

    python3 launch/plan_chart.py chart.png a30.json h100.json
"""
import json
import sys


def main(argv):
    if len(argv) < 3 or argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if len(argv) > 1 and argv[1] in ("-h", "--help") else 2
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plan_chart.py: needs matplotlib: pip install matplotlib", file=sys.stderr)
        return 2
    plans = []
    for path in argv[2:]:
        with open(path) as f:
            plans.append(json.load(f))
    variants = []
    for p in plans:
        for c in p["cases"]:
            if c["variant"] not in variants:
                variants.append(c["variant"])
    width = 0.8 / max(1, len(plans))
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(variants) + 2), 4.5))
    for i, p in enumerate(plans):
        best = {}
        for c in p["cases"]:
            if c["error"]:
                continue
            v = c["variant"]
            if v not in best or c["tokens_per_s"] > best[v]["tokens_per_s"]:
                best[v] = c
        xs = [k + (i - (len(plans) - 1) / 2) * width for k in range(len(variants))]
        ys = [best[v]["step_ms"] if v in best else 0 for v in variants]
        bars = ax.bar(xs, ys, width, label="%s (%s)" % (p["cluster"], p["gpu"]))
        for bar, v in zip(bars, variants):
            if v in best:
                c = best[v]
                ax.annotate("ep%d b%d" % (c["ep"], c["batch"]), (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                            ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(variants)))
    ax.set_xticklabels(variants, rotation=20)
    ax.set_ylabel("predicted step time (ms), best configuration")
    ax.set_title("scmoe-plan: %s\n(emulator predictions, not measurements)" % plans[0]["model"], fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(argv[1], dpi=120)
    print("wrote", argv[1])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
