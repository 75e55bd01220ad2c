#!/usr/bin/env bash
# The one command to run on a machine with an NVIDIA GPU. It builds scmoe for this GPU's
# architecture, runs every GPU test (ctest -L gpu) and fails if any of them skips (only those that
# cover machines without a GPU may: their reason starts "a CUDA device is present"), then runs the
# benchmarks and writes one report, markdown and JSON:
#   gemm       grouped GEMM vs one cuBLAS dense GEMM of the same FLOPs, balanced and Zipf expert loads
#   attention  scmoe-bench attention (providers auto and own) vs PyTorch's scaled_dot_product_attention
#              (launch/attention_torch.py), each where it is available (torch importable); "not
#              available" in the report otherwise
#   layer      MoeLayer forward and forward+backward at gpt2-moe-small's MoE shape (SwiGLU experts),
#              capacity and dropless, vs Hugging Face transformers' MixtralSparseMoeBlock at the same
#              shape and dtype (launch/moe_layer_torch.py; "not available" without torch)
#   block      the ScMoE block variants on 4 in-process ranks sharing the GPU, behind an emulated PCIe 4 link
#              (--quick: one expert per rank, so a chunked run slices its rows)
#   train      scmoe-train --preset gpt2-moe-small on the GPU: tokens/s and MFU (the peak from scmoe's
#              built-in GPU specs, scmoe/kernels/emu/gpu_spec.cpp, or --peak-tflops), vs the same model in
#              PyTorch, eager and torch.compile'd within a budget (launch/gpt2_moe_torch.py); the last
#              step's trace (raw/train_trace*.rank0.json), op by op beside the emulator's trace of it
#   emu        the emulator's prediction of the gemm, attention, layer and train steps: for this GPU's
#              built-in spec, and for a profile made from this run's layer step (launch/make_profile.py)
# A failing benchmark is recorded in the report and makes the exit status 1; the others still run.
# Every step's output is shown and kept in <out>/raw/<step>.log next to its JSON. A failing GPU test is
# run again alone with CUDA_LAUNCH_BLOCKING=1, then under compute-sanitizer memcheck while time allows
# (launch/gpu_test_rerun.py). The report is rewritten after every step, so a run cut short leaves one.
#
#   usage: launch/gpu_check.sh [options]
#     -B, --build-dir DIR   build folder (default: build, the README's build folder), configured through launch/setup.sh tests
#                           with -DSCMOE_WITH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=<--arch>
#     -o, --out DIR         report folder (default: <build-dir>/gpu-report): report.md, report.json, raw/
#     -q, --quick           fewer sizes, iterations and training steps
#         --skip-build      use the binaries already in the build folder
#         --skip-tests      do not run the GPU tests (the report says so)
#         --test-args ARGS  extra ctest arguments for the GPU tests, one string (e.g. "-R GpuBlock")
#         --arch LIST       CUDA architectures to build (default: the compute capability nvidia-smi
#                           reports, e.g. 90 for 9.0; native when it reports none)
#         --peak-tflops X   dense bf16 peak of one GPU in TFLOP/s for the MFU (default: the built-in
#                           spec of the GPU's model: A30, A100/A800, H100 SXM, H200 SXM)
#         --deadline-s S    finish within S seconds: each step's limit is what is left (less 15 s for
#                           the report), and a step with under 10 s left is recorded as skipped
#     -h, --help            this text
# Exit status: 0 every GPU test passed and every benchmark ran; 1 a GPU test failed or skipped, or a
# benchmark failed (the report names which); 2 bad command line; 3 the build failed (or --skip-build
# found no binaries, or there is no Python 3); 4 no GPU: `nvidia-smi -L` lists none (nothing is built or run).
# Environment (defaults): SCMOE_NVIDIA_SMI (nvidia-smi: the command that lists and describes the
# GPUs; the tests point it to a fake one), SCMOE_GPU_CHECK_TIMEOUT_S (1800: the limit of each test
# or benchmark step), SCMOE_GPU_CHECK_BACKEND (cuda; cpu runs the steps on the CPU backend at tiny
# sizes, which only tests this script), SCMOE_CTEST (ctest; the tests point it to a fake one),
# SCMOE_JOBS (nproc), SCMOE_CMAKE_ARGS (extra configure arguments, after ours), SCMOE_PYTHON3 (python3),
# SCMOE_GPU_TEST_JOBS (4: GPU test processes at once on the one GPU), SCMOE_COMMIT (the commit the report
# names; default: git's HEAD), SCMOE_BUNDLE_JSON (the offline bundle's facts, launch/gpu_bundle.py run).
set -euo pipefail
cd "$(dirname "$0")/.."
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
usage_error() { echo "gpu_check.sh: $*" >&2; echo "usage: launch/gpu_check.sh [options]   (--help lists them)" >&2; exit 2; }

