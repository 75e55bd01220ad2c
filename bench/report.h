// nccl-tests style output: a '#' preamble (version, device, date, host, command, environment), a
// header row and a units row, one data row per case ending in #wrong, a footer, and the same
// results as JSON (-J).
#pragma once

#include <cstdint>
#include <iosfwd>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "common.h"
#include "scmoe/kernels/device.h"

namespace scmoe::bench {

// scmoe's project version (from CMake).
const char* scmoe_version();
// The exact command line, shell-quoted where needed, so it can be pasted to reproduce a run.
std::string command_line(int argc, char** argv);
// The variables that change results or speed: OMP_NUM_THREADS, OPENBLAS_NUM_THREADS,
// CUDA_VISIBLE_DEVICES (value or "(unset)") and every SCMOE_* variable that is set.
std::vector<std::pair<std::string, std::string>> relevant_environment();

struct Column {
    std::string key;     // JSON key of the row object
    std::string header;  // header row text
    std::string unit;    // units row text, e.g. "(us)"; empty for none
    int width = 8;       // minimum printed width (grown to fit header and unit)
    int precision = 2;   // digits after the point for floating-point cells
};

// A cell: nothing (printed "N/A", JSON null), an integer, a number or a word.
using Cell = std::variant<std::monostate, std::int64_t, double, std::string>;

class Report {
  public:
    // `args` holds every parsed argument (resolved values); `requested_backend` is --backend.
    Report(std::ostream& os, std::string benchmark, std::string command, Device& device, const CommonArgs& common,
           nlohmann::ordered_json args);

    // The preamble: version, backend, device, date, host, command line, environment.
    void print_preamble();
    // An extra '# ' line (config summaries, skipped cases).
    void note(const std::string& text);
    // Fixes the columns and prints the header and units rows.
    void begin_table(std::vector<Column> columns);
    // Prints one data row immediately. The last column must be #wrong: an integer for a checked row,
    // an empty cell for a row nothing checked (the check off, or nothing to check in that case).
    void add_row(std::vector<Cell> cells);
    // Prints the footer and returns the exit status (kExitWrong if any row has wrong > 0). The footer:
    // "# Out of bounds values : N OK|FAILED" only when some row was checked ("# Rows not checked : K of
    // M" after it when some were not), else "# Results not checked (why)"; then the `summary` lines such
    // as "Avg ratio". Writes the JSON file when asked ("wrong": N, or null when no row was checked).
    int finish(const std::vector<std::pair<std::string, std::string>>& summary);

    std::int64_t total_wrong() const { return total_wrong_; }

  private:
    std::string format_row(const std::vector<std::string>& texts, bool comment) const;

    std::ostream& os_;
    std::string benchmark_;
    std::string command_;
    Device& device_;
    CommonArgs common_;
    nlohmann::ordered_json args_;
    std::vector<std::pair<std::string, std::string>> environment_;
    std::string date_, host_;
    std::vector<Column> columns_;
    nlohmann::ordered_json rows_ = nlohmann::ordered_json::array();
    std::vector<std::string> notes_;
    std::int64_t total_wrong_ = 0;
    std::int64_t checked_rows_ = 0;  // rows whose #wrong is a count
};

}  // namespace scmoe::bench
