#include "scmoe/kernels/env.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "scmoe/kernels/error.h"

namespace scmoe {

std::optional<std::int64_t> env_integer(const char* name, std::int64_t least, std::int64_t most,
                                        const std::string& meaning) {
    const char* text = std::getenv(name);
    if (text == nullptr || *text == 0) return std::nullopt;
    char* end = nullptr;
    errno = 0;
    const long long value = std::strtoll(text, &end, 10);
    if (end == text || *end != 0 || errno != 0 || value < least || value > most)
        SCMOE_FAIL(name << "='" << text << "': expected an integer from " << least << " to " << most << " (" << meaning
                        << ")");
    return static_cast<std::int64_t>(value);
}

std::optional<double> env_seconds(const char* name) {
    const char* text = std::getenv(name);
    if (text == nullptr || *text == 0) return std::nullopt;
    char* end = nullptr;
    const double value = std::strtod(text, &end);
    if (end == text || *end != 0 || !std::isfinite(value) || value <= 0.0)
        SCMOE_FAIL(name << "='" << text << "': expected a number of seconds > 0 (e.g. 60 or 0.5)");
    return value;
}

int cpu_blas_threads_setting() {
    return static_cast<int>(env_integer("SCMOE_CPU_BLAS_THREADS", 1, 4096, "OpenBLAS threads per GEMM").value_or(0));
}

double emu_stall_seconds_setting() { return env_seconds("SCMOE_EMU_STALL_S").value_or(300.0); }

}  // namespace scmoe