build=build out="" quick=0 skip_build=0 skip_tests=0 test_args="" arch="" peak_tflops="" deadline_s=""
while [ $# -gt 0 ]; do
    case "$1" in
        -h|--help) usage; exit 0 ;;
        -B|--build-dir) [ $# -ge 2 ] || usage_error "$1 needs a value"; build=$2; shift ;;
        -o|--out) [ $# -ge 2 ] || usage_error "$1 needs a value"; out=$2; shift ;;
        -q|--quick) quick=1 ;;
        --skip-build) skip_build=1 ;;
        --skip-tests) skip_tests=1 ;;
        --test-args) [ $# -ge 2 ] || usage_error "$1 needs a value"; test_args=$2; shift ;;
        --arch) [ $# -ge 2 ] || usage_error "$1 needs a value"; arch=$2; shift ;;
        --deadline-s)
            [ $# -ge 2 ] || usage_error "$1 needs a value"
            [[ $2 =~ ^[1-9][0-9]*$ ]] || usage_error "--deadline-s $2: a positive number of seconds"
            deadline_s=$2; shift ;;
        --peak-tflops)
            [ $# -ge 2 ] || usage_error "$1 needs a value"
            if [[ ! $2 =~ ^[0-9]+([.][0-9]+)?$ ]] || [[ $2 =~ ^0+([.]0+)?$ ]]; then
                usage_error "--peak-tflops $2: a positive number of TFLOP/s"
            fi
            peak_tflops=$2; shift ;;
        *) usage_error "unknown argument '$1'" ;;
    esac
    shift
done
[ -n "$build" ] || usage_error "--build-dir is empty"
out=${out:-$build/gpu-report}
backend=${SCMOE_GPU_CHECK_BACKEND:-cuda}
case "$backend" in cuda|cpu) ;; *) usage_error "SCMOE_GPU_CHECK_BACKEND=$backend: cuda or cpu" ;; esac
step_timeout=${SCMOE_GPU_CHECK_TIMEOUT_S:-1800}
[[ $step_timeout =~ ^[1-9][0-9]*$ ]] || usage_error "SCMOE_GPU_CHECK_TIMEOUT_S=$step_timeout: a positive number of seconds"
jobs=${SCMOE_JOBS:-$(nproc)}
smi=${SCMOE_NVIDIA_SMI:-nvidia-smi}
py=${SCMOE_PYTHON3:-python3}
ctest=${SCMOE_CTEST:-ctest}
report_py=launch/gpu_report.py
started=$(date +%s)
deadline=""
[ -n "$deadline_s" ] && deadline=$((started + deadline_s))
test_jobs=${SCMOE_GPU_TEST_JOBS:-4}
[[ $test_jobs =~ ^[1-9][0-9]*$ ]] || usage_error "SCMOE_GPU_TEST_JOBS=$test_jobs: a positive number"
# The exchanges' streams (compute, MoE/communication, gradient reduction per rank, 4 in-process ranks
# in the block benchmark) outnumber CUDA's default 8 hardware work queues; with fewer queues than
# streams, independent streams serialize behind each other's launches.
export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-32}
say() { echo "== gpu-check: $*"; }
# Echoes a command so it can be pasted back into a shell (quotes only the words that need it).
print_cmd() {
    local word line='+'
    for word in "$@"; do
        if [[ $word =~ ^[A-Za-z0-9_./,:=@%+-]+$ ]]; then line+=" $word"; else line+=" $(printf '%q' "$word")"; fi
    done
    echo "$line"
}

