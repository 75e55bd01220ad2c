// Fuzzes the command-line pieces scmoe-train and scmoe-plan share (launch/cli_options.h): the input is
// a newline-separated argument list parsed with the model-shape flags (add_model_shape_options,
// read_model_shape_options, then LmConfig::validate as the callers do), and each argument is also
// split as a comma list. A bad command line must throw cxxopts' exceptions or scmoe::Error.
#include <cstddef>
#include <cstdint>
#include <cxxopts.hpp>
#include <string>

#include "scmoe/kernels/error.h"
#include "launch/cli_options.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const scmoe::fuzz::ArgList args("scmoe-fuzz", data, size);
    for (const std::string& token : args.tokens()) {
        std::size_t chars = 0;
        for (const std::string& item : scmoe::launch::split_comma_list(token)) {
            if (item.empty() || item.find(',') != std::string::npos)
                scmoe::fuzz::property_failed("split_comma_list returned an empty item or one with a comma");
            chars += item.size();
        }
        if (chars > token.size()) scmoe::fuzz::property_failed("split_comma_list made up characters");
    }
    try {
        cxxopts::Options options("scmoe-fuzz");
        scmoe::launch::add_model_shape_options(options, "tiny", "256");
        const cxxopts::ParseResult result = options.parse(args.argc(), args.argv());
        bool custom = false;
        const scmoe::models::LmConfig config = scmoe::launch::read_model_shape_options(result, &custom);
        config.validate();
    } catch (const cxxopts::exceptions::exception&) {
    } catch (const scmoe::Error&) {
    }
    return 0;
}
