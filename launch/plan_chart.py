#!/usr/bin/env python3
"""Draws scmoe-plan results (emulator predictions, not measurements). Needs matplotlib.

Usage: plan_chart.py OUT.png PLAN.json [PLAN.json ...]

  - plan files (scmoe-plan -J): the best predicted throughput of each variant, in tokens/s of the
    whole cluster (clusters of different sizes compare by what they deliver, not by step time), one
    bar per cluster in each variant's group, with the error band of the prediction as an error bar
    and the configuration (ep, micro-batch, dispatch) written in the bar;
  - a NIC-speed sweep (scmoe-plan --nic-gbit-s A,B,... -J): tokens/s against the NICs' line rate per
    variant, and the share of each variant's communication left exposed.

Legends name each cluster by its own description (cluster_label: nodes, GPUs, fabric, NIC speed), so
two different clusters never share a label.

    python3 launch/plan_chart.py chart.png a6000.json l40s.json
    python3 launch/plan_chart.py sweep.png nic-sweep.json
"""
import json
import sys


def best_per_variant(plan):
    best = {}
    for c in plan["cases"]:
        if c["error"]:
            continue
        v = c["variant"]
        if v not in best or c["tokens_per_s"] > best[v]["tokens_per_s"]:
            best[v] = c
    return best


def label_of(plan):
    # Older files have no cluster_label: fall back to the description, which also differs per cluster.
    if plan.get("cluster_label"):  # names the GPU itself
        return plan["cluster_label"]
    return "%s (%s)" % (plan.get("cluster_description") or plan["cluster"], plan["gpu"])


def band_text(plan):
    b = plan.get("error_band")
    if not b:
        return ""
    return "error bars: the validation's band %+.0f%%..%+.0f%%" % (100 * b["low"], 100 * b["high"])


def legend_labels(plans):
    """One label per plan, each its cluster's own description; the same cluster twice gets numbers."""
    labels = [label_of(p) for p in plans]
    if len(set(labels)) != len(labels):
        labels = ["%d: %s" % (i + 1, l) for i, l in enumerate(labels)]
    return labels


def bar_values(plans):
    """(variants, [[tokens/s of the cluster of each variant's best case, 0 without one] per plan])."""
    variants = []
    for p in plans:
        for c in p["cases"]:
            if c["variant"] not in variants:
                variants.append(c["variant"])
    values = []
    for p in plans:
        best = best_per_variant(p)
        values.append([best[v]["tokens_per_s"] if v in best else 0 for v in variants])
    return variants, values


def draw_plans(plt, out, plans):
    variants, _ = bar_values(plans)
    labels = legend_labels(plans)
    n = max(1, len(plans))
    width = 0.8 / n
    fig, ax = plt.subplots(figsize=(max(7, 1.6 * len(variants) * n / 2 + 3), 5.6))
    top = 0
    for i, p in enumerate(plans):
        best = best_per_variant(p)
        xs = [k + (i - (n - 1) / 2) * width for k in range(len(variants))]
        ys = [best[v]["tokens_per_s"] / 1e6 if v in best else 0 for v in variants]
        lo = [(best[v]["tokens_per_s"] - best[v]["tokens_per_s_band"][0]) / 1e6 if v in best and
              "tokens_per_s_band" in best[v] else 0 for v in variants]
        hi = [(best[v]["tokens_per_s_band"][1] - best[v]["tokens_per_s"]) / 1e6 if v in best and
              "tokens_per_s_band" in best[v] else 0 for v in variants]
        bars = ax.bar(xs, ys, width, label=labels[i], yerr=[lo, hi], capsize=3, error_kw={"elinewidth": 0.8})
        # The configuration above the error bar, where neither the bar nor the bar's band hides it.
        for bar, v, h in zip(bars, variants, hi):
            if v in best:
                c = best[v]
                ax.text(bar.get_x() + bar.get_width() / 2, bar.get_height() + h, " ep%d b%d %s" %
                        (c["ep"], c["batch"], "dropless" if c.get("dispatch") == "dropless" else "cf%g" %
                         c["capacity_factor"]), ha="center", va="bottom", rotation=90, fontsize=7)
        top = max([top] + [y + h for y, h in zip(ys, hi)])
    ax.set_xticks(range(len(variants)))
    ax.set_xticklabels(variants)
    ax.set_ylim(0, top * 1.4 if top > 0 else 1)  # room for the configurations above the bars
    ax.set_ylabel("predicted tokens/s of the cluster (millions)\nbest configuration per variant")
    ax.set_title("scmoe-plan, emulated: %s\n(emulator predictions, not measurements; %s)"
                 % (plans[0]["model"], band_text(plans[0])), fontsize=8)
    # Below the axes, so no bar is hidden; one cluster per row.
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=1, frameon=False)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def draw_sweep(plt, out, sweep):
    rows = sweep["summary"]
    variants = []
    for r in rows:
        if r["variant"] not in variants:
            variants.append(r["variant"])
    plan0 = sweep["plans"][0]
    band = plan0.get("error_band", {"low": 0, "high": 0})
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 5.6))
    for v in variants:
        pts = [r for r in rows if r["variant"] == v]
        xs = [r["nic_gbit_s"] for r in pts]
        ys = [r["tokens_per_s"] / 1e6 for r in pts]
        line, = ax1.plot(xs, ys, marker="o", label=v)
        ax1.fill_between(xs, [y / (1 + band["high"]) for y in ys], [y / (1 + band["low"]) for y in ys],
                         color=line.get_color(), alpha=0.12)
        ax2.plot(xs, [r["exposed_pct_of_comm"] for r in pts], marker="o", label=v + ": exposed % of its comm")
        ax2.plot(xs, [r["comm_pct"] for r in pts], marker="x", linestyle=":", color=line.get_color(),
                 label=v + ": comm % of the step")
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sweep["nic_sweep_gbit_s"])
        ax.set_xticklabels(["%g" % s for s in sweep["nic_sweep_gbit_s"]])
        ax.set_xlabel("NIC line rate per node (Gb/s; /8 = GB/s)")
        ax.grid(alpha=0.3)
    ax1.set_ylabel("predicted tokens/s of the cluster (millions)")
    ax1.set_title("throughput (band: the validation's %+.0f%%..%+.0f%%)" % (100 * band["low"], 100 * band["high"]),
                  fontsize=8)
    ax1.legend(fontsize=7, loc="upper left")
    ax2.set_ylabel("%")
    ax2.set_ylim(0, 100)
    ax2.set_title("communication: share of the step, and share of it exposed", fontsize=8)
    # Below the axes: inside, it covered the top of the lines.
    ax2.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)
    label = plan0.get("cluster_label", plan0["cluster"]).rsplit(",", 1)[0]
    fig.suptitle("scmoe-plan NIC sweep, emulated: %s on %s (%s)\n(emulator predictions, not measurements)"
                 % (plan0["model"].split(":")[0], label, plan0["gpu"]), fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


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
    files = []
    for path in argv[2:]:
        with open(path) as f:
            files.append(json.load(f))
    sweeps = [f for f in files if "plans" in f]
    if sweeps:
        if len(files) != 1:
            print("plan_chart.py: a NIC sweep is drawn alone (one file)", file=sys.stderr)
            return 2
        draw_sweep(plt, argv[1], sweeps[0])
    else:
        draw_plans(plt, argv[1], files)
    print("wrote", argv[1])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
