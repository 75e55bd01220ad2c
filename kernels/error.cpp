#include "kernels/error.h"

namespace scmoe {

void throw_error(const char* file, int line, const std::string& message) {
    std::string f = file;
    auto slash = f.find_last_of('/');
    std::string base = slash == std::string::npos ? f : f.substr(slash + 1);
    throw Error("scmoe: " + message + " (" + base + ":" + std::to_string(line) + ")");
}

}  // namespace scmoe
