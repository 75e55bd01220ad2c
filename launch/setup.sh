#!/usr/bin/env bash
# The one setup step behind the README's two commands and CI: installs what is missing, then
# configures and builds what the command needs, reusing an existing build folder.
#
#   usage: launch/setup.sh deps|quickstart|tests [build-dir]
#     deps        install the Debian and pip packages only
#     quickstart  deps, then a Release build of scmoe-train (and scmoe-bench with SCMOE_QUICKSTART_BENCH=1);
#                 a fresh build folder gets the CUDA backend only when nvidia-smi lists a GPU
#     tests       deps, then a Release build of everything (CUDA code compiled whenever nvcc is found)
#
# Compiles through ccache when it is installed (launch/ccache_env.sh; SCMOE_CCACHE=0: not).
# Installing needs root and apt-get (and pip for the tests' Python packages and cuDNN frontend headers). Without
# them the script prints the exact install line and exits 2 when a required package is missing.
# Environment (defaults): SCMOE_JOBS (nproc), SCMOE_CMAKE_ARGS (empty: extra configure arguments),
# SCMOE_SKIP_INSTALL (0; 1: never install, only check).
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-}
build=${2:-${SCMOE_BUILD_DIR:-build}}
case "$what" in
  deps|quickstart|tests) ;;
  -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "usage: launch/setup.sh deps|quickstart|tests [build-dir]" >&2; exit 2 ;;
esac
jobs=${SCMOE_JOBS:-$(nproc)}
say() { echo "== setup: $*"; }

# ---- Debian packages -------------------------------------------------------------------------
# Required for every build. Open MPI is optional to the build (SCMOE_WITH_MPI=AUTO) but the mpirun
# tests and launch recipes need it, so it is installed too; ccache makes rebuilds cheap
# (launch/ccache_env.sh).
packages=(cmake g++ make pkg-config libopenblas-dev libopenmpi-dev openmpi-bin nlohmann-json3-dev
          libcxxopts-dev libgtest-dev python3 ccache)
. launch/debian_packages.sh
ensure_debian_packages "${packages[@]}"
. launch/ccache_env.sh

# ---- Python packages (tests only: the checkpoint tests read our safetensors files with them; the
# CUDA build takes CUTLASS's headers for the cutlass-grouped provider from the nvidia-cutlass wheel,
# installed without its Python dependencies (--no-deps: only the headers are used) ---
if [ "$what" != quickstart ]; then
  py_install="python3 -m pip install safetensors numpy && python3 -m pip install --no-deps 'nvidia-cutlass>=4,<5'"
  if python3 -c 'import safetensors, numpy, importlib.util, importlib.metadata as m
assert importlib.util.find_spec("cutlass_library") and m.version("nvidia-cutlass").split(".")[0] == "4"' 2>/dev/null; then
    say "Python packages present (safetensors, numpy, nvidia-cutlass 4)"
  elif [ "${SCMOE_SKIP_INSTALL:-0}" != 1 ] && python3 -m pip --version >/dev/null 2>&1; then
    say "installing Python packages: safetensors numpy, nvidia-cutlass>=4,<5 (headers, --no-deps)"
    { python3 -m pip install -q safetensors numpy && python3 -m pip install -q --no-deps 'nvidia-cutlass>=4,<5'; } ||
      { echo "error: pip could not install safetensors numpy nvidia-cutlass; run: $py_install" >&2
        exit 2; }
  else
    echo "error: the tests need Python's safetensors, numpy and nvidia-cutlass 4; run: $py_install" >&2
    exit 2
  fi
  # The cuDNN frontend's C++ headers (cmake/FindCudnnFrontend.cmake finds them through pip): the CUDA
  # build's cuDNN attention. Headers only, so without the wheel's Python dependencies (--no-deps).
  if python3 -c "import importlib.metadata as m; m.distribution('nvidia-cudnn-frontend')" 2>/dev/null; then
    say "Python package present (nvidia-cudnn-frontend)"
  elif [ "${SCMOE_SKIP_INSTALL:-0}" != 1 ] && python3 -m pip --version >/dev/null 2>&1; then
    say "installing Python package: nvidia-cudnn-frontend (headers, --no-deps)"
    python3 -m pip install -q --no-deps 'nvidia-cudnn-frontend>=1,<2' ||
      { echo "error: pip could not install nvidia-cudnn-frontend;" \
             "run: python3 -m pip install --no-deps 'nvidia-cudnn-frontend>=1,<2'" >&2
        exit 2; }
  else
    echo "error: the tests need the cuDNN frontend headers;" \
         "run: python3 -m pip install --no-deps 'nvidia-cudnn-frontend>=1,<2'" >&2
    exit 2
  fi
fi
[ "$what" = deps ] && exit 0

# ---- Configure and build ---------------------------------------------------------------------
[ -d /usr/local/cuda/bin ] && export PATH="/usr/local/cuda/bin:$PATH"
args=(-DCMAKE_BUILD_TYPE=Release)
fresh=1
[ -f "$build/CMakeCache.txt" ] && fresh=0
if [ "$what" = tests ]; then
  args+=(-DSCMOE_BUILD_TESTS=ON -DSCMOE_BUILD_BENCH=ON)
  targets=()  # everything
  # A folder the quickstart configured without CUDA gets it back (unless SCMOE_CMAKE_ARGS says otherwise).
  [ $fresh = 0 ] && grep -q '^SCMOE_WITH_CUDA:STRING=OFF' "$build/CMakeCache.txt" &&
    [ -z "${SCMOE_CMAKE_ARGS:-}" ] && args+=(-DSCMOE_WITH_CUDA=AUTO)
else
  targets=(--target scmoe-train)
  [ "${SCMOE_QUICKSTART_BENCH:-0}" = 1 ] && targets+=(scmoe-bench)
  # A fresh quickstart build: the CUDA backend only where it can run (compiling it takes most of the
  # build time on 2 cores); the test command turns it on in the same folder later.
  if [ $fresh = 1 ]; then
    if (nvidia-smi -L 2>/dev/null || true) | grep -q '^GPU'; then args+=(-DSCMOE_WITH_CUDA=AUTO); else
      args+=(-DSCMOE_WITH_CUDA=OFF); fi
  fi
fi
# shellcheck disable=SC2206  # extra arguments are a list of words
args+=(${SCMOE_CMAKE_ARGS:-})
[ $fresh = 0 ] && say "reusing $build/"
say "configure: cmake -S . -B $build ${args[*]}"
mkdir -p "$build"
log=$build/setup-configure.log
cmake -S . -B "$build" "${args[@]}" >"$log" 2>&1 ||
  { cat "$log" >&2; echo "error: configure failed (log above: $log)" >&2; exit 1; }
grep -E '^-- scmoe:' "$log" || true
start=$(date +%s)
if [ "$what" = tests ]; then
  say "build everything with $jobs jobs (progress in percent; from scratch with CUDA about 10-15 minutes on 2 cores)"
else
  say "build ${targets[*]} with $jobs jobs (progress in percent; from scratch without CUDA about 3 minutes on 2 cores)"
fi
cmake --build "$build" -j "$jobs" ${targets[@]+"${targets[@]}"}
say "built in $(( $(date +%s) - start )) s"
