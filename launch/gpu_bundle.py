#!/usr/bin/env python3
"""The offline GPU bundle: build scmoe's GPU acceptance run on a CPU machine, run it on a GPU machine
that has no network and nothing installed.

  launch/gpu_bundle.py pack [options]   on a machine with the CUDA toolkit (no GPU needed)
  ./run [options]                       in the unpacked bundle, on the GPU machine
                                        (the same as launch/gpu_bundle.py run)

pack builds exactly what the acceptance run needs (target scmoe-gpu-acceptance: every gpu-labelled
test executable, scmoe-bench, scmoe-train) for one architecture, strips it and writes one
self-contained .tar.xz: the executables and scmoe's libraries, every library they need that a bare
CUDA machine lacks (bundle-lib/), CTest files that name no absolute path, the scripts (a copy of the
source tree, without docs/), and what a fallback build on the target needs (bundle-deps/: the
headers and libraries of the Debian and pip packages the build used). It reuses the build folder
and ccache.

run, on the GPU machine, first prints the machine's facts (GPU, driver, CUDA, OS, glibc, where
cuDNN, NCCL and cuBLAS are found) and stops at once when the driver is too old for the bundle's
CUDA. It then relocates the build, checks that every binary loads with every symbol bound
(LD_BIND_NOW) and that ctest lists every GPU test, builds on the target with every core when a
prebuilt binary cannot load, and runs the acceptance (launch/gpu_check.sh --skip-build) under one
deadline. The report (report.md, report.json, raw/ with the logs) is written to --out, after every
step, so a run cut short still leaves one.

pack options:
  --arch ARCH          CUDA architecture (default 90a: H100/H200); the build uses ARCH-real
  -B, --build-dir DIR  build folder (default build-gpu-bundle-ARCH); an existing one is reused as it
                       is configured (its architectures, MPI on or off)
  -o, --output FILE    the archive (default BUILD-DIR/scmoe-gpu-bundle-ARCH.tar.xz)
  --max-mb N           fail when the archive is larger (default 16)
  -j, --jobs N         build jobs (default: nproc)
  --no-build           pack the build folder as it is
run options:
  -o, --out DIR        report folder (default gpu-report, in the bundle)
  --deadline-s S       the whole run's deadline in seconds, facts and checks included (default 540)
  --quick              the acceptance's quick sizes (launch/gpu_check.sh --quick)
  --force-build        build on the target even when the prebuilt binaries load
  --fallback-configure-only
                       configure the fallback build and stop (what the CPU dry run checks)
  -j, --jobs N         jobs of a fallback build (default: nproc)
Exit status: 0 ok (run: every GPU test passed and every step ran); 1 a failure (run: the report's
Failures section names it); 2 bad command line; 3 pack: the build failed or the archive is too
large; run: no binary loads and the fallback build failed; 4 run: no GPU (nvidia-smi lists none);
5 run: the driver is older than the bundle's CUDA needs.
Environment: SCMOE_NVIDIA_SMI (nvidia-smi), SCMOE_CUDA_LIB_DIRS (extra folders, ':'-separated, searched
first for cuDNN, NCCL, cuBLAS and the CUDA runtime), SCMOE_GPU_CHECK_BACKEND (run: cuda; cpu runs the
benchmark steps on the CPU backend, as the CPU dry run does).
"""

import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXIT_FAIL, EXIT_USAGE, EXIT_BUILD, EXIT_NO_GPU, EXIT_OLD_DRIVER = 1, 2, 3, 4, 5
BUILD_TOKEN = "@SCMOE_BUNDLE_BUILD@"  # the build folder in the bundle's CTest files
ROOT_TOKEN = "@SCMOE_BUNDLE_ROOT@"  # the source folder (the bundle's root)
TEMPLATE_SUFFIX = ".bundle-in"
# The CUDA major version a driver supports is at least (driver branch): CUDA 13.x needs R580
# (CUDA Toolkit release notes, "CUDA Toolkit and Corresponding Driver Versions").
MIN_DRIVER_FOR_CUDA = {12: 525, 13: 580}


def say(msg):
    print(f"== gpu-bundle: {msg}", flush=True)


def fail(code, msg):
    print(f"gpu_bundle.py: {msg}", file=sys.stderr, flush=True)
    sys.exit(code)


# ---- Libraries: which a bare CUDA machine has ----------------------------------------------------
# Every GPU machine with a CUDA 13 driver and toolkit has glibc, libstdc++/libgcc_s (checked for the
# versions the binaries need at run time, else bundle-lib/cxx is used), the driver and the CUDA
# libraries (the toolkit's, or PyTorch's nvidia-* wheels). Everything else the binaries load is
# carried.
SYSTEM_LIBS = re.compile(r"^(linux-vdso|ld-linux[-\w]*|libc|libm|libdl|libpthread|librt|libresolv|libutil)\.so")
CXX_LIBS = re.compile(r"^(libstdc\+\+|libgcc_s)\.so")
CUDA_LIBS = re.compile(r"^(libcuda|libcudart|libcublas|libcublasLt|libnccl|libcudnn\w*|libnvrtc\w*|libnvJitLink|"
                       r"libcupti|libnvToolsExt)\.so")
