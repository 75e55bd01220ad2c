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

// A collective that failed: it timed out, a peer failed or left it, or the transport failed. The
// communicator is unusable afterwards (scmoe/comm/communicator.h), so a caller that catches one stops
// and reports it at once instead of issuing more collectives, which could only wait out another
// timeout. The message names the rank, the operation and, where known, the peer.
class CommError : public Error {
public:
    using Error::Error;
};

// Throws Error("file:line: message"). Out of line so call sites stay small.
[[noreturn]] void throw_error(const char* file, int line, const std::string& message);
// The same, as a CommError.
[[noreturn]] void throw_comm_error(const char* file, int line, const std::string& message);

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

// SCMOE_COMM_FAIL(stream-expression): throws scmoe::CommError("scmoe: message (file:line)").
#define SCMOE_COMM_FAIL(msg)                                                \
    do {                                                                    \
        std::ostringstream scmoe_fail_os_;                                  \
        scmoe_fail_os_ << msg;                                              \
        ::scmoe::throw_comm_error(__FILE__, __LINE__, scmoe_fail_os_.str()); \
    } while (0)
