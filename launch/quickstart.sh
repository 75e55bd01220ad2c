#!/usr/bin/env bash
# The main job: trains the tiny byte-level language model (4 layers, hidden 128, 8 experts) twice on
# the same data and seed — top-2 MoE, then ScMoE Pos-2 (the shortcut-connected MoE whose all-to-all
# overlaps the backbone) — on 4 in-process expert-parallel ranks behind an emulated slow link, scores
# both on the default corpus's held-out tenth every 50 steps, and prints them side by side: loss,
# held-out loss and perplexity, tokens/s, ms/step, exposed communication %, dropped tokens, speedup.
# About 3 minutes on 2 CPU cores, after the build. With a GPU (nvidia-smi lists one, or
# SCMOE_BACKEND=cuda) the same runs use the CUDA backend; the 4 ranks then share GPU 0.
#
# From a fresh clone it first runs launch/setup.sh quickstart: installs missing packages (or says
# how), then configures and builds scmoe-train in $SCMOE_BUILD_DIR (Release; reusing the folder, so
# a second run builds nothing). Extra arguments go to scmoe-train and come last, so they win (e.g.
# --steps 50, --trace t).
#   usage: launch/quickstart.sh [scmoe-train flags...]
# Environment (defaults): SCMOE_BUILD_DIR (build), SCMOE_BACKEND (cuda if nvidia-smi lists a GPU,
# else cpu), SCMOE_QUICKSTART_STEPS (150), SCMOE_QUICKSTART_LINK (gbps=0.05,latency_us=50),
# SCMOE_QUICKSTART_OUT ($SCMOE_BUILD_DIR/quickstart), SCMOE_QUICKSTART_BENCH (0; 1: afterwards also
# the scmoe-bench layer, gemm and block benchmarks, about 1.5 minutes more on 2 CPU cores).
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;; esac
# Echoes a command so it can be pasted back into a shell (quotes only the words that need it).
print_cmd() {
    local word line='+'
    for word in "$@"; do
        if [[ $word =~ ^[A-Za-z0-9_./,:=@%+-]+$ ]]; then line+=" $word"; else line+=" $(printf '%q' "$word")"; fi
    done
    echo "$line"
}
build=${SCMOE_BUILD_DIR:-build}
train=$build/launch/scmoe-train
launch/setup.sh quickstart "$build"

backend=${SCMOE_BACKEND:-}
if [ -z "$backend" ]; then
    if (nvidia-smi -L 2>/dev/null || true) | grep -q '^GPU'; then backend=cuda; else backend=cpu; fi
fi
out=${SCMOE_QUICKSTART_OUT:-$build/quickstart}
mkdir -p "$out"
metrics=$out/metrics.jsonl

# The link: 0.05 GB/s and 50 us per collective make top-2's all-to-all a large share of its step on
# a CPU, as a PCIe link does for the paper's GPUs (the share the ScMoE overlap can hide).
cmd=("$train" --ranks 4 --variants "top2,scmoe-pos2" --steps "${SCMOE_QUICKSTART_STEPS:-150}" --backend "$backend"
     --link "${SCMOE_QUICKSTART_LINK:-gbps=0.05,latency_us=50}" --eval-data default --eval-every 50
     --metrics "$metrics" "$@")
print_cmd "${cmd[@]}"
"${cmd[@]}"
echo "# metrics: $metrics (JSON lines: variant, step, loss, lr, tokens_per_s, step_ms, exposed_comm_pct, ...)"

if [ "${SCMOE_QUICKSTART_BENCH:-0}" = 1 ]; then
    bench=$build/bench/scmoe-bench  # built by setup.sh when SCMOE_QUICKSTART_BENCH=1
    # The MoE layer (embedded default shape on CPU), grouped vs dense GEMM, and the ScMoE block
    # variants on 4 in-process ranks with the link set so top-2's all-to-all is 60% of its MoE time.
    for args in "layer --backend auto" "gemm --backend auto" "block --backend auto --ranks 4 --comm-share 0.6"; do
        # shellcheck disable=SC2086  # each entry is a list of words
        echo "+ $bench $args" && "$bench" $args
    done
fi
