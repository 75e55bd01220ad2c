#!/usr/bin/env python3
"""launch/plan_readme.py on a hand-made plan: the best configuration per variant is the highest
tokens/s among the runs that neither ran out of memory nor failed, its band is the plan's, the
commands come from the .txt beside the JSON, a rewritten README passes --check and an edited one
fails it; a README without the plan's section is an error naming it."""
import json
import os
import subprocess
import sys
import tempfile


def case(variant, tps, ep=2, oom=False, error="", batch=4):
    return {"variant": variant, "tokens_per_s": tps, "step_ms": 1000.0 * 8 * batch * 16 / tps, "ep": ep, "dp": 4 // ep,
            "dispatch": "capacity", "capacity_factor": 1.25, "batch": batch, "chunks": "auto",
            "exposed_comm_pct": 10.0, "exposed_a2a_pct": 6.0, "exposed_grad_pct": 4.0,
            "dropped_tokens_per_step": 3.0, "peak_gib": 1.5, "out_of_memory": oom, "error": error}


def main():
    script = sys.argv[1]
    plan = {"cluster_label": "4 test GPUs", "assumed": ["assumed: a test link"], "warnings": [],
            "error_band": {"low": -0.2, "high": 1.0},
            "cases": [case("top2", 1000.0), case("top2", 2000.0, ep=4), case("top2", 9000.0, oom=True),
                      case("scmoe-pos2", 5000.0, error="a rank failed"), case("scmoe-pos2", 3000.0)]}
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "p.json"), "w") as f:
            json.dump(plan, f)
        with open(os.path.join(d, "p.txt"), "w") as f:
            f.write("table...\nbest: mpirun -np 4 scmoe-train --variants scmoe-pos2\nreplay-train: scmoe-train --backend emu\n")
        readme = os.path.join(d, "README.md")
        with open(readme, "w") as f:
            f.write("# plans\n\n**old label** (`p.json`)\n\nold table\n\n1 runs, 0 out of memory; old\n\n    old command\n\n## after\n")
        subprocess.run([sys.executable, script, readme, os.path.join(d, "p.json")], check=True, capture_output=True)
        text = open(readme).read()
        assert "**4 test GPUs** (`p.json`)" in text and "old" not in text, text
        assert text.endswith("\n## after\n"), text
        rows = [l for l in text.splitlines() if l.startswith("| top2") or l.startswith("| scmoe-pos2")]
        # scmoe-pos2's 5000 failed and top2's 9000 ran out of memory: 3000 and 2000 win, best first;
        # the band is tokens/s / (1 + high) .. / (1 + low).
        assert rows[0].startswith("| scmoe-pos2 | ep 2 x dp 2, capacity 1.25, batch 4 |"), rows
        assert "3000 (1500-3750)" in rows[0], rows
        assert rows[1].startswith("| top2 | ep 4 x dp 1,") and "2000 (1000-2500)" in rows[1], rows
        assert "6.0 + 4.0" in rows[0], rows
        assert "5 runs, 1 out of memory; no search-edge warning" in text, text
        assert "    mpirun -np 4 scmoe-train --variants scmoe-pos2\n    scmoe-train --backend emu\n" in text, text
        ok = subprocess.run([sys.executable, script, "--check", readme, os.path.join(d, "p.json")], capture_output=True)
        assert ok.returncode == 0, ok.stderr
        with open(readme, "w") as f:
            f.write(text.replace("3000 (1500-3750)", "3001 (1500-3750)"))
        stale = subprocess.run([sys.executable, script, "--check", readme, os.path.join(d, "p.json")],
                               capture_output=True, text=True)
        assert stale.returncode == 1 and "p.json" in stale.stderr, stale.stderr
        with open(readme, "w") as f:
            f.write("# no sections\n")
        missing = subprocess.run([sys.executable, script, readme, os.path.join(d, "p.json")], capture_output=True, text=True)
        assert missing.returncode != 0 and "p.json" in missing.stderr, missing.stderr
    print("ok")


main()
