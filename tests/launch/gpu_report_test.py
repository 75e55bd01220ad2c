#!/usr/bin/env python3
"""launch/gpu_report.py (and the gpu_test_skips.py / gpu_peak.py it calls) without a GPU.

gpu_report_test.py skips  ROOT               the skip detection on hand-made JUnit files, ctest's and gtest's
gpu_report_test.py report ROOT BENCH TRAIN   the report on the JSON the CPU benchmarks and trainer write at tiny
                                             sizes: every section, the inputs' numbers, tokens/s and MFU, the
                                             peak from the built-in specs, failures listed
"""

import importlib.util
import json
import os
import re
import sys
import tempfile

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_check_util import (  # noqa: E402
    check,
    ctest_case,
    failed,
    finish,
    junit,
    passed,
    paths,
    read_json,
    read_text,
    run,
    skipped_expected,
    skipped_no_cuda,
    write,
)

CASE = sys.argv[1]
SCRIPT, REPORT = paths(sys.argv[2])


def report_py(*args):
    return run([sys.executable, REPORT] + [str(a) for a in args])


def load_report_module():
    spec = importlib.util.spec_from_file_location("gpu_report", REPORT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---- skip detection ------------------------------------------------------------------------------------


def skips(d, name, text):
    path = write(os.path.join(d, name + ".xml"), text)
    out = os.path.join(d, name + ".json")
    r = report_py("skips", path, "--json", out)
    return r, (read_json(out) if os.path.exists(out) else None)


def names(cases):
    return [c["name"] for c in cases]


def case_skips():
    with tempfile.TemporaryDirectory() as d:
        r, s = skips(
            d,
            "mixed",
            junit(
                passed("GpuOps.Gemm"),
                skipped_no_cuda("GpuOps.Permute"),
                skipped_expected("GpuDevice.MakeCudaWithoutDeviceThrows"),
                failed("GpuOps.Combine"),
            ),
        )
        check(r.returncode == 1, "a skip and a failure: exit 1", r.stdout + r.stderr)
        check(s["total"] == 4 and s["passed"] == 1, "counts: 4 run, 1 passed", json.dumps(s))
        check(
            names(s["skipped_unexpected"]) == ["GpuOps.Permute"]
            and s["skipped_unexpected"][0]["reason"].startswith("no CUDA device"),
            "the GTEST_SKIP is found, with its reason",
            json.dumps(s),
        )
        check(
            names(s["skipped_expected"]) == ["GpuDevice.MakeCudaWithoutDeviceThrows"],
            "the test that covers machines without a GPU is an expected skip",
            json.dumps(s),
        )
        check(names(s["failed"]) == ["GpuOps.Combine"], "the failure is found", json.dumps(s))
        check("SKIPPED GpuOps.Permute: no CUDA device" in r.stdout, "the skipped test and its reason are printed")

        r, s = skips(d, "only_skip", junit(passed("GpuOps.Gemm"), skipped_no_cuda("GpuOps.Permute")))
        check(r.returncode == 1 and len(s["skipped_unexpected"]) == 1, "one skip and no failure: exit 1", r.stdout)

        r, s = skips(
            d,
            "clean",
            junit(passed("A.B"), passed("A.C"), skipped_expected("GpuDevice.MakeCudaWithoutDeviceThrows")),
        )
        check(r.returncode == 0 and s["ok"] and s["passed"] == 2, "passes and the expected skip only: exit 0", r.stdout)

        # A skip ctest did not flag (no SKIP_REGULAR_EXPRESSION): gtest's "[  SKIPPED ]" line gives it away.
        body = "gpu_test.cpp:9: Skipped\nno CUDA device: skipped\n[  SKIPPED ] GpuOps.Router (0 ms)\n"
        r, s = skips(d, "unflagged", junit(passed("GpuOps.Gemm"), ctest_case("GpuOps.Router", "run", body)))
        check(
            r.returncode == 1 and names(s["skipped_unexpected"]) == ["GpuOps.Router"],
            "a skip ctest reports as passed is still a skip",
            json.dumps(s),
        )

        # gtest's own JUnit (--gtest_output=xml): result="skipped" and a <skipped> element with the message.
        gtest_xml = (
            '<?xml version="1.0" encoding="UTF-8"?>\n<testsuites tests="2" failures="0" disabled="0" errors="0">\n'
            '<testsuite name="GpuOps" tests="2">\n'
            '<testcase name="Gemm" status="run" result="completed" classname="GpuOps"/>\n'
            '<testcase name="Permute" status="run" result="skipped" classname="GpuOps">\n'
            '<skipped message="gpu_test.cpp:10&#x0A;no CUDA device"><![CDATA[no CUDA device]]></skipped>\n'
            "</testcase>\n</testsuite>\n</testsuites>\n"
        )
        r, s = skips(d, "gtest", gtest_xml)
        check(
            r.returncode == 1 and names(s["skipped_unexpected"]) == ["GpuOps.Permute"] and s["passed"] == 1,
            "gtest's JUnit: the skip is found and named Suite.Test",
            json.dumps(s),
        )

        # A test ctest could not run at all (no executable) is no pass.
        gone = (
            '\t<testcase name="GpuOps.Gone" classname="GpuOps.Gone" time="0" status="notrun">\n'
            '\t\t<skipped message="Unable to find executable"/>\n\t\t<system-out></system-out>\n\t</testcase>\n'
        )
        r, s = skips(d, "notrun", junit(passed("GpuOps.Gemm"), gone))
        check(
            r.returncode == 1 and s["skipped_unexpected"][0]["reason"] == "Unable to find executable",
            "a test ctest could not run: exit 1, with ctest's reason",
            json.dumps(s),
        )

        r, s = skips(d, "empty", junit())
        check(r.returncode == 1 and s["total"] == 0 and "no GPU test ran" in r.stderr, "no test at all: exit 1")
        r = report_py("skips", os.path.join(d, "missing.xml"), "--json", os.path.join(d, "missing.json"))
        s = read_json(os.path.join(d, "missing.json"))
        check(r.returncode == 1 and not s["ok"] and "cannot read" in s["error"], "no JUnit file: exit 1, says so")


# ---- the report on CPU benchmark output ----------------------------------------------------------------


def record(raw, name, status, *extra, command=()):
    r = report_py("step", "--raw", raw, "--name", name, "--status", status, *extra, "--", *command)
    assert r.returncode == 0, r.stderr


def run_step(raw, name, cmd, json_path=""):
    """Runs a benchmark as gpu_check.sh does: its output in raw/NAME.log, its outcome in raw/steps.jsonl."""
    r = run(cmd)
    write(os.path.join(raw, name + ".log"), r.stdout + r.stderr)
    status = "ok" if r.returncode == 0 else "failed"
    record(raw, name, status, "--rc", r.returncode, "--seconds", 1, "--json", json_path, command=cmd)
    return r


def write_machine(raw):
    write(os.path.join(raw, "nvidia-smi-query.csv"), "0, NVIDIA H100 80GB HBM3, 580.65.06, 9.0, 81559 MiB\n")
    write(
        os.path.join(raw, "nvidia-smi.txt"), "| NVIDIA-SMI 580.65.06  Driver Version: 580.65.06  CUDA Version: 13.0 |\n"
    )
    write(os.path.join(raw, "nvcc.txt"), "Cuda compilation tools, release 13.0, V13.0.88\n")
    write(os.path.join(raw, "configure.txt"), "-- scmoe: CUDA backend ON (architectures: 90)\n")


def run_benchmarks(raw, bench, train):
    """The steps of a gpu_check.sh run, on the CPU backend at tiny sizes; returns the JSON paths."""
    tests_xml = write(
        os.path.join(raw, "gpu-tests.junit.xml"),
        junit(
            passed("GpuOps.Gemm"), passed("GpuOps.Permute"), skipped_expected("GpuDevice.MakeCudaWithoutDeviceThrows")
        ),
    )
    check(report_py("skips", tests_xml, "--json", os.path.join(raw, "tests.json")).returncode == 0, "tests.json")
    record(raw, "tests", "ok", "--rc", 0, "--seconds", 2, command=["ctest", "-L", "gpu"])
    j = {n: os.path.join(raw, n + ".json") for n in ("gemm", "layer", "block", "attention")}
    tiny = "--hidden 32 --ffn 48 --experts 4 -n 1 -w 0".split()
    run_step(raw, "gemm", [bench, "gemm", "--backend", "cpu", "--loads", "balanced,zipf", "--tokens", "64,100"]
             + tiny + ["-J", j["gemm"]], j["gemm"])  # fmt: skip
    run_step(raw, "layer", [bench, "layer", "--backend", "cpu", "--dispatch", "capacity,dropless", "--tokens", "64"]
             + tiny + ["-J", j["layer"]], j["layer"])  # fmt: skip
    run_step(raw, "block", [bench, "block", "--backend", "cpu", "--ranks", "4", "--link", "pcie4", "--tokens", "64",
                            "--seq", "32", "--heads", "2", "--variants", "top2,scmoe-pos2"]
             + tiny + ["-J", j["block"]], j["block"])  # fmt: skip
    # Attention: scmoe-bench attention's rows (run here when this scmoe-bench has it, else rows of its format)
    # and a PyTorch report of the same shape with the same row fields (launch/attention_torch.py's).
    if run([bench, "attention", "--help"]).returncode == 0:
        shape = "--batch 2 --seq 32 --heads 2 --head-dim 8 --provider auto,own -n 1 -w 0".split()
        cmd = [bench, "attention", "--backend", "cpu"] + shape + ["-J", j["attention"]]
        run_step(raw, "attention_b2_s32_h2_d8", cmd, j["attention"])
    else:
        rows = [
            dict(provider=p, batch=2, seq=32, heads=2, head_dim=8, dtype="f32", fwd_us=us, fwd_tflops=0.01,
                 bwd_us=2 * us, bwd_tflops=0.01, fwd_bwd_us=3 * us, fwd_bwd_tflops=0.01, wrong=0)
            for p, us in (("auto", 40.0), ("own", 50.0))
        ]  # fmt: skip
        write(j["attention"], json.dumps({"benchmark": "attention", "wrong": 0, "rows": rows}))
        record(raw, "attention_b2_s32_h2_d8", "ok", "--rc", 0, "--json", j["attention"], command=[bench, "attention"])
    torch_rows = [
        dict(provider="sdpa-math", batch=2, seq=32, heads=2, head_dim=8, fwd_us=90.0, fwd_bwd_us=300.0),
        dict(provider="sdpa-flash", batch=2, seq=32, heads=2, head_dim=8, fwd_us=60.0, fwd_bwd_us=200.0),
    ]
    torch_json = write(os.path.join(raw, "attention_torch_b2_s32_h2_d8.json"), json.dumps({"rows": torch_rows}))
    record(raw, "attention_torch_b2_s32_h2_d8", "ok", "--rc", 0, "--json", torch_json, command=["attention_torch.py"])
    record(raw, "attention_b2_s32_h2_d16", "not available", "--note", "this scmoe-bench has no attention subcommand")
    record(raw, "attention_torch_b2_s32_h2_d16", "not available", "--rc", 3, "--note", "torch is not importable")

    r = report_py(
        "spec", "--gpu-name", "NVIDIA H100 80GB HBM3", "--bench", bench, "--json", os.path.join(raw, "spec.json")
    )
    check(
        r.returncode == 0 and r.stdout.strip() == "989",
        "spec: an H100 SXM's peak from the built-in h100 spec",
        r.stderr,
    )
    j["metrics"] = os.path.join(raw, "train.metrics.jsonl")
    small = "--preset tiny --backend cpu --layers 2 --steps 3 --batch 2 --variants top2,scmoe-pos2".split()
    run_step(raw, "train", [train] + small + ["--peak-tflops", "989", "--metrics", j["metrics"],
                                               "--trace", os.path.join(raw, "train_trace")])
    emu = "--backend emu --gpu h100 --cluster h100-nvlink-8".split()
    run_step(raw, "emu_spec_train", [train] + small[:2] + emu + small[4:] + [
        "--peak-tflops", "989", "--metrics", os.path.join(raw, "emu_spec_train.metrics.jsonl"),
        "--trace", os.path.join(raw, "emu_spec_train_trace")])
    return j


def trace_totals(path):
    """(span in ms, the sum of every op's time in ms, the ops' names) of a scmoe-train --trace file,
    read here independently of gpu_report.py."""
    events = [e for e in read_json(path)["traceEvents"] if e.get("ph") == "X"]
    start = min(e["ts"] for e in events)
    end = max(e["ts"] + e["dur"] for e in events)
    return (end - start) / 1000.0, sum(e["dur"] for e in events) / 1000.0, {e["name"] for e in events}


SECTIONS = (
    "## GPU tests",
    "## Grouped GEMM vs cuBLAS dense at equal FLOPs",
    "## Attention vs PyTorch scaled_dot_product_attention",
    "## MoE layer forward and forward+backward",
    "## ScMoE block variants, 4 local ranks, emulated PCIe 4 link",
    "## gpt2-moe-small training: tokens/s and MFU",
    "## Failures",
)


def check_complete_report(rep, md, j, raw, fmt):
    check(rep["ok"] and rep["failures"] == [], "report.json: ok, no failures", json.dumps(rep["failures"]))
    for title in SECTIONS:
        check(title in md, f"report.md has the section '{title}'")
    g = rep["gpu"]
    check(
        g["gpus"][0]["name"] == "NVIDIA H100 80GB HBM3"
        and g["gpus"][0]["driver"] == "580.65.06"
        and g["driver_cuda_version"] == "13.0"
        and g["toolkit_cuda_version"] == "13.0.88"
        and g["configure"] == ["CUDA backend ON (architectures: 90)"],
        "GPU, driver, CUDA versions and the configure summary",
        json.dumps(g),
    )
    check(rep["context"]["commit"] == "abc123" and "| commit | abc123 |" in md, "the commit is in both files")
    t = rep["tests"]["summary"]
    check(t["total"] == 3 and t["passed"] == 2 and len(t["skipped_expected"]) == 1, "test counts", json.dumps(t))
    check("| 3 | 2 | 0 | 0 | 1 |" in md, "test counts in the markdown table")

    for name, keys in (
        ("gemm", ("grouped_us", "dense_us", "ratio")),
        ("layer", ("fwd_us", "fwd_bwd_us")),
        ("block", ("train_us", "exposed_comm_pct")),
    ):
        src = read_json(j[name])
        sec = rep["benchmarks"][name]
        check(
            sec["result"]["rows"] == src["rows"] and len(src["rows"]) >= 2, f"{name}: the rows as the benchmark wrote"
        )
        check(sec["command"][1] == name and "-J" in sec["command"], f"{name}: the command that reproduces it")
        for row in src["rows"]:
            for k in keys:
                check(fmt(row[k]) in md, f"{name}: {k} = {row[k]} is in report.md as {fmt(row[k])}")
    loads = {(r["load"], r["tokens"]) for r in rep["benchmarks"]["gemm"]["result"]["rows"]}
    check(loads == {("balanced", 64), ("zipf", 64), ("balanced", 100), ("zipf", 100)}, "gemm: balanced and Zipf rows")

    cmp = rep["attention"]["b2_s32_h2_d8"]["rows"]
    ours = [r for r in cmp if r["source"] == "scmoe"]
    src = read_json(j["attention"])["rows"]
    check(len(ours) == len(src) >= 1 and len(cmp) == len(src) + 2, "attention: scmoe's and PyTorch's rows in one table")
    for r in ours:
        check(
            abs(r["torch_over_scmoe_fwd"] - 60.0 / r["fwd_us"]) < 1e-12
            and abs(r["torch_over_scmoe_fwd_bwd"] - 200.0 / r["fwd_bwd_us"]) < 1e-12,
            f"attention {r['provider']}: torch/scmoe against PyTorch's fastest row of the shape",
            json.dumps(r),
        )
        check(
            fmt(r["fwd_us"]) in md and fmt(r["torch_over_scmoe_fwd"]) in md, f"attention {r['provider']} in report.md"
        )
    b = rep["benchmarks"]
    check(
        b["attention_b2_s32_h2_d16"]["status"] == "not available"
        and b["attention_torch_b2_s32_h2_d16"]["status"] == "not available"
        and "no attention subcommand" in md
        and "torch is not importable" in md,
        "attention without the subcommand or torch: 'not available' with the reason, no failure",
    )

    # Training: tokens/s is the mean over the steps after the first, per variant; MFU = model TFLOP/s / peak.
    per = {}
    for line in read_text(j["metrics"]).splitlines():
        m = json.loads(line)
        per.setdefault(m["variant"], []).append(m)
    rows = {r["variant"]: r for r in b["train"]["rows"]}
    check(set(rows) == {"top2", "scmoe-pos2"}, "train: one row per variant", str(rows))
    log = read_text(os.path.join(raw, "train.log"))
    for v, ms in per.items():
        row = rows[v]
        want = sum(m["tokens_per_s"] for m in ms[1:]) / len(ms[1:])
        check(abs(row["tokens_per_s"] - want) <= 1e-9 * want, f"train {v}: tokens/s = mean after step 1", str(row))
        tf = float(re.search(rf"^# {v}: ([0-9.]+) model TFLOP/s per rank", log, re.M).group(1))
        check(
            row["model_tflops_per_gpu"] == tf and row["peak_tflops"] == 989.0 and row["mfu_pct"] == 100 * tf / 989.0,
            f"train {v}: MFU = {tf} / 989",
            str(row),
        )
        check(fmt(row["tokens_per_s"]) in md, f"train {v}: tokens/s in report.md")
        steps = sorted(m["step_ms"] for m in ms[1:])
        median = (steps[(len(steps) - 1) // 2] + steps[len(steps) // 2]) / 2
        check(row["median_step_ms"] == median, f"train {v}: the median step after step 1", str(row))
    check("989 TFLOP/s dense bf16, built-in spec 'h100'" in md, "the MFU's peak and its source are stated")

    # The step breakdown: per variant, the traced span and every op's time (digits taken out of the names;
    # small ops summed as "(other ops)"), beside the emulator's trace of the same command.
    rows = rep["step_breakdown"]
    for v in ("top2", "scmoe-pos2"):
        mine = [r for r in rows if r["variant"] == v]
        span, total, names = trace_totals(os.path.join(raw, f"train_trace.{v}.rank0.json"))
        emu_span, _, _ = trace_totals(os.path.join(raw, f"emu_spec_train_trace.{v}.rank0.json"))
        head = mine[0] if mine else {}
        check(head.get("op") == "(the traced step)" and abs(head["measured_ms"] - span) < 1e-9
              and abs(head["spec_ms"] - emu_span) < 1e-9, f"breakdown {v}: the traced spans", json.dumps(head))
        ops = mine[1:]
        check(abs(sum(r["measured_ms"] for r in ops) - total) < 1e-6, f"breakdown {v}: the ops sum to the trace's",
              json.dumps(ops)[:1000])
        collapsed = {re.sub(r"\d+", "#", n) for n in names}
        check({r["op"] for r in ops} - {"(other ops)"} <= collapsed and "attn_bwd#" in {r["op"] for r in ops},
              f"breakdown {v}: op names with their numbers taken out", str(sorted(collapsed)))
        check(all(isinstance(r.get("spec_ms"), float) for r in ops if r["op"] == "attn_bwd#"),
              f"breakdown {v}: the emulator's time beside the measured one")
    check("## Where the train step's time goes" in md and "attn_bwd#" in md, "the breakdown is in report.md")

    # Against a PyTorch row: the mean ratio and the median one (a compile still running in its second
    # and third steps moves the first, not the second).
    mod = load_report_module()
    ours = {"rows": [{"variant": "top2", "tokens_per_s": 200.0, "median_step_ms": 40.0}]}
    peer = {"result": {"rows": [{"variant": "top2", "mode": "compile", "tokens_per_s": 250.0, "median_step_ms": 25.0},
                                {"variant": "top2", "mode": "eager", "tokens_per_s": 100.0}]}}
    cmp = mod.train_comparison({"train": ours, "train_torch": peer})
    check(cmp[1]["scmoe_over_peer"] == 0.8 and cmp[1]["scmoe_over_peer_median"] == 25.0 / 40.0,
          "train vs PyTorch: mean and median ratios", str(cmp))
    check("scmoe_over_peer_median" not in cmp[2], "train vs PyTorch: no median ratio without the peer's median")


def case_report():
    bench, train = sys.argv[3], sys.argv[4]
    fmt = load_report_module().fmt
    with tempfile.TemporaryDirectory() as d:
        raw, out = os.path.join(d, "raw"), os.path.join(d, "out")
        os.makedirs(raw)
        write_machine(raw)
        j = run_benchmarks(raw, bench, train)
        r = report_py("report", "--raw", raw, "--out", out, "--context", "commit=abc123", "--context", "mode=smoke")
        check(r.returncode == 0, "every step ok: the report exits 0", r.stdout + r.stderr)
        rep, md = read_json(os.path.join(out, "report.json")), read_text(os.path.join(out, "report.md"))
        check_complete_report(rep, md, j, raw, fmt)

        # Failures: each makes the report exit 1 and is listed; the other sections stay.
        bad = read_json(j["block"])
        bad["wrong"] = 7
        write(j["block"], json.dumps(bad))
        record(raw, "attention_torch_b2_s32_h2_d8", "failed", "--rc", 1, "--note", "exit status 1: boom")
        record(raw, "layer", "ok", "--rc", 0, "--json", os.path.join(raw, "gone.json"), command=[bench, "layer"])
        r = report_py("report", "--raw", raw, "--out", out)
        rep, md = read_json(os.path.join(out, "report.json")), read_text(os.path.join(out, "report.md"))
        why = {f["step"]: f["why"] for f in rep["failures"]}
        check(r.returncode == 1 and not rep["ok"], "a failed benchmark: the report exits 1", r.stdout)
        check(set(why) == {"block", "attention_torch_b2_s32_h2_d8", "layer"}, "every failed step listed", str(why))
        check(
            "7 wrong elements" in why["block"] and "wrote no JSON" in why["layer"] and "boom" in why.get(
                "attention_torch_b2_s32_h2_d8", ""),
            "wrong elements, a missing JSON and a failed run are failures, with the reason",
            json.dumps(why),
        )  # fmt: skip
        check(
            "Result: **FAILED**" in md and "- **block**" in md and "## MoE layer forward" in md,
            "report.md: FAILED, the failures listed, the other sections kept",
        )

        # A report whose benchmarks never ran is no pass.
        os.makedirs(os.path.join(d, "empty"))
        r = report_py("report", "--raw", os.path.join(d, "empty"), "--out", os.path.join(d, "empty-out"))
        check(
            r.returncode == 1 and all(n in r.stdout for n in ("gemm", "layer", "block", "train")),
            "no benchmark record at all: exit 1, each missing one named",
            r.stdout,
        )

        # The peak: a GPU without a built-in spec gets no MFU, and the report says why.
        r = report_py("spec", "--gpu-name", "NVIDIA GeForce RTX 4090", "--bench", bench, "--json", f"{raw}/spec.json")
        check(r.returncode == 1 and "no built-in spec" in r.stderr, "an unknown GPU: no peak, and why", r.stderr)
        for name in ("NVIDIA H100 PCIe", "NVIDIA H100 NVL", "NVIDIA H200 NVL"):
            r = report_py("spec", "--gpu-name", name, "--bench", bench)
            check(r.returncode == 1 and "SXM part" in r.stderr, f"{name} does not get the SXM part's peak", r.stderr)
        r = report_py("spec", "--gpu-name", "NVIDIA RTX 4090", "--bench", bench, "--peak-tflops", "165.2")
        check(r.returncode == 0 and r.stdout.strip() == "165.2", "--peak-tflops wins", r.stdout + r.stderr)
        for name, want in (
            ("NVIDIA A100-SXM4-80GB", "312"),
            ("NVIDIA H200", "989"),
            ("NVIDIA GH200 480GB", "989"),
            ("NVIDIA A30", "165"),
        ):
            r = report_py("spec", "--gpu-name", name, "--bench", bench)
            check(r.returncode == 0 and r.stdout.strip() == want, f"spec: {name} -> {want} TFLOP/s", r.stderr)
        report_py("report", "--raw", raw, "--out", out)
        rep, md = read_json(os.path.join(out, "report.json")), read_text(os.path.join(out, "report.md"))
        check(
            all("mfu_pct" not in r for r in rep["benchmarks"]["train"]["rows"]) and "no built-in spec" in md,
            "without a peak the report has no MFU and says why",
        )


{"skips": case_skips, "report": case_report}[CASE]()
finish(f"gpu_report_test {CASE}")