# The libraries the run looks for, by the name the binaries ask for, reported in the machine's facts.
CUDA_RUNTIME_NAMES = ["libcudart.so.13", "libcublas.so.13", "libcublasLt.so.13", "libnccl.so.2", "libcudnn.so.9"]


def ldd(path):
    """{soname: resolved path or None} of everything `path` loads."""
    out = subprocess.run(["ldd", path], capture_output=True, text=True).stdout
    libs = {}
    for line in out.splitlines():
        m = re.match(r"\s*(\S+)\s+=>\s+(not found|\S+)", line)
        if m:
            libs[m.group(1)] = None if m.group(2) == "not found" else m.group(2)
        else:
            m = re.match(r"\s*(/\S+)\s+\(", line)
            if m:
                libs[os.path.basename(m.group(1))] = m.group(1)
    return libs


def max_symbol_versions(paths):
    """The highest GLIBC_ and GLIBCXX_ versions the files ask for (their version-needs strings)."""
    best = {"GLIBC": (0,), "GLIBCXX": (0,)}
    for p in paths:
        with open(p, "rb") as f:
            data = f.read()
        for name, ver in re.findall(rb"\b(GLIBC|GLIBCXX)_([0-9]+(?:\.[0-9]+)+)\b", data):
            v = tuple(int(x) for x in ver.decode().split("."))
            best[name.decode()] = max(best[name.decode()], v)
    return {k: ".".join(map(str, v)) for k, v in best.items() if v != (0,)}


def file_has_version(lib, name, version):
    try:
        with open(lib, "rb") as f:
            return f"{name}_{version}".encode() in f.read()
    except OSError:
        return False


# ---- pack -----------------------------------------------------------------------------------------


def run_logged(cmd, log, **kw):
    say("+ " + " ".join(cmd))
    with open(log, "a") as f:
        f.write("+ " + " ".join(cmd) + "\n")
        f.flush()
        return subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, **kw).returncode


def cache_values(build):
    values = {}
    with open(os.path.join(build, "CMakeCache.txt")) as f:
        for line in f:
            m = re.match(r"^([A-Za-z_0-9]+):[A-Z]+=(.*)$", line.rstrip("\n"))
            if m:
                values[m.group(1)] = m.group(2)
    return values


def configure(build, arch):
    args = ["cmake", "-S", ROOT, "-B", build, "-DCMAKE_BUILD_TYPE=Release", "-DSCMOE_WITH_CUDA=ON",
            f"-DCMAKE_CUDA_ARCHITECTURES={arch}-real", "-DSCMOE_WITH_MPI=OFF", "-DSCMOE_BUILD_TESTS=ON",
            "-DSCMOE_BUILD_BENCH=ON"]
    if shutil.which("ninja"):
        args += ["-G", "Ninja"]
    if shutil.which("ccache"):
        args += ["-DCMAKE_CXX_COMPILER_LAUNCHER=ccache", "-DCMAKE_CUDA_COMPILER_LAUNCHER=ccache"]
    os.makedirs(build, exist_ok=True)
    log = os.path.join(build, "setup-configure.log")
    with open(log, "w") as f:
        rc = subprocess.run(args, stdout=f, stderr=subprocess.STDOUT).returncode
    with open(log) as f:
        text = f.read()
    for line in text.splitlines():
        if line.startswith("-- scmoe:"):
            print(line)
    if rc != 0:
        print(text[-4000:], file=sys.stderr)
        fail(EXIT_BUILD, f"configure failed (log: {log})")


def acceptance_binaries(build):
    path = os.path.join(build, "gpu-acceptance-targets.txt")
    if not os.path.exists(path):
        fail(EXIT_BUILD, f"{path} is missing: {build} was configured without tests or benchmarks, or by an "
                         "older scmoe (configure it again)")
    items = []
    with open(path) as f:
        for line in f:
            kind, _, exe = line.strip().partition(" ")
            if exe:
                items.append((kind, exe))
    return items


def ctest_gpu_tests(build, env=None):
    """The names of the gpu-labelled tests ctest lists in `build` (and any placeholder), and its output."""
    try:
        out = subprocess.run(["ctest", "--test-dir", build, "-N", "-L", "gpu"], capture_output=True, text=True,
                             env=env)
    except FileNotFoundError:
        return [], "ctest is not on PATH (it comes with CMake: the pip package cmake has it)"
    return [m.group(1) for m in re.finditer(r"Test\s+#\d+:\s+(\S+)", out.stdout)], out.stdout + out.stderr


def debian_package_files(path):
    """The regular files and links of the Debian package that owns `path`."""
    owner = subprocess.run(["dpkg", "-S", path], capture_output=True, text=True)
    if owner.returncode != 0:
        fail(EXIT_BUILD, f"no Debian package owns {path} (the fallback build's dependencies are taken from "
                         "Debian packages): install it with launch/setup.sh deps")
    pkg = owner.stdout.split(":")[0]
    files = subprocess.run(["dpkg", "-L", pkg], capture_output=True, text=True, check=True).stdout.split("\n")
    return pkg, [f for f in files if f and not f.startswith("/usr/share/doc") and not os.path.isdir(f)]


