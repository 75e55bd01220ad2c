#!/usr/bin/env python3
"""launch/gpu_bundle.py (the offline GPU bundle) without a GPU.

  gpu_bundle_test.py help ROOT          --help names every option; bad command lines exit 2
  gpu_bundle_test.py driver ROOT        run on a bundle stops at once: no GPU listed (exit 4), a driver
                                        older than the bundle's CUDA needs (exit 5, naming R580); a new
                                        enough driver passes the check
  gpu_bundle_test.py dry-run ROOT BUILD the CPU dry run: packs BUILD as it is (no second build), unpacks
                                        it and runs it in a mount and network namespace where the Debian
                                        packages and pip headers the bundle carries are hidden (overlayfs
                                        whiteouts) and no network is reachable, with a fake nvidia-smi.
                                        Every binary loads, ctest lists every packed GPU test and each of
                                        them skips, every benchmark step runs on the CPU backend, the
                                        fallback build configures from the bundle alone, the report is
                                        written. Needs root and unshare (exit 77, a ctest skip, otherwise).
"""

import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_check_util import H100_LISTING, check, fake_smi, finish, read_json, run, write  # noqa: E402

SKIP = 77


def bundle_script(root):
    return os.path.join(os.path.abspath(root), "launch", "gpu_bundle.py")


def case_help(root):
    script = bundle_script(root)
    r = run([sys.executable, script, "--help"])
    check(r.returncode == 0, "--help: exit 0", r.stderr)
    for opt in ("--arch", "--build-dir", "--output", "--max-mb", "--no-build", "--out", "--deadline-s", "--quick",
                "--force-build", "--fallback-configure-only", "--jobs"):
        check(opt in r.stdout, f"--help names {opt}")
    for args, what in ((["frobnicate"], "an unknown command"), (["pack", "--arch", "sm_90"], "a bad --arch"),
                       (["pack", "--bogus"], "an unknown pack option"), (["run", "--deadline-s", "5"],
                                                                           "a deadline under 60 s"),
                       ([], "no command")):
        r = run([sys.executable, script] + args)
        check(r.returncode == 2, f"{what}: exit 2", f"rc {r.returncode}\n{r.stdout}\n{r.stderr}")


def fake_bundle(root, d):
    """The smallest bundle `run` accepts: its script and a manifest."""
    os.makedirs(os.path.join(d, "launch"))
    shutil.copy2(bundle_script(root), os.path.join(d, "launch"))
    write(os.path.join(d, "manifest.json"), json.dumps({
        "name": "fake", "arch": "90a", "cuda_architectures": "90a-real", "cuda_version": "13.0", "commit": "0" * 40,
        "packed": "now", "binaries": [], "gpu_tests": ["GpuFake.Test"], "fallback_cmake_args": {}}))
    return os.path.join(d, "launch", "gpu_bundle.py")


def smi_with_driver(d, driver, listing=H100_LISTING):
    return write(os.path.join(d, f"nvidia-smi-{driver}"), f"""#!/bin/sh
case "$1" in
  -L) printf '{listing}' ;;
  --query-gpu=*) echo "0, NVIDIA H100 80GB HBM3, {driver}, 9.0, 81559 MiB" ;;
  *) echo "| NVIDIA-SMI {driver}    Driver Version: {driver}    CUDA Version: 12.2 |" ;;
esac
""", executable=True)


def case_driver(root):
    with tempfile.TemporaryDirectory() as d:
        script = fake_bundle(root, os.path.join(d, "bundle"))
        out = os.path.join(d, "out")
        r = run([sys.executable, script, "run", "-o", out], env={"SCMOE_NVIDIA_SMI": smi_with_driver(d, "535.104.05")})
        check(r.returncode == 5, "a 535 driver with a CUDA 13 bundle: exit 5", f"rc {r.returncode}\n{r.stderr}")
        check("R580" in r.stderr and "535.104.05" in r.stderr, "the message names the driver and R580", r.stderr)
        facts = read_json(os.path.join(out, "bundle.json"))
        check(facts["machine"]["gpus"] and "535.104.05" in facts["machine"]["gpus"][0],
              "the facts were written before stopping", json.dumps(facts)[:500])
        check(not any(p["name"].startswith("load_check") for p in facts["phases"]), "nothing ran after the check")
        r = run([sys.executable, script, "run", "-o", out], env={"SCMOE_NVIDIA_SMI": smi_with_driver(d, "x", "")})
        check(r.returncode == 4, "no GPU listed: exit 4", f"rc {r.returncode}\n{r.stderr}")
        # A new enough driver passes the check; the fake bundle then has no binaries and ctest finds
        # none of its one test: the run goes on past the check and reports the listing mismatch.
        r = run([sys.executable, script, "run", "-o", out, "--deadline-s", "60"],
                env={"SCMOE_NVIDIA_SMI": smi_with_driver(d, "580.65.06")})
        check("driver 580.65.06 >= R580" in r.stdout, "a 580 driver passes the check", r.stdout[-2000:] + r.stderr)


# ---- The dry run -----------------------------------------------------------------------------------------


