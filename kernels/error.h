// Errors: every failure in scmoe is an scmoe::Error whose message carries file:line and what failed.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace scmoe {

class Error : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

// Throws Error("file:line: message"). Out of line so call sites stay small.
[[noreturn]] void throw_error(const char* file, int line, const std::string& message);

}  // namespace scmoe

// SCMOE_CHECK(cond, stream-expression): throws scmoe::Error naming the condition and the message.
#define SCMOE_CHECK(cond, msg)                                                             \
    do {                                                                                   \
        if (!(cond)) {                                                                     \
            std::ostringstream scmoe_check_os_;                                            \
            scmoe_check_os_ << msg;                                                        \
            ::scmoe::throw_error(__FILE__, __LINE__, scmoe_check_os_.str() + " [" #cond "]"); \
        }                                                                                  \
    } while (0)

#define SCMOE_FAIL(msg)                                              \
    do {                                                             \
        std::ostringstream scmoe_fail_os_;                           \
        scmoe_fail_os_ << msg;                                       \
        ::scmoe::throw_error(__FILE__, __LINE__, scmoe_fail_os_.str()); \
    } while (0)
