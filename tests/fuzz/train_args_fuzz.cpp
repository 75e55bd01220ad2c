// Fuzzes scmoe-train's command-line parser (launch/train_args.h): the input is a newline-separated
// argument list. scmoe-train's main() catches only UsageError around parse(), so any other exception
// (or a crash) is a bug. Inputs asking for --help are skipped: the help exits the process.
#include <cstddef>
#include <cstdint>
#include <string>

#include "launch/train_args.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

// --help / -h, also inside a group of short flags ("-qh") or with a value ("--help=1").
bool asks_for_help(const std::string& token) {
    if (token.rfind("--", 0) == 0) return token.rfind("--help", 0) == 0;
    return token.size() > 1 && token[0] == '-' && token.find('h') != std::string::npos;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const scmoe::fuzz::ArgList args("scmoe-train", data, size);
    for (const std::string& token : args.tokens())
        if (asks_for_help(token)) return 0;
    try {
        (void)scmoe::launch::parse(args.argc(), args.argv());
    } catch (const scmoe::launch::UsageError&) {
    }
    return 0;
}