# ---- Is there a GPU? The rule of tests/gpu_presence.h: `nvidia-smi -L` prints "GPU <n>: <name> ...".
gpu_list=$("$smi" -L 2>/dev/null || true)
if ! grep -Eq '^GPU [0-9]+:' <<<"$gpu_list"; then
    if ! command -v "$smi" >/dev/null 2>&1; then
        why="'$smi' is not installed (no NVIDIA driver on this machine)"
    elif [ -z "$gpu_list" ]; then
        why="'$smi -L' lists no GPU"
    else
        why="'$smi -L' lists no GPU: $(head -n 1 <<<"$gpu_list")"
    fi
    echo "gpu_check.sh: no GPU: $why." >&2
    echo "gpu_check.sh: nothing was built or run (exit 4). On a machine without a GPU, launch/run_tests.sh runs the CPU tests." >&2
    exit 4
fi
say "$(grep -E '^GPU [0-9]+:' <<<"$gpu_list" | head -n 1)$( n=$(grep -Ec '^GPU [0-9]+:' <<<"$gpu_list"); [ "$n" -gt 1 ] && echo " (and $((n - 1)) more; the steps use the first one CUDA sees)")"

command -v "$py" >/dev/null 2>&1 ||
    { echo "gpu_check.sh: no Python 3 ('$py'; SCMOE_PYTHON3): the report needs it (exit 3)" >&2; exit 3; }
raw=$out/raw
rm -rf "$raw"
mkdir -p "$raw"
rm -f "$out/report.md" "$out/report.json"
# What the report says about the machine: every GPU, the driver, the CUDA version it supports.
"$smi" --query-gpu=index,name,driver_version,compute_cap,memory.total --format=csv,noheader \
    >"$raw/nvidia-smi-query.csv" 2>/dev/null || true
"$smi" >"$raw/nvidia-smi.txt" 2>/dev/null || true

# ---- Build ------------------------------------------------------------------------------------
if [ -z "$arch" ]; then
    arch=$(cut -d, -f4 "$raw/nvidia-smi-query.csv" | tr -d ' .' | grep -E '^[0-9]+$' | sort -u | paste -sd ';' || true)
    [ -n "$arch" ] || arch=native
fi
[ -d /usr/local/cuda/bin ] && export PATH="/usr/local/cuda/bin:$PATH"
if [ $skip_build = 1 ]; then
    say "skipping the build (--skip-build): using $build/"
else
    say "build into $build/ for CUDA architecture(s) $arch (launch/setup.sh tests; from scratch about 10-15 minutes on 2 cores, less on more)"
    cmake_args="-DSCMOE_WITH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=$arch"
    [ "$backend" = cpu ] && cmake_args="-DSCMOE_WITH_CUDA=OFF"
    if ! SCMOE_CMAKE_ARGS="$cmake_args ${SCMOE_CMAKE_ARGS:-}" launch/setup.sh tests "$build"; then
        echo "gpu_check.sh: the build failed (launch/setup.sh tests $build, output above); no test or benchmark ran (exit 3)" >&2
        exit 3
    fi
fi
bench=$build/bench/scmoe-bench
train=$build/launch/scmoe-train
for bin in "$bench" "$train"; do
    [ -x "$bin" ] || { echo "gpu_check.sh: no $bin: build it first (run without --skip-build) (exit 3)" >&2; exit 3; }
done
cuda_compiler=$(sed -n 's/^CMAKE_CUDA_COMPILER:[A-Z]*=//p' "$build/CMakeCache.txt" 2>/dev/null || true)
"${cuda_compiler:-nvcc}" --version >"$raw/nvcc.txt" 2>/dev/null || true
# What the configure step found (CUDA architectures, cuDNN, CUTLASS, MPI: its "-- scmoe:" lines).
grep -E '^-- scmoe:' "$build/setup-configure.log" >"$raw/configure.txt" 2>/dev/null || true
if [ "$backend" = cuda ] && grep -q '^SCMOE_WITH_CUDA:STRING=OFF' "$build/CMakeCache.txt" 2>/dev/null; then
    say "warning: $build/ was configured with SCMOE_WITH_CUDA=OFF: the GPU tests will skip and fail, the benchmarks fail"
