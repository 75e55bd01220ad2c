// Stop signals (scmoe-train --stop-signals, default SIGTERM,SIGINT,SIGUSR1): the first one asks the
// run to stop cleanly, a second one ends the process at once.
//
// The handler is async-signal-safe: it records the signal in a lock-free atomic and writes one
// prebuilt line to stderr, nothing else. The training loop reads the request at each step boundary
// (requested_stop_signal), every rank agrees on it (models::Trainer::agree_stop), every rank
// finishes the step, saves a checkpoint and exits with kExitStopped. A second stop signal (of any
// of the configured kinds) writes its line, restores the default action and re-raises: the process
// ends by that signal (a shell reports 128 + its number). An interrupted save never replaces the
// last complete checkpoint (see scmoe/models/checkpoint.h), so a resume starts from that.
#pragma once

#include <string>
#include <vector>

namespace scmoe::launch {

// Exit status of a run stopped by a stop signal: it finished its step, saved (with
// --checkpoint-dir) and can be resumed with --resume auto. launch/slurm.sbatch requeues on it.
constexpr int kExitStopped = 4;

// The default of --stop-signals.
inline constexpr const char* kDefaultStopSignals = "SIGTERM,SIGINT,SIGUSR1";

// Parses a comma-separated list of signal names (SIGTERM or TERM, any case): SIGTERM, SIGINT,
// SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGXCPU; "none" for no list. Throws std::invalid_argument
// naming the word that is not one of those (SIGKILL and SIGSTOP cannot be caught).
std::vector<int> parse_stop_signals(const std::string& text);

// "SIGTERM" for SIGTERM; "signal N" for a number without a name here.
std::string stop_signal_name(int signal);

// Installs the handler for `signals` (SA_RESTART, process-wide, so every thread's rank sees the
// request). The handler's lines read "<who>: SIGTERM<where>: ...", e.g. "scmoe-train: SIGTERM on
// rank 1: stopping after the current step ...". Not thread-safe against itself.
void install_stop_signals(const std::vector<int>& signals, const std::string& who, const std::string& where = "");

// The first stop signal received (0: none yet). Async-signal-safe, lock-free.
int requested_stop_signal();

}  // namespace scmoe::launch
