#!/usr/bin/env python3
"""launch/plan_chart.py's choices, without matplotlib (issue 25): bars are the tokens/s of the whole
cluster (so 16 GPUs at 1.9x the throughput of 8 are the taller bar, though their step is longer),
each variant's best case that did not fail, and legend labels are the clusters' own descriptions,
different for different clusters. With matplotlib, a chart is drawn (skipped without it).

    plan_chart_test.py <source root> <out dir>
"""
import importlib.util
import json
import os
import subprocess
import sys


def case(variant, tps, step_ms, error=""):
    return {"variant": variant, "ep": 1, "dp": 8, "chunks": "auto", "dispatch": "capacity", "capacity_factor": 1.25,
            "batch": 8, "step_ms": step_ms, "tokens_per_s": tps, "tokens_per_s_band": [tps / 1.24, tps / 0.82],
            "error": error, "out_of_memory": bool(error)}


def plan(label, cases):
    return {"cluster": "a800-2x8+custom", "cluster_label": label, "gpu": "a800", "model": "tiny", "cases": cases,
            "error_band": {"low": -0.18, "high": 0.24, "source": "test"}}


def main(argv):
    spec = importlib.util.spec_from_file_location("plan_chart", os.path.join(argv[1], "launch", "plan_chart.py"))
    chart = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(chart)
    failures = []

    def check(ok, what):
        print(("ok:   " if ok else "FAIL: ") + what)
        if not ok:
            failures.append(what)

    eight = plan("8 a800, NVLink 200 GB/s", [case("top2", 1.0e6, 100.0), case("scmoe-pos2", 1.2e6, 90.0),
                                              case("scmoe-pos2", 9.9e6, 1.0, error="out of memory")])
    sixteen = plan("2 nodes x 8 a800, NVLink 200 GB/s, 100 Gb/s Ethernet",
                   [case("top2", 1.9e6, 105.0), case("scmoe-pos2", 2.2e6, 98.0)])
    variants, values = chart.bar_values([eight, sixteen])
    check(variants == ["top2", "scmoe-pos2"], "variants in first-seen order: %s" % variants)
    check(values[0] == [1.0e6, 1.2e6], "the best case that did not fail, in tokens/s: %s" % values[0])
    check(values[1][0] > values[0][0], "16 GPUs' bar is the taller, though their step is longer: %s" % values)
    labels = chart.legend_labels([eight, sixteen])
    check(labels == [eight["cluster_label"], sixteen["cluster_label"]], "labels are the cluster labels: %s" % labels)
    same = chart.legend_labels([eight, eight])
    check(len(set(same)) == 2, "the same cluster twice gets two labels: %s" % same)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("skip: no matplotlib, no chart drawn")
    else:
        os.makedirs(argv[2], exist_ok=True)
        paths = []
        for name, data in (("eight", eight), ("sixteen", sixteen)):
            paths.append(os.path.join(argv[2], name + ".json"))
            with open(paths[-1], "w") as f:
                json.dump(data, f)
        png = os.path.join(argv[2], "chart.png")
        r = subprocess.run([sys.executable, os.path.join(argv[1], "launch", "plan_chart.py"), png] + paths,
                           capture_output=True, text=True)
        check(r.returncode == 0 and os.path.getsize(png) > 0, "a chart is drawn: %s %s" % (r.stdout, r.stderr))
    if failures:
        print("plan_chart_test: %d check(s) failed" % len(failures))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
