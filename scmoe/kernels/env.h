// Reading SCMOE_* settings from the environment. Every reader treats an unset or empty variable as
// "not set" and throws scmoe::Error for any other value it cannot take whole, naming the variable,
// its value and what it accepts: a typo is never read as a default, a prefix of it, or an abort.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace scmoe {

// The integer value of `name` in [least, most] (decimal, the whole text); nullopt when unset or empty.
// `meaning` says what the number is, for the error ("threads", "a rank").
std::optional<std::int64_t> env_integer(const char* name, std::int64_t least, std::int64_t most,
                                        const std::string& meaning);

// The value of `name` as a finite number of seconds > 0; nullopt when unset or empty.
std::optional<double> env_seconds(const char* name);

// SCMOE_CPU_BLAS_THREADS: threads OpenBLAS uses per GEMM on the CPU backend, 1..4096; 0 when unset
// (the default policy of kernels/cpu/cpu_device.cpp).
int cpu_blas_threads_setting();

// SCMOE_EMU_STALL_S: seconds an emulated host may wait without the model moving before the run is
// declared stuck (default 300).
double emu_stall_seconds_setting();

}  // namespace scmoe