def stage_fallback_deps(cache, deps):
    """bundle-deps/: what `cmake` on the target needs besides CUDA: returns the -D arguments, with
    paths relative to bundle-deps (the run makes them absolute)."""
    args = {}
    packages = []
    for var, probe in (("GTest_DIR", "GTestConfig.cmake"), ("cxxopts_DIR", "cxxopts-config.cmake"),
                       ("nlohmann_json_DIR", "nlohmann_jsonConfig.cmake")):
        d = cache.get(var, "")
        if not d or not os.path.exists(os.path.join(d, probe)):
            fail(EXIT_BUILD, f"the build's {var} ({d!r}) has no {probe}")
        pkg, files = debian_package_files(os.path.join(d, probe))
        packages.append(pkg)
        for f in files:
            target = os.path.join(deps, "root", f.lstrip("/"))
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copy2(os.path.realpath(f), target)
        args[var] = os.path.join("root", d.lstrip("/"))
    # OpenBLAS: the library (the same file as bundle-lib's) and the two headers scmoe includes.
    blas = os.path.realpath(cache.get("BLAS_openblas_LIBRARY", ""))
    inc = cache.get("SCMOE_CBLAS_INCLUDE_DIR", "")
    if not os.path.isfile(blas) or not os.path.isfile(os.path.join(inc, "cblas.h")):
        fail(EXIT_BUILD, f"the build's OpenBLAS ({cache.get('BLAS_openblas_LIBRARY')!r}, cblas.h in {inc!r}) "
                         "is not where its cache says")
    os.makedirs(os.path.join(deps, "blas", "include"))
    os.makedirs(os.path.join(deps, "blas", "lib"))
    os.symlink("../../../bundle-lib/libopenblas.so.0", os.path.join(deps, "blas", "lib", "libopenblas.so"))
    for h in ("cblas.h", "openblas_config.h"):
        shutil.copy2(os.path.realpath(os.path.join(inc, h)), os.path.join(deps, "blas", "include", h))
    args["BLAS_openblas_LIBRARY"] = "blas/lib/libopenblas.so"
    args["SCMOE_CBLAS_INCLUDE_DIR"] = "blas/include"
    # Header-only CUDA dependencies (pip wheels here): CUTLASS and the cuDNN frontend.
    for var, home, name in (("CUTLASS_INCLUDE_DIR", "CUTLASS_HOME", "cutlass"),
                            ("CUDNN_FRONTEND_INCLUDE_DIR", "CUDNN_FRONTEND_HOME", "cudnn-frontend")):
        d = cache.get(var, "")
        if d and os.path.isdir(d):
            shutil.copytree(d, os.path.join(deps, name, "include"), dirs_exist_ok=True)
            args[home] = name
    return args, packages


