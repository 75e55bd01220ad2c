#!/usr/bin/env bash
# Installs what is missing and builds scmoe (launch/setup.sh tests: CUDA code compiled whenever nvcc
# is found), then runs the whole test suite. GPU tests skip with a message when no device is present.
# Extra arguments after the build folder go to ctest (e.g. launch/run_tests.sh build -L unit).
# With SCMOE_TEST_SANITIZE=1 (CI sets it) the CPU tests are also built and run under
# AddressSanitizer + UndefinedBehaviorSanitizer, and the scheduler and in-process communicator tests
# under ThreadSanitizer.
#   usage: launch/run_tests.sh [build-dir [ctest arguments...]]       (default: build)
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;; esac
build=${1:-build}
shift $(( $# > 0 ? 1 : 0 ))
jobs=${SCMOE_JOBS:-$(nproc)}
[ -d /usr/local/cuda/bin ] && export PATH="/usr/local/cuda/bin:$PATH"

launch/setup.sh tests "$build"
. launch/ccache_env.sh  # the sanitizer builds below compile through ccache too
echo "== test"
ctest --test-dir "$build" --output-on-failure -j "$jobs" --timeout 900 "$@"

if [ "${SCMOE_TEST_SANITIZE:-0}" = 1 ]; then
  echo "== sanitizer build (address,undefined; CPU code)"
  cmake -S . -B "$build-asan" -DCMAKE_BUILD_TYPE=Debug -DSCMOE_WITH_CUDA=OFF -DSCMOE_BUILD_BENCH=OFF \
        -DSCMOE_SANITIZE=address,undefined
  cmake --build "$build-asan" -j "$jobs"
  # OpenBLAS's own threads are not instrumented; LeakSanitizer would report their pools.
  ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir "$build-asan" --output-on-failure -j "$jobs" -E packaging --timeout 900

  echo "== thread sanitizer build (LayerScheduler / BlockStack and overlap tests: two streams per rank, rank threads;"
  echo "   the emulated GPUs: rank threads sharing the emulator's world)"
  # Configured without MPI, and building scmoe-train too: the one CI build that compiles the trainer
  # with SCMOE_WITH_MPI=OFF under -Werror (as the offline GPU bundle builds it).
  cmake -S . -B "$build-tsan" -DCMAKE_BUILD_TYPE=Debug -DSCMOE_WITH_CUDA=OFF -DSCMOE_WITH_MPI=OFF \
        -DSCMOE_BUILD_BENCH=ON -DSCMOE_SANITIZE=thread
  cmake --build "$build-tsan" -j "$jobs" --target scmoe_block_scheduler_test scmoe_block_overlap_link_test \
        scmoe_local_comm_test scmoe_emu_timeline_test scmoe_emu_comm_test scmoe_emu_block_test \
        scmoe_safe_destruction_test scmoe-train
  # The overlap tests prove overlap with rendezvous (no timing), so they run under TSan as well.
  TSAN_OPTIONS=halt_on_error=1 "$build-tsan/tests/block/scmoe_block_scheduler_test"
  TSAN_OPTIONS=halt_on_error=1 "$build-tsan/tests/block/scmoe_block_overlap_link_test"
  TSAN_OPTIONS=halt_on_error=1 "$build-tsan/tests/comm/scmoe_local_comm_test"
  for t in timeline comm block; do TSAN_OPTIONS=halt_on_error=1 "$build-tsan/tests/emu/scmoe_emu_${t}_test"; done
  # Memory freed while streams still work is released by those streams' threads (CpuDevice).
  TSAN_OPTIONS=halt_on_error=1 "$build-tsan/tests/unit/scmoe_safe_destruction_test"
fi
