// scmoe-bench: single-node microbenchmarks with nccl-tests style output.
//   scmoe-bench gemm  [options]   grouped GEMM vs dense GEMM of the same FLOPs
//   scmoe-bench layer [options]   MoeLayer forward / forward+backward and per-stage times (--ep N: expert-parallel)
//   scmoe-bench a2a   [options]   all_to_all_v bandwidth over a size sweep (nccl-tests alltoall)
//   scmoe-bench block [options]   ScMoE block configurations side by side (overlap, speedup vs top-2)
//   scmoe-bench attention [opts]  causal attention fwd/bwd per provider (cuDNN, own kernel), TFLOP/s
#include <iostream>

#include "benches.h"
#include "common.h"
#include "scmoe/kernels/error.h"
#include "report.h"

namespace {

void print_usage(std::ostream& os) {
    cxxopts::Options common("scmoe-bench <gemm|layer|a2a|block|attention>",
                            "scmoe-bench " + std::string(scmoe::bench::scmoe_version()) +
                                ": scmoe microbenchmarks with nccl-tests style tables.\n\n"
                                "Subcommands:\n"
                                "  gemm    grouped GEMM over expert loads vs one dense GEMM of the same FLOPs\n"
                                "  layer   MoeLayer fwd and fwd+bwd, per-stage times; --ep N: expert-parallel\n"
                                "  a2a     all_to_all_v bandwidth over a size sweep, in-process ranks or mpirun\n"
                                "  block   ScMoE block variants side by side: overlap, exposed comm, speedup vs top-2\n"
                                "  attention  causal attention fwd, bwd, fwd+bwd per provider (cudnn, own), TFLOP/s\n\n"
                                "'scmoe-bench <subcommand> --help' lists a subcommand's options. A letter means what "
                                "it means in nccl-tests (-b -e -f sweeps, -n -w -c -d -J) or nccl-tests lacks it; "
                                "nccl-tests' other letters are refused (-t is its thread count: token counts are "
                                "-s/--tokens). Exit status: 0 ok, 1 wrong results, 2 bad command line, 3 runtime "
                                "error.");
    common.set_width(110);
    common.custom_help("[options]");
    scmoe::bench::add_common_options(common);
    os << common.help({"common"});
}

}  // namespace

int main(int argc, char** argv) {
    using namespace scmoe::bench;
    const std::string command = command_line(argc, argv);
    if (argc < 2) {
        print_usage(std::cerr);
        return kExitUsage;
    }
    const std::string sub = argv[1];
    if (sub == "-h" || sub == "--help") {
        print_usage(std::cout);
        return kExitOk;
    }
    if (sub == "--version") {
        std::cout << "scmoe-bench " << scmoe_version() << "\n";
        return kExitOk;
    }
    try {
        if (sub == "gemm") return run_gemm_bench(argc - 1, argv + 1, command);
        if (sub == "layer") return run_layer_bench(argc - 1, argv + 1, command);
        if (sub == "a2a") return run_a2a_bench(argc - 1, argv + 1, command);
        if (sub == "block") return run_block_bench(argc - 1, argv + 1, command);
        if (sub == "attention") return run_attention_bench(argc - 1, argv + 1, command);
        std::cerr << "scmoe-bench: unknown subcommand '" << sub
                  << "': expected gemm, layer, a2a, block or attention (see --help)\n";
        return kExitUsage;
    } catch (const cxxopts::exceptions::exception& e) {
        std::cerr << "scmoe-bench " << sub << ": " << e.what() << " (see 'scmoe-bench " << sub << " --help')\n";
        return kExitUsage;
    } catch (const UsageError& e) {
        std::cerr << "scmoe-bench " << sub << ": " << e.what() << " (see 'scmoe-bench " << sub << " --help')\n";
        return kExitUsage;
    } catch (const std::exception& e) {
        std::cerr << "scmoe-bench " << sub << ": error: " << e.what() << "\n";
        return kExitError;
    }
}