def cmd_pack(a):
    start = time.time()
    arch = a.arch
    build = os.path.abspath(a.build_dir or os.path.join(ROOT, f"build-gpu-bundle-{arch}"))
    out = os.path.abspath(a.output or os.path.join(build, f"scmoe-gpu-bundle-{arch}.tar.xz"))
    if os.path.isdir("/usr/local/cuda/bin"):
        os.environ["PATH"] = "/usr/local/cuda/bin:" + os.environ["PATH"]
    log = os.path.join(build, "gpu-bundle-build.log")
    if not os.path.exists(os.path.join(build, "CMakeCache.txt")):
        say(f"configure {build} for sm_{arch}, MPI off")
        configure(build, arch)
    else:
        say(f"reusing {build} as it is configured")
    cache = cache_values(build)
    if cache.get("SCMOE_WITH_CUDA") == "OFF":
        say("warning: the build folder has no CUDA backend: the bundle's GPU tests can only skip")
    if not a.no_build:
        t = time.time()
        say(f"build scmoe-gpu-acceptance with {a.jobs} jobs (log: {log})")
        if run_logged(["cmake", "--build", build, "-j", str(a.jobs), "--target", "scmoe-gpu-acceptance"], log) != 0:
            with open(log) as f:
                print(f.read()[-6000:], file=sys.stderr)
            fail(EXIT_BUILD, f"the build failed (log: {log})")
        say(f"built in {time.time() - t:.0f} s")
    binaries = acceptance_binaries(build)
    missing = [exe for _, exe in binaries if not os.path.isfile(exe)]
    if missing:
        fail(EXIT_BUILD, f"not built: {', '.join(missing)} (run without --no-build)")
    tests, listing = ctest_gpu_tests(build)
    placeholders = [t for t in tests if t.endswith("_NOT_BUILT")]
    if placeholders or not tests:
        fail(EXIT_BUILD, f"ctest in {build} lists {len(tests)} GPU tests, placeholders: {placeholders}")

    stage_parent = tempfile.mkdtemp(prefix="scmoe-gpu-bundle-")
    # Named after what the build folder was configured for (a reused folder may differ from --arch).
    built_for = "-".join(a.replace("-real", "").replace("-virtual", "")
                         for a in cache.get("CMAKE_CUDA_ARCHITECTURES", arch).split(";") if a) or arch
    name = f"scmoe-gpu-bundle-{built_for}"
    stage = os.path.join(stage_parent, name)
    try:
        # The source tree (scripts, and the fallback build's sources): the files git tracks or would (not
        # the ignored ones), without docs/.
        files = subprocess.run(["git", "-C", ROOT, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                               capture_output=True, check=True).stdout
        for rel in filter(None, files.decode().split("\0")):
            if rel.startswith("docs/") or not os.path.isfile(os.path.join(ROOT, rel)):
                continue
            dst = os.path.join(stage, rel)
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.copy2(os.path.join(ROOT, rel), dst)
        # The binaries and the build folder's libraries they load, at their places in build/.
        sbuild = os.path.join(stage, "build")
        carried, cxx = {}, {}  # sonames -> paths: carried always; libstdc++/libgcc_s for old nodes
        build_libs = set()
        objects = [exe for _, exe in binaries]
        for exe in objects:
            for soname, path in ldd(exe).items():
                if path is None:
                    fail(EXIT_BUILD, f"{exe} needs {soname}, which ldd does not find here")
                if path.startswith(build + "/"):
                    build_libs.add(path)
                elif SYSTEM_LIBS.match(soname) or CUDA_LIBS.match(soname):
                    continue
                elif CXX_LIBS.match(soname):
                    cxx[soname] = path
                else:
                    carried[soname] = path
        for path in sorted(build_libs) + objects:
            rel = os.path.relpath(path, build)
            dst = os.path.join(sbuild, rel)
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.copy2(os.path.realpath(path), dst)
            subprocess.run(["strip", "--strip-unneeded", dst], check=True)
            # The soname links of scmoe's libraries (libscmoe.so.0.1 -> libscmoe.so.0.1.0).
            if path in build_libs:
                for link in glob.glob(os.path.join(os.path.dirname(path), os.path.basename(path).split(".so")[0]
                                                   + ".so*")):
                    if os.path.islink(link):
                        lrel = os.path.join(os.path.dirname(dst), os.path.basename(link))
                        if not os.path.lexists(lrel):
                            os.symlink(os.path.basename(os.path.realpath(link)), lrel)
        lib = os.path.join(stage, "bundle-lib")
        os.makedirs(os.path.join(lib, "cxx"))
        for soname, path in sorted(carried.items()):
            shutil.copy2(os.path.realpath(path), os.path.join(lib, soname))
        for soname, path in sorted(cxx.items()):
            shutil.copy2(os.path.realpath(path), os.path.join(lib, "cxx", soname))
        # CTest files: only the bundled tests, with the build and source folders as tokens.
        test_dirs = {}
        for kind, exe in binaries:
            if kind == "test":
                test_dirs.setdefault(os.path.dirname(exe), []).append(os.path.basename(exe))

        def templated(text):
            return text.replace(build, BUILD_TOKEN).replace(ROOT, ROOT_TOKEN)

        for d, targets in test_dirs.items():
            rel = os.path.relpath(d, build)
            lines = []
            for t in targets:
                for f in sorted(glob.glob(os.path.join(glob.escape(d), glob.escape(t) + "[[]*[]]_tests.cmake"))) + \
                        [os.path.join(d, f"{t}_labels.cmake")]:
                    with open(f) as src:
                        text = src.read()
                    with open(os.path.join(sbuild, rel, os.path.basename(f)) + TEMPLATE_SUFFIX, "w") as dst:
                        dst.write(templated(text))
                    lines.append(f'include("{BUILD_TOKEN}/{rel}/{os.path.basename(f)}")')
            with open(os.path.join(sbuild, rel, "CTestTestfile.cmake" + TEMPLATE_SUFFIX), "w") as f:
                f.write("# The bundled GPU tests (launch/gpu_bundle.py); the run fills in the folders.\n")
                f.write("\n".join(lines) + "\n")
        with open(os.path.join(sbuild, "CTestTestfile.cmake" + TEMPLATE_SUFFIX), "w") as f:
            f.write("".join(f'subdirs("{os.path.relpath(d, build)}")\n' for d in sorted(test_dirs)))
        # What the acceptance script reads from a build folder: the configure summary.
        cfg = os.path.join(build, "setup-configure.log")
        if os.path.exists(cfg):
            with open(cfg) as src, open(os.path.join(sbuild, "setup-configure.log"), "w") as dst:
                dst.write("".join(l for l in src if l.startswith("-- scmoe:")))
        # The fallback build's dependencies.
        deps = os.path.join(stage, "bundle-deps")
        os.makedirs(deps)
        fallback_args, packages = stage_fallback_deps(cache, deps)
        # The manifest and the entry point.
        commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
        dirty = bool(subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"],
                                    capture_output=True, text=True).stdout.strip())
        nvcc = subprocess.run([cache.get("CMAKE_CUDA_COMPILER", "nvcc"), "--version"], capture_output=True,
                              text=True).stdout if cache.get("CMAKE_CUDA_COMPILER") else ""
        m = re.search(r"release (\d+)\.(\d+)", nvcc)
        manifest = {
            "name": name,
            "arch": arch,
            "cuda_architectures": cache.get("CMAKE_CUDA_ARCHITECTURES"),
            "cuda_version": f"{m.group(1)}.{m.group(2)}" if m else None,
            "mpi": cache.get("SCMOE_WITH_MPI"),
            "commit": commit or "unknown",
            "uncommitted_changes": dirty,
            "packed": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "binaries": [{"kind": k, "path": os.path.relpath(e, build)} for k, e in binaries],
            "gpu_tests": tests,
            "carried_libs": sorted(carried),
            "cxx_fallback": bool(cxx),
            "needs": max_symbol_versions([os.path.join(sbuild, os.path.relpath(e, build)) for e in objects] +
                                         [os.path.join(sbuild, os.path.relpath(p, build)) for p in build_libs] +
                                         [os.path.join(lib, s) for s in carried]),
            "fallback_cmake_args": fallback_args,
            "fallback_debian_packages": packages,
        }
        with open(os.path.join(stage, "manifest.json"), "w") as f:
            json.dump(manifest, f, indent=1)
        with open(os.path.join(stage, "run"), "w") as f:
            f.write('#!/bin/sh\n# The offline GPU acceptance run: see launch/gpu_bundle.py --help.\n'
                    'exec python3 "$(dirname "$0")/launch/gpu_bundle.py" run "$@"\n')
        os.chmod(os.path.join(stage, "run"), 0o755)
        # The archive.
        os.makedirs(os.path.dirname(out), exist_ok=True)
        tmp = out + ".part"
        with open(tmp, "wb") as f:
            tar = subprocess.Popen(["tar", "-C", stage_parent, "--owner=0", "--group=0", "-cf", "-", name],
                                   stdout=subprocess.PIPE)
            xz = subprocess.run(["xz", "-T0", "-9"], stdin=tar.stdout, stdout=f)
            tar.stdout.close()
            if tar.wait() != 0 or xz.returncode != 0:
                fail(EXIT_BUILD, "tar | xz failed")
        os.replace(tmp, out)
    finally:
        shutil.rmtree(stage_parent, ignore_errors=True)
    size = os.path.getsize(out)
    say(f"{out}: {size / 2**20:.2f} MiB, {len(binaries)} executables, {len(tests)} GPU tests, "
        f"carried libraries: {', '.join(sorted(carried)) or 'none'}; packed in {time.time() - start:.0f} s")
    if size > a.max_mb * 2**20:
        fail(EXIT_BUILD, f"the archive is {size / 2**20:.2f} MiB, over --max-mb {a.max_mb}")
    print(f"On the GPU machine: tar xf {os.path.basename(out)} && {name}/run -o report")
    return 0