def debian_files(packages):
    files = []
    for pkg in packages:
        p = subprocess.run(["dpkg", "-L", pkg], capture_output=True, text=True)
        files += [f for f in p.stdout.split("\n") if f and (os.path.islink(f) or not os.path.isdir(f))]
    return files


def owning_packages(paths):
    pkgs = set()
    for p in paths:
        r = subprocess.run(["dpkg", "-S", os.path.realpath(p)], capture_output=True, text=True)
        if r.returncode == 0:
            pkgs.add(r.stdout.split(":")[0])
    return pkgs


def tool_packages():
    """The Debian packages whose libraries the dry run's own tools load (python3, cmake, ctest, bash, tar,
    xz): a GPU machine has these tools, so their libraries stay visible even when the bundle carries one."""
    libs = []
    for tool in (sys.executable, shutil.which("cmake"), shutil.which("ctest"), "/bin/bash", shutil.which("tar"),
                 shutil.which("xz")):
        out = subprocess.run(["ldd", tool], capture_output=True, text=True).stdout
        libs += re.findall(r"=> (/\S+)", out)
    return owning_packages(libs)


def cache_value(build, name):
    with open(os.path.join(build, "CMakeCache.txt")) as f:
        m = re.search(rf"^{name}:[A-Z]+=(.*)$", f.read(), re.M)
    return m.group(1) if m else ""


