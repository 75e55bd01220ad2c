#!/usr/bin/env python3
"""launch/gpu_check.sh without a GPU: nvidia-smi and ctest are fakes (SCMOE_NVIDIA_SMI, SCMOE_CTEST), so
each case is the same on a machine with one.

  gpu_check_test.py no-gpu ROOT         no GPU listed: exit 4, says why, builds and writes nothing; a listed
                                        GPU passes the check
  gpu_check_test.py help   ROOT         --help lists exactly the options the parser takes, the exit statuses
                                        and every environment variable; usage errors exit 2
  gpu_check_test.py script ROOT BUILD   the whole script on the CPU backend (SCMOE_GPU_CHECK_BACKEND=cpu) with
                                        --skip-build on BUILD: a skipped GPU test fails it, every benchmark runs
  gpu_check_test.py steps  ROOT         the whole script on fake binaries: a benchmark that fails and one that
                                        hangs are recorded (the second timed out) and the others still run
"""

import json
import os
import re
import shutil
import sys
import tempfile

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_check_util import (  # noqa: E402
    H100_LISTING,
    check,
    fake_smi,
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

CASE, ROOT = sys.argv[1], os.path.abspath(sys.argv[2])
SCRIPT, _ = paths(ROOT)


# ---- no GPU ----------------------------------------------------------------------------------------------


def case_no_gpu():
    with tempfile.TemporaryDirectory() as d:
        build = os.path.join(d, "build")
        cases = [
            ("nvidia-smi answers 'No devices were found'", fake_smi(d, "No devices were found\\n", 6), "No devices"),
            ("nvidia-smi lists nothing", write(os.path.join(d, "empty-smi"), "#!/bin/sh\nexit 0\n", True), ""),
            ("nvidia-smi is not installed", os.path.join(d, "missing", "nvidia-smi"), "not installed"),
            # tests/gpu_presence.h: only "GPU <n>:" lines name a GPU.
            (
                "a line that is no GPU listing",
                write(os.path.join(d, "odd-smi"), "#!/bin/sh\necho 'GPU: unknown'\necho 'GPUs 0: x'\n", True),
                "",
            ),
        ]
        for what, smi, says in cases:
            r = run([SCRIPT, "--build-dir", build], env={"SCMOE_NVIDIA_SMI": smi})
            check(r.returncode == 4, f"{what}: exit 4", f"rc {r.returncode}\n{r.stdout}{r.stderr}")
            check(
                "no GPU" in r.stderr and "exit 4" in r.stderr and says in r.stderr,
                f"{what}: stderr says there is no GPU, why, and the exit status",
                r.stderr,
            )
            check(not os.path.exists(build), f"{what}: nothing built, no report folder", str(os.listdir(d)))
        # The other side of the rule: a listed GPU passes detection and the script goes on (here to its
        # missing-binaries check, exit 3), so exit 4 above is the detection's answer.
        smi = fake_smi(d, H100_LISTING)
        os.makedirs(build, exist_ok=True)
        r = run([SCRIPT, "--build-dir", build, "--skip-build"], env={"SCMOE_NVIDIA_SMI": smi})
        check(
            r.returncode == 3 and "scmoe-bench" in r.stderr and "no GPU" not in r.stderr,
            "a listed GPU passes detection (then --skip-build without binaries: exit 3)",
            f"rc {r.returncode}\n{r.stderr}",
        )


# ---- help and usage ------------------------------------------------------------------------------------


def case_help():
    r = run([SCRIPT, "--help"], env={"SCMOE_NVIDIA_SMI": "/nonexistent"})
    check(
        r.returncode == 0 and r.stdout.startswith("The one command"),
        "--help exits 0 without a GPU",
        r.stdout + r.stderr,
    )
    text = r.stdout
    src = read_text(SCRIPT)
    # Every option the parser's case arms accept is in the help, and every option the help lists is parsed.
    parsed = set(re.findall(r"^\s+((?:-\w\|)?--[\w-]+)\)", src, re.M))
    parsed = {o for p in parsed for o in p.split("|")}
    # The options list: the indented lines "  -B, --build-dir DIR   ..." / "      --quick ...".
    listed = set()
    for m in re.finditer(r"^ {2,}((?:-\w, )?--[\w-]+)", text, re.M):
        listed |= set(m.group(1).split(", "))
    for o in sorted(parsed):
        check(o in listed, f"help lists {o}", str(sorted(listed)))
    for o in sorted(listed):
        check(o in parsed, f"help's {o} is an option the script parses", str(sorted(parsed)))
    for code, meaning in (
        ("0", "passed"),
        ("1", "skipped"),
        ("2", "bad command line"),
        ("3", "build failed"),
        ("4", "no GPU"),
    ):
        check(re.search(rf"\b{code} [^;]*{meaning}", text, re.S) is not None, f"help: exit status {code} ({meaning})")
    for var in re.findall(r"\$\{?(SCMOE_[A-Z0-9_]+)", src):
        check(var in text, f"help documents the environment variable {var}")
    for args, what in (
        (["--bogus"], "an unknown option"),
        (["--build-dir"], "an option without its value"),
        (["--peak-tflops", "fast"], "a peak that is no number"),
        (["--peak-tflops", "0"], "a zero peak"),
    ):
        r = run([SCRIPT] + args, env={"SCMOE_NVIDIA_SMI": "/nonexistent"})
        check(
            r.returncode == 2 and "usage" in r.stderr,
            f"{what}: exit 2 before the GPU check",
            f"rc {r.returncode} {r.stderr}",
        )
    r = run([SCRIPT], env={"SCMOE_NVIDIA_SMI": "/nonexistent", "SCMOE_GPU_CHECK_BACKEND": "rocm"})
    check(r.returncode == 2, "a bad SCMOE_GPU_CHECK_BACKEND: exit 2", r.stderr)


# ---- the whole script on the CPU backend ----------------------------------------------------------------


def case_script():
    build = os.path.abspath(sys.argv[3])
    with tempfile.TemporaryDirectory() as d:
        smi = fake_smi(d, H100_LISTING)
        args_file = os.path.join(d, "ctest-args")
        junit_text = junit(
            passed("GpuOps.Gemm"),
            skipped_no_cuda("GpuOps.Permute"),
            skipped_expected("GpuDevice.MakeCudaWithoutDeviceThrows"),
        )
        write(os.path.join(d, "junit.xml"), junit_text)
        ctest = write(
            os.path.join(d, "ctest"),
            f"""#!/bin/sh
printf '%s\\n' "$@" > '{args_file}'
while [ $# -gt 0 ]; do [ "$1" = --output-junit ] && cp '{d}/junit.xml' "$2"; shift; done
echo "fake ctest: 3 tests"
""",
            executable=True,
        )
        out = os.path.join(d, "report")
        r = run(
            [SCRIPT, "--build-dir", build, "--out", out, "--skip-build", "--test-args", "-R Gpu -E Nccl"],
            cwd=d,
            env={"SCMOE_NVIDIA_SMI": smi, "SCMOE_CTEST": ctest, "SCMOE_GPU_CHECK_BACKEND": "cpu"},
        )
        text = r.stdout + r.stderr
        check(r.returncode == 1, "a GPU test skipped: exit 1", f"rc {r.returncode}\n{text[-3000:]}")
        ctest_args = read_text(args_file).split("\n") if os.path.exists(args_file) else []
        check(
            ctest_args[:4] == ["--test-dir", build, "-L", "gpu"]
            and "--output-junit" in ctest_args
            and ctest_args[-5:-1] == ["-R", "Gpu", "-E", "Nccl"],
            "ctest: the build's gpu label, a JUnit file, --test-args",
            str(ctest_args),
        )
        rep = read_json(os.path.join(out, "report.json"))
        md = read_text(os.path.join(out, "report.md"))
        failed = [f["step"] for f in rep["failures"]]
        check(
            failed == ["tests"] and "GpuOps.Permute" in rep["failures"][0]["why"],
            "the skipped test is the one failure; every benchmark ran",
            json.dumps(rep["failures"]),
        )
        for name in ("gemm", "layer", "block", "train"):
            b = rep["benchmarks"].get(name, {})
            check(
                b.get("status") == "ok"
                and "--backend" in b.get("command", [])
                and b["command"][b["command"].index("--backend") + 1] == "cpu",
                f"{name}: ran on the CPU backend",
                json.dumps(b)[:500],
            )
        blk = rep["benchmarks"]["block"]["command"]
        check(
            blk[blk.index("--ranks") + 1] == "4" and blk[blk.index("--link") + 1] == "pcie4",
            "block: 4 ranks behind pcie4",
        )
        check(
            "--preset" in rep["benchmarks"]["train"]["command"]
            and "gpt2-moe-small" in rep["benchmarks"]["train"]["command"]
            and rep["benchmarks"]["train"]["rows"][0]["peak_tflops"] == 989.0,
            "train: gpt2-moe-small with the H100 peak",
        )
        attention = [k for k in rep["benchmarks"] if k.startswith("attention")]
        check(
            len(attention) == 2 and all(rep["benchmarks"][k]["status"] in ("ok", "not available") for k in attention),
            "attention and its PyTorch comparison: run or 'not available', never a failure here",
            str(attention),
        )
        check(all(rep["benchmarks"][k]["status"] != "failed" for k in rep["benchmarks"]), "no benchmark failed")
        check(
            rep["context"]["backend"] == "cpu"
            and rep["gpu"]["gpus"][0]["compute_capability"] == "9.0"
            and rep["context"]["cuda_architectures"] == "90",
            "context: backend, the GPU and its architecture",
        )
        check("Result: **FAILED**" in md and "## Failures" in md, "report.md says FAILED")
        # The emulator beside every measured gemm, attention, layer and train time: the spec's and the
        # profile's prediction (both predictions, with an error, for each kind).
        emu = rep["emulator"]
        kinds = {r["benchmark"].split("_")[0] for r in emu if "spec_error_pct" in r and "profile_error_pct" in r}
        check(kinds == {"gemm", "attention", "layer", "train"}, f"the emulator's predictions beside {sorted(kinds)}",
              json.dumps(emu)[:1500])
        check(all(rep["benchmarks"][f"emu_{k}_{n}"]["status"] == "ok" for k in ("spec", "profile")
                  for n in ("gemm", "layer", "train")), "every emulated step ran")
        check("## The emulator next to the measurements" in md, "report.md has the emulator's table")
        # The train step's trace, op by op beside the spec's and the profile's traces of it.
        steps = rep["step_breakdown"]
        check(bool(steps) and steps[0]["op"] == "(the traced step)"
              and all(isinstance(steps[0].get(f"{k}_ms"), float) for k in ("spec", "profile"))
              and any(r["op"] == "attn_bwd#" and isinstance(r.get("spec_ms"), float) for r in steps),
              "the train step's breakdown, measured and emulated", json.dumps(steps)[:1500])
        check("## Where the train step's time goes" in md, "report.md has the breakdown")
        check(re.search(r"\[\d+/\d+\] gemm: ok", text) is not None, "progress lines per step", text[-2000:])
        for f in (
            "gemm.json",
            "layer.json",
            "block.json",
            "train.log",
            "train.metrics.jsonl",
            "train_trace.rank0.json",
            "emu_spec_train_trace.rank0.json",
            "tests.json",
            "steps.jsonl",
        ):
            check(os.path.exists(os.path.join(out, "raw", f)), f"raw/{f} kept")


# ---- failing and hanging steps, on fake binaries -------------------------------------------------------

FAKE_BENCH = r"""#!/bin/sh
# A fake scmoe-bench: gemm on the GPU fails, layer hangs, block and attention write a report, the
# emulated gemm (the MFU's spec) describes an H100, the emulated layer writes a report.
sub=$1; shift
json=""; backend=""
for a in "$@"; do
  [ "$prev" = -J ] && json=$a
  [ "$prev" = --backend ] && backend=$a
  [ "$a" = --help ] && exit 0
  prev=$a
done
case "$sub:$backend" in
  gemm:emu) echo '{"benchmark": "gemm", "device": "emu: NVIDIA H100 SXM5 80GB: 132 SMs, 989 TFLOP/s bf16, 3350 GB/s, 80.0 GiB (modeled)", "rows": [], "wrong": 0}' > "$json" ;;
  gemm:*) echo "scmoe-bench gemm: error: cublas exploded" >&2; exit 3 ;;
  layer:emu) echo '{"benchmark": "layer", "rows": [{"dispatch": "dropless", "tokens": 8192, "fwd_us": 50.0, "wrong": null}], "wrong": 0}' > "$json" ;;
  layer:*) echo "layer: starting"; sleep 120 ;;
  block:*) echo '{"benchmark": "block", "rows": [{"variant": "top2", "train_us": 1000.0, "wrong": 0}, {"variant": "scmoe-pos2", "train_us": 800.0, "wrong": 0}], "wrong": 0}' > "$json" ;;
  attention:*) echo '{"benchmark": "attention", "rows": [{"provider": "auto", "batch": 8, "seq": 1024, "heads": 12, "head_dim": 64, "fwd_us": 100.0, "fwd_bwd_us": 350.0, "wrong": 0}], "wrong": 0}' > "$json" ;;
  *) echo "unexpected: $sub $*" >&2; exit 2 ;;
esac
"""

FAKE_TRAIN = r"""#!/bin/sh
# A fake scmoe-train: 3 steps of metrics and a line that is no JSON, then the summary's TFLOP/s line.
while [ $# -gt 0 ]; do [ "$1" = --metrics ] && metrics=$2; shift; done
for step in 1 2 3; do
  echo "{\"variant\":\"scmoe-pos2\",\"step\":$step,\"loss\":5.0,\"tokens_per_s\":$((step * 1000)).0,\"step_ms\":10.0}" >> "$metrics"
done
echo "not JSON" >> "$metrics"
echo "# scmoe-pos2: 123.456 model TFLOP/s per rank, MFU 12.5% of 989.0 TFLOP/s"
"""


def case_steps():
    with tempfile.TemporaryDirectory() as d:
        build = os.path.join(d, "build")
        os.makedirs(os.path.join(build, "bench"))
        os.makedirs(os.path.join(build, "launch"))
        write(os.path.join(build, "bench", "scmoe-bench"), FAKE_BENCH, executable=True)
        write(os.path.join(build, "launch", "scmoe-train"), FAKE_TRAIN, executable=True)
        write(
            os.path.join(d, "junit.xml"),
            junit(passed("GpuOps.Gemm"), skipped_expected("GpuDevice.MakeCudaWithoutDeviceThrows")),
        )
        ctest = write(
            os.path.join(d, "ctest"),
            f"""#!/bin/sh
while [ $# -gt 0 ]; do [ "$1" = --output-junit ] && cp '{d}/junit.xml' "$2"; shift; done
""",
            executable=True,
        )
        smi = fake_smi(d, H100_LISTING)
        # The script from a checkout of its own files: no launch/attention_torch.py, so the 3 s step limit
        # below meets no real PyTorch run.
        checkout = os.path.join(d, "checkout", "launch")
        os.makedirs(checkout)
        for f in ("gpu_check.sh", "gpu_report.py", "gpu_peak.py", "gpu_test_skips.py"):
            shutil.copy(os.path.join(ROOT, "launch", f), checkout)
        out = os.path.join(d, "report")
        r = run(
            [os.path.join(checkout, "gpu_check.sh"), "-B", build, "-o", out, "--skip-build", "-q"],
            env={"SCMOE_NVIDIA_SMI": smi, "SCMOE_CTEST": ctest, "SCMOE_GPU_CHECK_TIMEOUT_S": "3"},
        )
        text = r.stdout + r.stderr
        check(r.returncode == 1, "a failed and a hung benchmark: exit 1", f"rc {r.returncode}\n{text[-3000:]}")
        rep = read_json(os.path.join(out, "report.json"))
        failed = {f["step"]: f["why"] for f in rep["failures"]}
        check(
            set(failed) == {"gemm", "layer"},
            "exactly the failing and the hung benchmark are failures",
            json.dumps(failed),
        )
        check(
            "exit status 3" in failed.get("gemm", "") and "cublas exploded" in failed.get("gemm", ""),
            "the failure's reason: its exit status and last line",
            json.dumps(failed),
        )
        check("timed out after 3 s" in failed.get("layer", ""), "the hung benchmark timed out", json.dumps(failed))
        b = rep["benchmarks"]
        check(
            b["block"]["status"] == "ok" and [x["train_us"] for x in b["block"]["result"]["rows"]] == [1000.0, 800.0],
            "the benchmarks after them still ran and are reported",
        )
        check(
            rep["tests"]["status"] == "ok" and rep["tests"]["summary"]["passed"] == 1,
            "GPU tests: a pass and the expected skip are ok",
        )
        row = b["train"]["rows"][0]
        check(
            row["tokens_per_s"] == 2500.0
            and row["model_tflops_per_gpu"] == 123.456
            and abs(row["mfu_pct"] - 100 * 123.456 / 989.0) < 1e-12
            and row["trainer_mfu_pct"] == 12.5,
            "train: tokens/s over steps 2-3, model TFLOP/s and MFU from the spec's peak",
            json.dumps(row),
        )
        check(
            b["train"]["status"] == "ok" and "1 unreadable metrics line" in b["train"]["note"],
            "an unreadable metrics line is noted, not fatal",
            json.dumps(b["train"])[:400],
        )
        att = rep["attention"].get("b8_s1024_h12_d64", {}).get("rows", [])
        check(
            b["attention_b8_s1024_h12_d64"]["status"] == "ok" and att and att[0]["fwd_us"] == 100.0,
            "attention: run when scmoe-bench has it",
            json.dumps(rep["attention"])[:500],
        )
        torch = b.get("attention_torch_b8_s1024_h12_d64", {})
        check(
            torch.get("status") == "not available"
            and "attention_torch.py is not in this checkout" in torch.get("note", ""),
            "PyTorch's script missing: 'not available', no failure",
            json.dumps(torch),
        )
        check(rep["context"]["commit"] == "unknown", "outside a git checkout the commit is 'unknown'")


{"no-gpu": case_no_gpu, "help": case_help, "script": case_script, "steps": case_steps}[CASE]()
finish(f"gpu_check_test {CASE}")