# ---- run ------------------------------------------------------------------------------------------


class Deadline:
    def __init__(self, seconds):
        self.end = time.time() + seconds

    def left(self):
        return self.end - time.time()


def sh(cmd, timeout=60, env=None):
    """(returncode, output) of a command; 127 when it is missing, 124 when it times out."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        return p.returncode, p.stdout + p.stderr
    except FileNotFoundError:
        return 127, f"{cmd[0]}: not found"
    except subprocess.TimeoutExpired as e:
        return 124, (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")


def library_dirs():
    """Folders that may hold the CUDA libraries, in search order: SCMOE_CUDA_LIB_DIRS, the nvidia-*
    wheels of the Python on PATH (PyTorch's), the toolkit's folders."""
    dirs = [d for d in os.environ.get("SCMOE_CUDA_LIB_DIRS", "").split(":") if d]
    rc, out = sh([sys.executable, "-c", "import importlib.util as u\ns = u.find_spec('nvidia')\n"
                  "print('\\n'.join(s.submodule_search_locations) if s else '')"])
    if rc == 0:
        for base in out.split():
            dirs += sorted(glob.glob(os.path.join(base, "*", "lib")))
    dirs += ["/usr/local/cuda/lib64", "/usr/local/cuda/lib", "/usr/local/cuda/targets/x86_64-linux/lib"]
    return [d for d in dict.fromkeys(dirs) if os.path.isdir(d)]


def loader_path(soname, loader_cache):
    """Where the dynamic loader finds `soname` (`loader_cache`: the output of `ldconfig -p`), or None."""
    m = re.search(r"\s" + re.escape(soname) + r" \(libc6,x86-64[^)]*\) => (\S+)", loader_cache)
    return m.group(1) if m else None


def find_libs(dirs, loader_cache):
    """{soname: path} of the CUDA libraries, first in `dirs`, else where the dynamic loader finds them."""
    found = {}
    for name in CUDA_RUNTIME_NAMES:
        found[name] = next((os.path.join(d, name) for d in dirs if os.path.exists(os.path.join(d, name))),
                           loader_path(name, loader_cache))
    return found


def machine_facts(smi):
    facts = {}
    # A GPU is there when `nvidia-smi -L` lists one (the rule of tests/gpu_presence.h and gpu_check.sh).
    rc, out = sh([smi, "-L"])
    facts["listed"] = [l.strip() for l in out.splitlines() if re.match(r"GPU \d+:", l)]
    rc, out = sh([smi, "--query-gpu=index,name,driver_version,compute_cap,memory.total", "--format=csv,noheader"])
    facts["gpus"] = [l.strip() for l in out.splitlines() if l.strip()] if rc == 0 and facts["listed"] else []
    rc, out = sh([smi])
    m = re.search(r"CUDA Version:\s*([0-9.]+)", out)
    facts["driver_cuda_version"] = m.group(1) if m else None
    rc, out = sh(["nvcc", "--version"])
    m = re.search(r"release ([0-9.]+)", out)
    facts["nvcc"] = m.group(1) if m else None
    try:
        with open("/etc/os-release") as f:
            m = re.search(r'^PRETTY_NAME="?([^"\n]*)', f.read(), re.M)
            facts["os"] = m.group(1) if m else None
    except OSError:
        facts["os"] = None
    facts["kernel"] = os.uname().release
    facts["glibc"] = os.confstr("CS_GNU_LIBC_VERSION")
    facts["cpus"] = os.cpu_count()
    facts["python"] = sys.version.split()[0]
    rc, out = sh([sys.executable, "-c", "import torch; print(torch.__version__, torch.version.cuda)"], timeout=60)
    facts["torch"] = out.strip().splitlines()[-1] if rc == 0 and out.strip() else "not importable"
    rc, out = sh(["cmake", "--version"])
    facts["cmake"] = out.split()[2] if rc == 0 and len(out.split()) > 2 else None
    facts["ninja"] = shutil.which("ninja")
    facts["compute_sanitizer"] = shutil.which("compute-sanitizer")
    return facts


def driver_ok(facts, manifest):
    """(ok, why): the first GPU's driver against the bundle's CUDA major version."""
    if not facts["gpus"]:
        return True, ""
    fields = [x.strip() for x in facts["gpus"][0].split(",")]
    try:
        branch = int(fields[2].split(".")[0])
    except (IndexError, ValueError):
        return False, f"cannot read the driver version from nvidia-smi: {facts['gpus'][0]!r}"
    cuda = manifest.get("cuda_version") or "13.0"
    need = MIN_DRIVER_FOR_CUDA.get(int(cuda.split(".")[0]), 0)
    if branch < need:
        return False, (f"the driver is {fields[2]}, but the bundle was built with CUDA {cuda}, which needs "
                       f"driver R{need} or newer: update the driver, or pack a bundle with an older CUDA toolkit")
    return True, f"driver {fields[2]} >= R{need} (CUDA {cuda})"


def relocate(bundle, build):
    """Writes the CTest files of `build` from their templates, with this machine's folders."""
    n = 0
    for tpl in glob.glob(os.path.join(build, "**", "*" + TEMPLATE_SUFFIX), recursive=True):
        with open(tpl) as f:
            text = f.read()
        with open(tpl[: -len(TEMPLATE_SUFFIX)], "w") as f:
            f.write(text.replace(BUILD_TOKEN, build).replace(ROOT_TOKEN, bundle))
        n += 1
    return n


def load_check(build, binaries, env, log_dir):
    """Runs every binary with LD_BIND_NOW=1 (every symbol bound at start): tests list their cases,
    the tools print --help. Returns [{path, ok, error}]."""
    results = []
    env = dict(env, LD_BIND_NOW="1")
    for b in binaries:
        exe = os.path.join(build, b["path"])
        arg = "--gtest_list_tests" if b["kind"] == "test" else "--help"
        rc, out = sh([exe, arg], timeout=60, env=env)
        name = os.path.basename(exe)
        with open(os.path.join(log_dir, f"load_{name}.log"), "w") as f:
            f.write(out)
        err = "" if rc == 0 else next((l for l in out.splitlines() if "error" in l.lower() or "not found" in l),
                                      out.strip().splitlines()[-1] if out.strip() else f"exit status {rc}")
        results.append({"path": b["path"], "ok": rc == 0, "error": err[:300]})
    return results


def fallback_build(bundle, manifest, arch, jobs, deadline, log, configure_only, env):
    """Builds scmoe-gpu-acceptance on this machine from the bundle's sources and bundle-deps; returns
    (build folder or None, message). `env` has the run's LD_LIBRARY_PATH: the linker finds the carried
    libraries' own dependencies there (OpenBLAS's libgfortran), and the build's test discovery runs the
    test executables."""
    build = os.path.join(bundle, "build-target")
    deps = os.path.join(bundle, "bundle-deps")
    args = ["cmake", "-S", bundle, "-B", build, "-DCMAKE_BUILD_TYPE=Release", "-DSCMOE_WITH_CUDA=ON",
            f"-DCMAKE_CUDA_ARCHITECTURES={arch}", "-DSCMOE_WITH_MPI=OFF", "-DSCMOE_WARNINGS_AS_ERRORS=OFF",
            "-DSCMOE_BUILD_TESTS=ON", "-DSCMOE_BUILD_BENCH=ON"]
    if shutil.which("ninja"):
        args += ["-G", "Ninja"]
    args += [f"-D{k}={os.path.join(deps, v)}" for k, v in manifest["fallback_cmake_args"].items()]
    with open(log, "w") as f:
        f.write("+ " + " ".join(args) + "\n")
        f.flush()
        try:
            rc = subprocess.run(args, stdout=f, stderr=subprocess.STDOUT, env=env,
                                timeout=max(30, min(300, deadline.left()))).returncode
        except subprocess.TimeoutExpired:
            return None, "the fallback configure timed out"
    if rc != 0:
        return None, f"the fallback configure failed (log: {log})"
    if configure_only:
        return build, "configured (--fallback-configure-only)"
    cmd = ["cmake", "--build", build, "-j", str(jobs), "--target", "scmoe-gpu-acceptance"]
    say(f"fallback build with {jobs} jobs: {' '.join(cmd)} (log: {log})")
    with open(log, "a") as f:
        try:
            rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env,
                                timeout=max(30, deadline.left() - 120)).returncode
        except subprocess.TimeoutExpired:
            return None, "the fallback build did not finish before the deadline (less 120 s for the tests)"
    return (build, "built") if rc == 0 else (None, f"the fallback build failed (log: {log})")