fi

# ---- Sizes: full, --quick, and tiny ones for the CPU backend (SCMOE_GPU_CHECK_BACKEND=cpu tests this script)
if [ "$backend" = cpu ]; then
    mode=smoke
    gemm_args=(--tokens "64,100" --hidden 32 --ffn 48 --experts 4 --top-k 2 -n 1 -w 0)
    attention_shapes=("2 32 2 16")
    layer_args=(--tokens 64 --hidden 32 --ffn 48 --experts 4 --top-k 2 -n 1 -w 0)
    block_args=(--tokens 64 --seq 32 --hidden 32 --ffn 48 --experts 4 --heads 2 --variants "top2,scmoe-pos2" -n 1 -w 0)
    train_args=(--layers 2 --hidden 32 --heads 2 --seq 32 --ffn 64 --expert-ffn 64 --variants scmoe-pos2 --steps 3 --batch 2)
    compile_budget=60
elif [ $quick = 1 ]; then
    mode=quick
    gemm_args=(--tokens 8K --hidden 768 --ffn 3072 --experts 8 --top-k 2 -n 10 -w 2)
    attention_shapes=("8 1024 12 64" "8 1024 12 128")
    layer_args=(--tokens 8K --hidden 768 --ffn 3072 --experts 8 --top-k 2 -n 10 -w 2)
    # 4 experts on the 4 ranks: one expert per rank, so the chunked pipeline's pieces are row slices
    # (MoeLayer::row_sliced) and the #wrong column checks their overlap on/off bits on the GPU.
    block_args=(--tokens 4096 --seq 1024 --hidden 768 --ffn 3072 --experts 4 --heads 12 --variants "top2,scmoe-pos2" -n 3 -w 1)
    train_args=(--variants scmoe-pos2 --steps 10 --batch 8)
    compile_budget=150
else
    mode=full
    gemm_args=(--tokens "2K,8K,32K" --hidden 768 --ffn 3072 --experts 8 --top-k 2 -n 50 -w 5)
    attention_shapes=("8 1024 12 64" "8 1024 12 128" "4 2048 16 64" "4 2048 16 128")
    layer_args=(--tokens "8K,32K" --hidden 768 --ffn 3072 --experts 8 --top-k 2 -n 20 -w 3)
    block_args=(--tokens 4096 --seq 1024 --hidden 768 --ffn 3072 --experts 8 --heads 12 -n 10 -w 2)
    train_args=(--variants "top2,scmoe-pos2" --steps 50 --batch 8)
    compile_budget=240