def case_dry_run(root, build):
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("dpkg"):
        print("SKIP: the dry run needs root, unshare and dpkg (a Debian machine; CI runs as root)")
        sys.exit(SKIP)
    script = bundle_script(root)
    with tempfile.TemporaryDirectory(prefix="scmoe-bundle-test-") as d:
        archive = os.path.join(d, "bundle.tar.xz")
        r = run([sys.executable, script, "pack", "-B", build, "--no-build", "-o", archive, "--max-mb", "128"])
        check(r.returncode == 0, "pack --no-build of the test build: exit 0", r.stdout[-3000:] + r.stderr[-3000:])
        if r.returncode != 0:
            return
        print(r.stdout.strip().splitlines()[-2])
        unpacked = os.path.join(d, "unpacked")
        os.makedirs(unpacked)
        subprocess.run(["tar", "-xf", archive, "-C", unpacked], check=True)
        bundle = glob.glob(os.path.join(unpacked, "scmoe-gpu-bundle-*"))[0]
        manifest = read_json(os.path.join(bundle, "manifest.json"))
        check(len(manifest["gpu_tests"]) > 0 and len(manifest["binaries"]) > 2,
              f"the manifest lists {len(manifest['binaries'])} binaries and {len(manifest['gpu_tests'])} GPU tests")
        check(not any(os.path.isabs(v) for v in manifest["fallback_cmake_args"].values()),
              "the fallback build's paths are relative to the bundle")

        # What is hidden: every Debian package a carried library or the fallback build came from, the
        # development packages of OpenBLAS and Open MPI, and the pip headers (CUTLASS, cuDNN frontend).
        carried = [os.path.join(bundle, "bundle-lib", n) for n in manifest["carried_libs"]]
        system_copies = []
        for name in manifest["carried_libs"]:
            m = re.search(r"\s" + re.escape(name) + r" \(.*\) => (\S+)",
                          subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout)
            if m:
                system_copies.append(m.group(1))
        packages = owning_packages(system_copies) | set(manifest["fallback_debian_packages"])
        packages |= {p for p in ("libopenblas-dev", "libopenblas-pthread-dev", "libopenblas0-pthread",
                                 "libopenmpi-dev", "openmpi-bin", "libgtest-dev", "libcxxopts-dev",
                                 "nlohmann-json3-dev")
                     if subprocess.run(["dpkg", "-s", p], capture_output=True).returncode == 0}
        kept = packages & tool_packages()
        packages -= kept
        if kept:
            print(f"not hidden (the dry run's python3, cmake, bash, tar or xz load them): {', '.join(sorted(kept))}")
        hidden_files = [f for f in debian_files(sorted(packages)) if f.startswith("/usr/")]
        pip_dirs = [x for x in (cache_value(build, "CUTLASS_INCLUDE_DIR"), cache_value(build, "CUDNN_FRONTEND_INCLUDE_DIR"))
                    if x and os.path.isdir(x)]
        print(f"hiding {len(hidden_files)} files of {len(packages)} Debian packages ({', '.join(sorted(packages))}) "
              f"and {len(pip_dirs)} pip header folders; {len(carried)} libraries carried")
        upper, work = os.path.join(d, "up"), os.path.join(d, "work")
        os.makedirs(work)
        for f in hidden_files:
            w = os.path.join(upper, os.path.relpath(f, "/usr"))
            os.makedirs(os.path.dirname(w), exist_ok=True)
            if not os.path.lexists(w):
                os.mknod(w, 0o600 | 0o020000, os.makedev(0, 0))  # an overlayfs whiteout: the file is gone
        smi_dir = os.path.join(d, "smi")
        os.makedirs(smi_dir)
        smi = fake_smi(smi_dir, H100_LISTING)  # not on PATH: the GPU tests see no GPU and skip
        out = os.path.join(d, "report")
        probe = os.path.join(bundle, "build", manifest["binaries"][0]["path"])
        inner = f"""set -u
mount --make-rprivate /
mount -t overlay overlay -o lowerdir=/usr,upperdir={upper},workdir={work} /usr
for d in {' '.join(pip_dirs)}; do mount -t tmpfs none "$d"; done
# The hiding works: without the bundle's libraries the first binary cannot load.
if env -u LD_LIBRARY_PATH {probe} --help >/dev/null 2>{d}/probe.err; then echo PROBE-LOADED; else echo PROBE-FAILED; fi
head -c 300 {d}/probe.err; echo
python3 -c 'import socket; socket.create_connection(("pypi.org", 443), timeout=3)' 2>/dev/null && echo NET-UP || echo NET-DOWN
SCMOE_GPU_CHECK_BACKEND=cpu SCMOE_NVIDIA_SMI={smi} {bundle}/run -o {out} --deadline-s 420 --quick
echo "RUN-EXIT $?"
SCMOE_NVIDIA_SMI={smi} {bundle}/run -o {d}/fallback --fallback-configure-only
echo "FALLBACK-EXIT $?"
tail -n 40 {d}/fallback/bundle/fallback_build.log
"""
        r = subprocess.run(["unshare", "--mount", "--net", "--fork", "bash", "-c", inner], capture_output=True,
                           text=True, timeout=900)
        text = r.stdout + r.stderr
        with open(os.path.join(os.getcwd(), "gpu_bundle_dry_run.log"), "w") as f:
            f.write(text)
        print(f"dry run log: {os.path.join(os.getcwd(), 'gpu_bundle_dry_run.log')}")
        check("PROBE-FAILED" in text, "with the packages hidden, a binary does not load without the bundle's libraries",
              text[:2000])
        check("NET-DOWN" in text, "no network in the namespace")
        m = re.search(r"RUN-EXIT (\d+)", text)
        check(m is not None, "the run finished", text[-3000:])
        bundle_json = read_json(os.path.join(out, "bundle.json"))
        loads = [p for p in bundle_json["phases"] if p["name"] == "load_check"]
        check(loads and loads[0]["loaded"] == loads[0]["binaries"] == len(manifest["binaries"]),
              f"every binary loads with LD_BIND_NOW ({loads[0]['loaded'] if loads else 0} of "
              f"{len(manifest['binaries'])})", json.dumps(loads)[:2000])
        check(not any(p["name"] == "fallback_build" for p in bundle_json["phases"]), "no fallback build was needed")
        listing = bundle_json.get("ctest_listing", {})
        check(listing.get("ok") and listing.get("listed") == len(manifest["gpu_tests"]),
              f"ctest lists every packed GPU test ({listing.get('listed')} of {len(manifest['gpu_tests'])})",
              json.dumps(listing))
        report = read_json(os.path.join(out, "report.json"))
        s = (report.get("tests") or {}).get("summary") or {}
        skipped = len(s.get("skipped_unexpected", [])) + len(s.get("skipped_expected", []))
        # The one kind of GPU test that runs without a GPU is the one that covers that case.
        ran = [t for t in manifest["gpu_tests"] if "WithoutDevice" in t]
        check(s.get("total") == len(manifest["gpu_tests"]) and skipped == s.get("total") - len(ran)
              and s.get("passed") == len(ran) and not s.get("failed"),
              f"every GPU test ran and skipped ({skipped} of {s.get('total')}; passed: {s.get('passed')}, the "
              f"{len(ran)} that cover machines without a GPU; {len(s.get('failed', []))} failed)", json.dumps(s)[:2000])
        for name in ("gemm", "layer", "block", "train"):
            sec = report["benchmarks"].get(name) or {}
            check(sec.get("status") == "ok", f"benchmark step {name} ran on the CPU backend",
                  json.dumps(sec)[:1000])
        for name, sec in report["benchmarks"].items():
            check(sec["status"] in ("ok", "not available"), f"step {name}: {sec['status']}", sec.get("note", ""))
        check([f["step"] for f in report["failures"]] == ["tests"],
              "the one failure is the GPU tests' skip (a fake GPU is listed)", json.dumps(report["failures"])[:2000])
        md = open(os.path.join(out, "report.md")).read()
        check("## Machine and bundle" in md and "libcudnn.so.9" in md, "report.md has the machine and bundle section")
        check("FALLBACK-EXIT 0" in text, "the fallback build configures from the bundle alone", text[-3000:])


def main(argv):
    if len(argv) < 2:
        sys.exit(__doc__)
    case, root = argv[0], argv[1]
    if case == "help":
        case_help(root)
    elif case == "driver":
        case_driver(root)
    elif case == "dry-run" and len(argv) == 3:
        case_dry_run(root, os.path.abspath(argv[2]))
    else:
        sys.exit(__doc__)
    finish(f"gpu_bundle_test {case}")


if __name__ == "__main__":
    main(sys.argv[1:])
