#include "scmoe/kernels/error.h"

namespace scmoe {
namespace {

std::string located(const char* file, int line, const std::string& message) {
    std::string f = file;
    auto slash = f.find_last_of('/');
    std::string base = slash == std::string::npos ? f : f.substr(slash + 1);
    return "scmoe: " + message + " (" + base + ":" + std::to_string(line) + ")";
}

}  // namespace

void throw_error(const char* file, int line, const std::string& message) {
    throw Error(located(file, line, message));
}

void throw_comm_error(const char* file, int line, const std::string& message) {
    throw CommError(located(file, line, message));
}

}  // namespace scmoe
