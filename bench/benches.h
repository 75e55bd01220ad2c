// The scmoe-bench subcommands. Each takes the arguments after the subcommand name (argv[0] is the
// subcommand) and the full command line for the preamble; returns the process exit status.
#pragma once

#include <string>

namespace scmoe::bench {

int run_gemm_bench(int argc, char** argv, const std::string& command);
int run_layer_bench(int argc, char** argv, const std::string& command);
int run_a2a_bench(int argc, char** argv, const std::string& command);
int run_block_bench(int argc, char** argv, const std::string& command);
int run_attention_bench(int argc, char** argv, const std::string& command);

}  // namespace scmoe::bench
