// scmoe-train's command line: the flags (cxxopts), their checks, and what they ask for. Split from
// train_main.cpp so the parser can be tested and fuzzed (tests/fuzz/train_args_fuzz.cpp) without
// running a trainer.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "scmoe/comm/emulated_link.h"
#include "launch/emu_choice.h"
#include "launch/train_comms.h"
#include "scmoe/models/trainer.h"

namespace scmoe::launch {

// A bad command line: scmoe-train prints it with a pointer to --help and exits 2.
struct UsageError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// What the command line asks for.
struct Args {
    models::TrainConfig train;
    std::vector<std::string> variants;
    int ranks = 1, ep = 0;  // ep 0: = world
    bool mpi = false;
    std::string backend = "auto";
    EmuChoice emu;  // --backend emu only
    std::optional<int> device;
    std::optional<LinkModel> link;
    LinkScope link_scope = LinkScope::kExpertParallel;
    std::string metrics, trace, checkpoint_dir, resume;
    std::vector<std::string> allow_change;  // settings a resume may change (models::checkpoint_setting_names())
    bool overwrite = false;                 // a fresh run may delete the checkpoints in --checkpoint-dir
    std::int64_t checkpoint_every = 0, stop_at = 0, log_every = 0;
    int keep = 2;
    std::int64_t eval_every = 0;  // 0: only after the last step
    bool eval_only = false;
    int infer_passes = 0;  // 0: no inference timing
    int chunks = 0;        // the a2a / expert pipeline's pieces: 0 = auto
    bool quiet = false;
    std::vector<int> stop_signals;  // --stop-signals (launch/stop_signals.h); empty: none
    double peak_tflops = 0;
};

// Parses scmoe-train's arguments (argv[0] is the program name). Throws UsageError for a bad command
// line. --help (-h) prints the help and calls std::exit(0).
Args parse(int argc, const char* const* argv);

// Reads every SCMOE_* environment variable scmoe-train's run reads (SCMOE_CPU_BLAS_THREADS,
// SCMOE_COMM_TIMEOUT_S, SCMOE_COMM_SMS and NCCL's CTA limits, SCMOE_EMU_STALL_S,
// SCMOE_GROUPED_GEMM_PROVIDER, SCMOE_ATTENTION_PROVIDER, SCMOE_ATTENTION_DETERMINISTIC,
// SCMOE_CUTLASS_ARCH, SCMOE_CUTLASS_TRACE): throws UsageError naming the first malformed one, its value and what it
// accepts. (SCMOE_FAULT_*: train_main.cpp.)
void check_environment();

// Refuses (UsageError) a configuration whose memory on this host, estimated from its shapes before
// anything is allocated (models::estimate_train_memory, a lower bound; every in-process rank, or
// the mpirun processes on this host), exceeds what /proc/meminfo calls MemAvailable, saying how much
// it needs, how much there is, and the shape. cpu_backend: the model lives in host memory (else
// only the token batches do).
void check_host_memory(const Args& args, bool cpu_backend);

}  // namespace scmoe::launch
