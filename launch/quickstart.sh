#!/usr/bin/env bash
# The main job: builds scmoe-bench and runs the MoE layer benchmark on the best backend present
# (CUDA when a GPU answers, else the CPU with the embedded default shape), the grouped-GEMM
# comparison, then the ScMoE block variants side by side on 4 in-process expert-parallel ranks with
# the emulated link set so top-2's all-to-all is 60% of its MoE time (the paper's PCIe case).
# Extra arguments go to `scmoe-bench layer`.
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
"$build/bench/scmoe-bench" block --backend auto --ranks 4 --comm-share 0.6
