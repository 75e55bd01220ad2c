#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz (SCMOE_FUZZ=ON, clang, ASan + UBSan) and runs each one
# for N seconds on a copy of its seed corpus (tests/fuzz/corpus/<target>/ is never written to).
#
#   usage: launch/fuzz.sh [--seconds N] [build-dir]
#     --seconds N  fuzzing time per target (default 60)
#     build-dir    the clang build folder (default build-fuzz); the run's corpora, logs and crash
#                  files go to build-dir/fuzz-run/<target>/
#
# Prints a table of executions per target and exits 1 if any target crashed, hung (-timeout=10 per
# input), ran out of memory (-rss_limit_mb=2048) or broke a sanitizer, naming the file that
# reproduces it (run `build-dir/tests/fuzz/<target>_fuzz <file>` to replay it). Exit 2: a missing
# package (installed when running as root with apt-get, as launch/setup.sh does) or a bad command line.
# Environment (defaults): SCMOE_JOBS (nproc): build jobs and targets fuzzed at once;
# SCMOE_SKIP_INSTALL (0; 1: never install, only check).
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; }
seconds=60
build=build-fuzz
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) [ $# -ge 2 ] || { echo "fuzz.sh: --seconds needs a value" >&2; exit 2; }; seconds=$2; shift 2 ;;
    --seconds=*) seconds=${1#--seconds=}; shift ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "fuzz.sh: unknown option '$1'" >&2; usage >&2; exit 2 ;;
    *) build=$1; shift ;;
  esac
done
case "$seconds" in ''|*[!0-9]*|0) echo "fuzz.sh: --seconds must be a positive integer, got '$seconds'" >&2; exit 2 ;; esac
jobs=${SCMOE_JOBS:-$(nproc)}
say() { echo "== fuzz: $*"; }

# ---- Debian packages: clang with its sanitizer and libFuzzer runtimes, and the build's own --------
packages=(clang libclang-rt-dev cmake make libopenblas-dev nlohmann-json3-dev libcxxopts-dev)
. launch/debian_packages.sh
ensure_debian_packages "${packages[@]}"

# ---- Configure and build the fuzz targets only ---------------------------------------------------
# -O1 with line tables: quick to build on 2 cores, readable sanitizer stacks; asserts stay on.
mkdir -p "$build"
log=$build/fuzz-configure.log
. launch/ccache_env.sh
say "configure: CC=clang CXX=clang++ cmake -S . -B $build -DSCMOE_FUZZ=ON ..."
CC=clang CXX=clang++ cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Fuzz -DCMAKE_CXX_FLAGS_FUZZ="-O1 -gline-tables-only" \
  -DSCMOE_FUZZ=ON -DSCMOE_WITH_CUDA=OFF -DSCMOE_WITH_MPI=OFF -DSCMOE_BUILD_TESTS=OFF -DSCMOE_BUILD_BENCH=ON \
  -DSCMOE_WARNINGS_AS_ERRORS=OFF >"$log" 2>&1 ||
  { cat "$log" >&2; echo "error: configure failed (log above: $log)" >&2; exit 1; }
start=$(date +%s)
say "build the fuzz targets with $jobs jobs"
cmake --build "$build" -j "$jobs" --target scmoe_fuzz_targets
say "built in $(( $(date +%s) - start )) s"

# ---- Run ---------------------------------------------------------------------------------------------
targets=()
for src in tests/fuzz/*_fuzz.cpp; do
  t=$(basename "$src" _fuzz.cpp)
  [ -d "tests/fuzz/corpus/$t" ] || { echo "error: no seed corpus tests/fuzz/corpus/$t/" >&2; exit 1; }
  targets+=("$t")
done
run_root=$build/fuzz-run
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
run_one() {
  local t=$1 dir=$run_root/$1
  rm -rf "$dir"
  mkdir -p "$dir/artifacts"
  cp -r "tests/fuzz/corpus/$t" "$dir/corpus"
  set +e
  "$build/tests/fuzz/${t}_fuzz" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$dir/artifacts/" "$dir/corpus" >"$dir/log" 2>&1 &
  local pid=$!
  wait $pid
  echo $? >"$dir/rc"
  # The targets' scratch files (tests/fuzz/fuzz_util.h), left behind when a target dies.
  rm -f /dev/shm/scmoe-fuzz-*-"$pid" "${TMPDIR:-/tmp}"/scmoe-fuzz-*-"$pid"
}
say "fuzzing ${#targets[@]} targets for $seconds s each, $jobs at a time (logs: $run_root/<target>/log)"
start=$(date +%s)
running=0
for t in "${targets[@]}"; do
  run_one "$t" &
  running=$((running + 1))
  if [ "$running" -ge "$jobs" ]; then wait -n || true; running=$((running - 1)); fi
done
wait
say "fuzzed in $(( $(date +%s) - start )) s"

failed=0
printf '%-14s %12s %9s %10s  %s\n' target runs seconds "runs/s" result
for t in "${targets[@]}"; do
  dir=$run_root/$t
  rc=$(cat "$dir/rc" 2>/dev/null || echo '?')
  done_line=$(grep -E '^Done [0-9]+ runs in [0-9]+ second' "$dir/log" | tail -1 || true)
  runs=$(echo "$done_line" | sed -nE 's/^Done ([0-9]+) runs in ([0-9]+) second.*/\1/p')
  secs=$(echo "$done_line" | sed -nE 's/^Done ([0-9]+) runs in ([0-9]+) second.*/\2/p')
  rate='-'
  [ -n "$runs" ] && [ -n "$secs" ] && [ "$secs" -gt 0 ] && rate=$((runs / secs))
  artifacts=$(find "$dir/artifacts" -type f | sort | tr '\n' ' ')
  if [ "$rc" = 0 ] && [ -z "$artifacts" ]; then
    result=ok
  else
    result="FAILED (exit $rc) ${artifacts:-no reproducer written; see $dir/log}"
    failed=1
  fi
  printf '%-14s %12s %9s %10s  %s\n' "$t" "${runs:--}" "${secs:--}" "$rate" "$result"
done
if [ $failed = 1 ]; then
  echo "error: a fuzz target failed; its log ($run_root/<target>/log) has the report; replay with" >&2
  echo "  $build/tests/fuzz/<target>_fuzz <reproducer>" >&2
  exit 1
fi
