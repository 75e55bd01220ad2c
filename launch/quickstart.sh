#!/usr/bin/env bash
# The main job: builds scmoe-bench and runs the MoE layer benchmark on the best backend present
# (CUDA when a GPU answers, else the CPU with the embedded default shape), then the grouped-GEMM
# comparison. Extra arguments go to `scmoe-bench layer`.
#   usage: launch/quickstart.sh [scmoe-bench layer flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${SCMOE_BUILD_DIR:-build}
[ -d /usr/local/cuda/bin ] && export PATH="/usr/local/cuda/bin:$PATH"
if [ ! -x "$build/bench/scmoe-bench" ]; then
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$build" -j "$(nproc)" --target scmoe-bench
fi
"$build/bench/scmoe-bench" layer --backend auto "$@"
"$build/bench/scmoe-bench" gemm --backend auto