def cmd_run(a):
    deadline = Deadline(a.deadline_s)
    bundle = ROOT
    manifest_path = os.path.join(bundle, "manifest.json")
    if not os.path.exists(manifest_path):
        fail(EXIT_USAGE, f"{manifest_path} is missing: run this from an unpacked bundle (launch/gpu_bundle.py pack)")
    with open(manifest_path) as f:
        manifest = json.load(f)
    out = os.path.abspath(a.out or os.path.join(bundle, "gpu-report"))
    os.makedirs(out, exist_ok=True)
    logs = os.path.join(out, "bundle")
    shutil.rmtree(logs, ignore_errors=True)
    os.makedirs(logs)
    smi = os.environ.get("SCMOE_NVIDIA_SMI", "nvidia-smi")
    info = {"bundle": {k: manifest.get(k) for k in ("name", "commit", "uncommitted_changes", "packed",
                                                     "cuda_architectures", "cuda_version")},
            "deadline_s": a.deadline_s, "phases": []}

    def save():
        with open(os.path.join(out, "bundle.json"), "w") as f:
            json.dump(info, f, indent=1)

    def phase(name, t0, **kw):
        info["phases"].append(dict(name=name, seconds=round(time.time() - t0, 1), **kw))
        save()

    # 1. The machine's facts, before anything else.
    t0 = time.time()
    facts = machine_facts(smi)
    dirs = library_dirs()
    _, loader_cache = sh(["ldconfig", "-p"])
    facts["library_dirs"] = dirs
    facts["cuda_libraries"] = find_libs(dirs, loader_cache)
    info["machine"] = facts
    say(f"bundle {manifest['name']} (commit {manifest['commit'][:12]}"
        f"{', uncommitted changes' if manifest.get('uncommitted_changes') else ''}, packed {manifest['packed']})")
    for g in facts["gpus"] or ["none listed by " + smi]:
        say(f"GPU: {g}")
    say(f"driver supports CUDA {facts['driver_cuda_version']}; nvcc {facts['nvcc']}; OS {facts['os']} "
        f"(kernel {facts['kernel']}); {facts['glibc']}; {facts['cpus']} CPUs; Python {facts['python']}, "
        f"torch {facts['torch']}; cmake {facts['cmake']}; ninja {facts['ninja'] or 'absent'}; "
        f"compute-sanitizer {facts['compute_sanitizer'] or 'absent'}")
    for name, path in facts["cuda_libraries"].items():
        say(f"{name}: {path or 'NOT FOUND'}")
    phase("facts", t0)
    if not facts["listed"]:
        fail(EXIT_NO_GPU, f"no GPU: '{smi}' lists none (the bundle's facts: {os.path.join(out, 'bundle.json')})")
    ok, why = driver_ok(facts, manifest)
    info["driver_check"] = why
    save()
    if not ok:
        fail(EXIT_OLD_DRIVER, why)
    say(why)

    # 2. The library path: the bundle's libraries, libstdc++ where the system's is too old, CUDA's.
    env = dict(os.environ)
    lib = os.path.join(bundle, "bundle-lib")
    path = [lib]
    need_cxx = manifest.get("needs", {}).get("GLIBCXX")
    if manifest.get("cxx_fallback") and need_cxx:
        system_cxx = loader_path("libstdc++.so.6", loader_cache)
        if not (system_cxx and file_has_version(system_cxx, "GLIBCXX", need_cxx)):
            path.append(os.path.join(lib, "cxx"))
            say(f"the system's libstdc++ lacks GLIBCXX_{need_cxx}: using the bundle's")
    path += [os.path.dirname(p) for p in facts["cuda_libraries"].values() if p]
    path += [p for p in env.get("LD_LIBRARY_PATH", "").split(":") if p]
    env["LD_LIBRARY_PATH"] = ":".join(dict.fromkeys(path))
    info["ld_library_path"] = env["LD_LIBRARY_PATH"]

    # 3. Relocate, check that every binary loads, and that ctest lists every GPU test.
    t0 = time.time()
    build = os.path.join(bundle, "build")
    relocate(bundle, build)
    loads = load_check(build, manifest["binaries"], env, logs)
    failed = [r for r in loads if not r["ok"]]
    say(f"load check (LD_BIND_NOW=1): {len(loads) - len(failed)} of {len(loads)} binaries load"
        + "".join(f"\n   {r['path']}: {r['error']}" for r in failed))
    phase("load_check", t0, loaded=len(loads) - len(failed), binaries=len(loads), failures=failed)
    if failed or a.force_build or a.fallback_configure_only:
        t0 = time.time()
        why = "--force-build" if a.force_build else ("--fallback-configure-only" if a.fallback_configure_only
                                                      else f"{len(failed)} binaries do not load")
        say(f"fallback build on this machine ({why})")
        arch = manifest.get("cuda_architectures") or f"{manifest['arch']}-real"
        new_build, msg = fallback_build(bundle, manifest, arch, a.jobs, deadline,
                                        os.path.join(logs, "fallback_build.log"), a.fallback_configure_only, env)
        say(msg)
        phase("fallback_build", t0, result=msg, why=why)
        if a.fallback_configure_only:
            return 0 if new_build else EXIT_BUILD
        if new_build is None:
            if failed:
                fail(EXIT_BUILD, f"{msg}; the prebuilt binaries do not load either (logs in {logs})")
        else:
            build = new_build
            loads = load_check(build, manifest["binaries"], env, logs)
            failed = [r for r in loads if not r["ok"]]
            phase("load_check_after_build", t0, loaded=len(loads) - len(failed), binaries=len(loads),
                  failures=failed)
    tests, listing = ctest_gpu_tests(build, env)
    with open(os.path.join(logs, "ctest_list.log"), "w") as f:
        f.write(listing)
    expected = set(manifest["gpu_tests"])
    listed_ok = set(tests) == expected and not any(t.endswith("_NOT_BUILT") for t in tests)
    info["ctest_listing"] = {"listed": len(tests), "expected": len(expected), "ok": listed_ok,
                             "missing": sorted(expected - set(tests))[:20],
                             "unexpected": sorted(set(tests) - expected)[:20]}
    save()
    why = "" if tests else f" ({listing.strip()[-300:]})"
    say(f"ctest lists {len(tests)} GPU tests ({len(expected)} packed){why}"
        + ("" if listed_ok else f": MISMATCH, missing {info['ctest_listing']['missing']}, "
                                f"unexpected {info['ctest_listing']['unexpected']}"))

    # 4. The acceptance, under what is left of the deadline.
    left = int(deadline.left())
    cmd = ["bash", os.path.join(bundle, "launch", "gpu_check.sh"), "--skip-build", "--build-dir", build, "--out", out,
           "--deadline-s", str(max(1, left))]
    if a.quick:
        cmd.append("--quick")
    env["SCMOE_BUNDLE_JSON"] = os.path.join(out, "bundle.json")
    env["SCMOE_COMMIT"] = manifest["commit"] + ("+uncommitted" if manifest.get("uncommitted_changes") else "")
    say(f"acceptance with {left} s left: {' '.join(cmd)}")
    rc = subprocess.run(cmd, env=env, cwd=bundle).returncode
    if rc == 0 and (failed or not listed_ok):
        rc = EXIT_FAIL
    return rc