fi
# The PyTorch peers run where the benchmarks run (tiny sizes on the CPU when testing this script).
torch_device=cuda
[ "$backend" = cpu ] && torch_device=cpu
# Steps: tests; gemm, attention and its peer per shape, layer and its peer, block, train; the emulator's
# gemm, attention per shape, layer and train for the spec and the profile; the train peer.
num_steps=$(( (skip_tests ? 0 : 1) + 6 + 2 * ${#attention_shapes[@]} + 2 * (3 + ${#attention_shapes[@]}) ))
step_no=0

# record NAME STATUS RC SECONDS JSON NOTE [CMD...]: one line of $raw/steps.jsonl for the report.
record() {
    local name=$1 status=$2 rc=$3 secs=$4 json=$5 note=$6
    shift 6
    "$py" "$report_py" step --raw "$raw" --name "$name" --status "$status" --rc "$rc" --seconds "$secs" \
        --json "$json" --note "$note" -- "$@"
}
# run_step NAME JSON NA_RC CMD...: runs CMD under the step timeout, its output on the terminal and in
# $raw/NAME.log, and records the outcome; exit status NA_RC (or "-") means "not available here".
# Never fails: a failing step is recorded and the next one runs.
run_step() {
    local name=$1 json=$2 na_rc=$3
    shift 3
    step_no=$((step_no + 1))
    local limit=$step_timeout
    if [ -n "$deadline" ]; then
        local left=$((deadline - $(date +%s) - 15))
        if [ "$left" -lt 10 ]; then
            say "[$step_no/$num_steps] $name: skipped (the deadline: ${left} s left)"
            record "$name" skipped "" "" "" "not run: the --deadline-s $deadline_s deadline had passed" "$@"
            write_report || true
            return
        fi
        [ "$left" -lt "$limit" ] && limit=$left
    fi
    say "[$step_no/$num_steps] $name: $(print_cmd "$@")"
    local start rc status note=""
    start=$(date +%s)
    set +e
    timeout -k 10 "$limit" "$@" 2>&1 | tee "$raw/$name.log"
    rc=${PIPESTATUS[0]}
    set -e
    local secs=$(( $(date +%s) - start ))
    if [ "$rc" = 0 ]; then
        status=ok
    elif [ "$rc" = "$na_rc" ]; then
        status="not available"
        note=$(grep -v '^[[:space:]]*$' "$raw/$name.log" | tail -n 1 || true)
    elif [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
        status=failed
        if [ "$limit" -lt "$step_timeout" ]; then
            note="timed out after ${limit} s (what the --deadline-s $deadline_s deadline left)"
        else
            note="timed out after ${step_timeout} s (SCMOE_GPU_CHECK_TIMEOUT_S)"
        fi
    else
        status=failed
        note="exit status $rc: $(grep -v '^[[:space:]]*$' "$raw/$name.log" | tail -n 1 | cut -c 1-300 || true)"
    fi
    record "$name" "$status" "$rc" "$secs" "$json" "$note" "$@"
    say "[$step_no/$num_steps] $name: $status in ${secs} s${note:+ ($note)}"
    write_report || true
}
# not_available NAME WHY: a step that cannot run here.
not_available() {
    step_no=$((step_no + 1))
    say "[$step_no/$num_steps] $1: not available: $2"
    record "$1" "not available" "" "" "" "$2"
    write_report || true
}
# write_report: report.md and report.json from what has run so far (after every step; the last one is
# the verdict). Exit status 1 when something failed.
commit=${SCMOE_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
dirty=no
[ -z "${SCMOE_COMMIT:-}" ] && [ "$commit" != unknown ] &&
    [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ] && dirty=yes
write_report() {
    local bundle_args=()
    [ -n "${SCMOE_BUNDLE_JSON:-}" ] && bundle_args=(--bundle "$SCMOE_BUNDLE_JSON")
    "$py" "$report_py" report --raw "$raw" --out "$out" \
        --context "commit=$commit" --context "uncommitted_changes=$dirty" \
        --context "date=$(date -u '+%Y-%m-%d %H:%M:%S UTC')" --context "host=$(uname -n)" \
        --context "mode=$mode" --context "backend=$backend" --context "build_dir=$build" \
        --context "cuda_architectures=$arch" --context "tests_exit=${tests_rc}" \
        --context "seconds=$(( $(date +%s) - started ))" ${deadline_s:+--context "deadline_s=$deadline_s"} \
        ${bundle_args[@]+"${bundle_args[@]}"} >"$raw/report.log" 2>&1
}

# ---- GPU tests --------------------------------------------------------------------------------
tests_rc=""
if [ $skip_tests = 0 ]; then
    junit=$(cd "$raw" && pwd)/gpu-tests.junit.xml
    read -r -a extra <<<"$test_args"  # words, never globbed (a regex like -R 'Gpu.*' stays as it is)
    # A passing test's output is kept whole (ctest keeps 1 KiB by default): the skip detection reads
    # gtest's "[  SKIPPED ]" line in it.
    run_step tests "" - "$ctest" --test-dir "$build" -L gpu --output-on-failure -j "$test_jobs" --timeout 900 \
        --test-output-size-passed 1048576 --output-junit "$junit" ${extra[@]+"${extra[@]}"}
    # Any skip fails here: with a GPU present only the tests that cover machines without one skip
    # (their reason starts "a CUDA device is present").
    set +e
    [ -f "$junit" ] && "$py" "$report_py" skips "$junit" --json "$raw/tests.json"
    tests_rc=$?
    set -e
    if [ -f "$raw/tests.json" ]; then
        "$py" launch/gpu_test_rerun.py --build "$build" --tests-json "$raw/tests.json" --raw "$raw" \
            --ctest "$ctest" ${deadline:+--deadline "$((deadline - 15))"} || true
        write_report || true
    fi
else
    say "skipping the GPU tests (--skip-tests)"
fi

# ---- Benchmarks -------------------------------------------------------------------------------
# Every grouped GEMM provider against one dense GEMM of the same FLOPs: CUTLASS's (what auto runs on
# sm_80..sm_90; first, so the emulator is compared with it), the own WMMA kernel, the cuBLAS loop.
gemm_providers=cutlass-grouped,device-grouped,loop
[ "$backend" = cpu ] && gemm_providers=auto,loop
run_step gemm "$raw/gemm.json" - "$bench" gemm --backend "$backend" --loads balanced,zipf --provider "$gemm_providers" \
    "${gemm_args[@]}" -J "$raw/gemm.json"

for shape in "${attention_shapes[@]}"; do
    read -r b s h d <<<"$shape"
    tag=b${b}_s${s}_h${h}_d${d}
    if "$bench" attention --help >/dev/null 2>&1; then
        run_step "attention_$tag" "$raw/attention_$tag.json" - "$bench" attention --backend "$backend" \
            --batch "$b" --seq "$s" --heads "$h" --head-dim "$d" --provider auto,own -J "$raw/attention_$tag.json"
    else
        not_available "attention_$tag" "this scmoe-bench has no attention subcommand"
    fi
    if [ -f launch/attention_torch.py ]; then
        # Exit status 3: torch is not importable or sees no GPU.
        run_step "attention_torch_$tag" "$raw/attention_torch_$tag.json" 3 "$py" launch/attention_torch.py \
            --batch "$b" --seq "$s" --heads "$h" --head-dim "$d" -J "$raw/attention_torch_$tag.json"
    else
        not_available "attention_torch_$tag" "launch/attention_torch.py is not in this checkout"
    fi
done

# The layer with Mixtral's expert (SwiGLU), capacity and dropless; the peer is dropless like Mixtral.
run_step layer "$raw/layer.json" - "$bench" layer --backend "$backend" --dispatch capacity,dropless \
    --activation swiglu "${layer_args[@]}" -J "$raw/layer.json"
# Exit status 3: torch or transformers is not importable, or sees no GPU.
if [ -f launch/moe_layer_torch.py ]; then
    run_step layer_torch "$raw/layer_torch.json" 3 "$py" launch/moe_layer_torch.py --device "$torch_device" \
        "${layer_args[@]}" -J "$raw/layer_torch.json"
else
    not_available layer_torch "launch/moe_layer_torch.py is not in this checkout"
fi

run_step block "$raw/block.json" - "$bench" block --backend "$backend" --ranks 4 --link pcie4 \
    "${block_args[@]}" -J "$raw/block.json"

# The MFU's peak: --peak-tflops, else the built-in spec of this GPU's model (read back through an
# emulated device, so the figure is the one scmoe/kernels/emu/gpu_spec.cpp cites).
gpu_name=$(head -n 1 "$raw/nvidia-smi-query.csv" | cut -d, -f2 | sed 's/^ *//; s/ *$//')
spec_args=(spec --gpu-name "$gpu_name" --bench "$bench" --json "$raw/spec.json")
[ -n "$peak_tflops" ] && spec_args+=(--peak-tflops "$peak_tflops")
peak=$("$py" "$report_py" "${spec_args[@]}" 2>"$raw/spec.log" || true)
if [ -n "$peak" ]; then
    say "MFU peak: $peak TFLOP/s ($(cat "$raw/spec.log"))"
    peak_args=(--peak-tflops "$peak")
else
    say "MFU: not computed ($(cat "$raw/spec.log")); pass --peak-tflops to have it"
    peak_args=()
fi
run_step train "" - "$train" --preset gpt2-moe-small --backend "$backend" "${train_args[@]}" \
    ${peak_args[@]+"${peak_args[@]}"} --metrics "$raw/train.metrics.jsonl" --trace "$raw/train_trace"

# ---- The emulator next to every measurement ----------------------------------------------------
# The same commands on an emulated GPU (modeled times, nothing computed): this GPU's built-in spec, and a
# profile of it made from this run's layer step (the rate its expert GEMMs reached).
emu_spec=$("$py" -c 'import json, sys; print(json.load(open(sys.argv[1])).get("emu_spec") or "")' \
    "$raw/spec.json" 2>/dev/null || true)
declare -A emu_gpu=()  # kind (spec, profile) -> the --gpu argument; absent: no prediction of that kind
if [ -n "$emu_spec" ]; then
    emu_gpu[spec]=$emu_spec
    if "$py" launch/make_profile.py --base "$emu_spec" --name "measured-$emu_spec" "$raw/layer.json" \
            >"$raw/profile.json" 2>"$raw/profile.log"; then
        emu_gpu[profile]=$raw/profile.json
    else
        say "no profile from the layer step ($(tail -n 1 "$raw/profile.log")): the profile's predictions are not available"
    fi
fi
[ -n "$emu_spec" ] || say "no built-in spec for '$gpu_name': the emulator's predictions are not available"
# The emulated cluster: this GPU's 8-GPU node preset. A profile has no interconnect of its own, so
# scmoe-train needs --cluster for it (the emulator does not guess one); the spec would default to it.
case "$emu_spec" in
    a30) emu_cluster=a30-pcie-8 ;;
    a800) emu_cluster=a800-nvlink-8 ;;
    h200) emu_cluster=h200-nvlink-8 ;;
    *) emu_cluster=h100-nvlink-8 ;;
esac
for kind in spec profile; do
    gpu=${emu_gpu[$kind]:-}
    if [ -z "$gpu" ]; then
        for name in gemm $(for sh in "${attention_shapes[@]}"; do read -r b s h d <<<"$sh"; echo "attention_b${b}_s${s}_h${h}_d${d}"; done) layer train; do
            not_available "emu_${kind}_$name" "no emulated GPU for this GPU's $kind"
        done
        continue
    fi
    run_step "emu_${kind}_gemm" "$raw/emu_${kind}_gemm.json" - "$bench" gemm --backend emu --gpu "$gpu" \
        --loads balanced,zipf --provider auto "${gemm_args[@]}" -J "$raw/emu_${kind}_gemm.json"
    for shape in "${attention_shapes[@]}"; do
        read -r b s h d <<<"$shape"
        tag=b${b}_s${s}_h${h}_d${d}
        run_step "emu_${kind}_attention_$tag" "$raw/emu_${kind}_attention_$tag.json" - "$bench" attention \
            --backend emu --gpu "$gpu" --batch "$b" --seq "$s" --heads "$h" --head-dim "$d" --provider auto \
            -J "$raw/emu_${kind}_attention_$tag.json"
    done
    run_step "emu_${kind}_layer" "$raw/emu_${kind}_layer.json" - "$bench" layer --backend emu --gpu "$gpu" \
        --dispatch capacity,dropless --activation swiglu "${layer_args[@]}" -J "$raw/emu_${kind}_layer.json"
    run_step "emu_${kind}_train" "" - "$train" --preset gpt2-moe-small --backend emu --gpu "$gpu" \
        --cluster "$emu_cluster" "${train_args[@]}" ${peak_args[@]+"${peak_args[@]}"} --metrics "$raw/emu_${kind}_train.metrics.jsonl" \
        --trace "$raw/emu_${kind}_train_trace"
done

# The training peer last: torch.compile is the longest step and the least needed.
if [ -f launch/gpt2_moe_torch.py ]; then
    run_step train_torch "$raw/train_torch.json" 3 "$py" launch/gpt2_moe_torch.py --device "$torch_device" \
        --preset gpt2-moe-small --mode eager,compile --compile-budget-s "$compile_budget" "${train_args[@]}" \
        ${peak_args[@]+"${peak_args[@]}"} -J "$raw/train_torch.json"
else
    not_available train_torch "launch/gpt2_moe_torch.py is not in this checkout"
fi

# ---- Report -----------------------------------------------------------------------------------
set +e
write_report
report_rc=$?
set -e
cat "$raw/report.log"
say "report: $out/report.md and $out/report.json (raw outputs and logs in $raw/)"
if [ $report_rc != 0 ]; then
    say "FAILED: see the report's Failures section (exit 1)"
    exit 1
fi
say "all GPU tests passed and every benchmark ran"
