// Expert loads for the grouped GEMM benchmark: how many of the permuted rows each expert gets.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace scmoe::bench {

enum class LoadKind {
    kBalanced,  // rows / E each; the first rows % E experts get one more
    kZipf,      // expert e gets a share proportional to 1 / (e + 1)^s
};

// "balanced" | "zipf"; throws UsageError otherwise.
LoadKind parse_load(const std::string& name);
const char* load_name(LoadKind kind);

// Rows per expert, summing to `rows` exactly. Zipf counts use the largest-remainder method, so
// they are the integer split closest to the ideal shares (ties to the lower expert index).
std::vector<std::int64_t> expert_loads(LoadKind kind, std::int64_t rows, int num_experts, double zipf_exponent);

// Prefix sums: [E + 1] int32 group offsets for the grouped GEMM.
std::vector<std::int32_t> group_offsets(const std::vector<std::int64_t>& counts);

}  // namespace scmoe::bench