def main(argv):
    ap = argparse.ArgumentParser(prog="gpu_bundle.py", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=None, add_help=False)
    ap.add_argument("-h", "--help", action="store_true")
    ap.add_argument("command", nargs="?", choices=["pack", "run"])
    a, rest = ap.parse_known_args(argv)
    if a.help or not a.command:
        print(__doc__.strip())
        return 0 if a.help else EXIT_USAGE
    p = argparse.ArgumentParser(prog=f"gpu_bundle.py {a.command}")
    p.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1)
    if a.command == "pack":
        p.add_argument("--arch", default="90a")
        p.add_argument("-B", "--build-dir")
        p.add_argument("-o", "--output")
        p.add_argument("--max-mb", type=float, default=16)
        p.add_argument("--no-build", action="store_true")
    else:
        p.add_argument("-o", "--out")
        p.add_argument("--deadline-s", type=int, default=540)
        p.add_argument("--quick", action="store_true")
        p.add_argument("--force-build", action="store_true")
        p.add_argument("--fallback-configure-only", action="store_true")
    try:
        o = p.parse_args(rest)
    except SystemExit as e:
        return EXIT_USAGE if e.code else 0
    if o.jobs < 1:
        fail(EXIT_USAGE, "--jobs must be >= 1")
    if a.command == "pack":
        if not re.fullmatch(r"[0-9]{2,3}[af]?", o.arch):
            fail(EXIT_USAGE, f"--arch {o.arch}: a CUDA architecture such as 90a, 90 or 80")
        return cmd_pack(o)
    if o.deadline_s < 60:
        fail(EXIT_USAGE, "--deadline-s must be at least 60")
    return cmd_run(o)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
