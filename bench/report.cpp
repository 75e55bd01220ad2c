#include "report.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iomanip>
#include <ostream>
#include <sstream>

#ifndef SCMOE_VERSION_STRING
#define SCMOE_VERSION_STRING "unknown"
#endif

extern char** environ;

namespace scmoe::bench {
namespace {

std::string shell_quote(const std::string& arg) {
    const bool plain = !arg.empty() && std::all_of(arg.begin(), arg.end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) || std::strchr("-_./=:,+@%", c) != nullptr;
    });
    if (plain) return arg;
    std::string quoted = "'";
    for (char c : arg) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return quoted + "'";
}

std::string now_string() {
    const std::time_t t = std::time(nullptr);
    std::tm local{};
    localtime_r(&t, &local);
    char text[64];
    std::strftime(text, sizeof(text), "%Y-%m-%d %H:%M:%S %Z", &local);
    return text;
}

std::string host_name() {
    char name[256] = {};
    if (gethostname(name, sizeof(name) - 1) != 0) return "(unknown)";
    return name;
}

std::string cell_text(const Cell& cell, int precision) {
    if (std::holds_alternative<std::monostate>(cell)) return "N/A";
    if (const auto* i = std::get_if<std::int64_t>(&cell)) return std::to_string(*i);
    if (const auto* s = std::get_if<std::string>(&cell)) return *s;
    std::ostringstream os;
    os << std::fixed << std::setprecision(precision) << std::get<double>(cell);
    return os.str();
}

nlohmann::ordered_json cell_json(const Cell& cell) {
    if (std::holds_alternative<std::monostate>(cell)) return nullptr;
    if (const auto* i = std::get_if<std::int64_t>(&cell)) return *i;
    if (const auto* s = std::get_if<std::string>(&cell)) return *s;
    return std::get<double>(cell);
}

}  // namespace

const char* scmoe_version() { return SCMOE_VERSION_STRING; }

std::string command_line(int argc, char** argv) {
    std::string line;
    for (int i = 0; i < argc; ++i) {
        if (i) line += ' ';
        line += shell_quote(argv[i]);
    }
    return line;
}

std::vector<std::pair<std::string, std::string>> relevant_environment() {
    std::vector<std::pair<std::string, std::string>> env;
    for (const char* name : {"OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "CUDA_VISIBLE_DEVICES"}) {
        const char* value = std::getenv(name);
        env.emplace_back(name, value ? value : "(unset)");
    }
    std::vector<std::pair<std::string, std::string>> scmoe_vars;
    for (char** e = environ; e && *e; ++e) {
        const std::string entry = *e;
        if (entry.rfind("SCMOE_", 0) != 0) continue;
        const std::size_t eq = entry.find('=');
        scmoe_vars.emplace_back(entry.substr(0, eq), eq == std::string::npos ? "" : entry.substr(eq + 1));
    }
    std::sort(scmoe_vars.begin(), scmoe_vars.end());
    env.insert(env.end(), scmoe_vars.begin(), scmoe_vars.end());
    return env;
}

Report::Report(std::ostream& os, std::string benchmark, std::string command, Device& device, const CommonArgs& common,
               nlohmann::ordered_json args)
    : os_(os),
      benchmark_(std::move(benchmark)),
      command_(std::move(command)),
      device_(device),
      common_(common),
      args_(std::move(args)),
      environment_(relevant_environment()),
      date_(now_string()),
      host_(host_name()) {}

void Report::print_preamble() {
    const char* picked = backend_name(device_.backend());
    std::string why;
    if (common_.backend == "auto") {
        why = device_.backend() == Backend::kCuda ? " (auto: a CUDA device answered)"
              : cuda_backend_built()              ? " (auto: CUDA backend built, but no device answered)"
                                                  : " (auto: this build has no CUDA backend)";
    }
    os_ << "# scmoe-bench " << benchmark_ << ", scmoe " << scmoe_version() << "\n"
        << "#  Backend : " << picked << why << "\n"
        << "#  Device  0 : " << device_.description() << "\n"
        << "#  Date    : " << date_ << "\n"
        << "#  Host    : " << host_ << "\n"
        << "#  Command : " << command_ << "\n"
        << "#  Environment :";
    for (const auto& [name, value] : environment_) os_ << " " << name << "=" << value;
    os_ << "\n"
        << "#  Timing  : " << common_.warmup << " warmup + " << common_.iters
        << " timed iterations between events on one stream; check " << (common_.check ? "on" : "off")
        << " (after the timed loop)\n"
        << "#\n";
}

void Report::note(const std::string& text) {
    os_ << "# " << text << "\n" << std::flush;
    notes_.push_back(text);
}

std::string Report::format_row(const std::vector<std::string>& texts, bool comment) const {
    std::ostringstream os;
    os << (comment ? "#" : " ");
    for (std::size_t i = 0; i < columns_.size(); ++i) {
        os << " " << std::setw(columns_[i].width) << (i < texts.size() ? texts[i] : std::string());
    }
    std::string line = os.str();
    line.erase(line.find_last_not_of(' ') + 1);
    return line;
}

void Report::begin_table(std::vector<Column> columns) {
    columns_ = std::move(columns);
    std::vector<std::string> headers, units;
    for (Column& c : columns_) {
        c.width = std::max({c.width, static_cast<int>(c.header.size()), static_cast<int>(c.unit.size())});
        headers.push_back(c.header);
        units.push_back(c.unit);
    }
    os_ << format_row(headers, true) << "\n" << format_row(units, true) << "\n" << std::flush;
}

void Report::add_row(std::vector<Cell> cells) {
    std::vector<std::string> texts;
    nlohmann::ordered_json row;
    for (std::size_t i = 0; i < columns_.size(); ++i) {
        const Cell cell = i < cells.size() ? cells[i] : Cell{};
        texts.push_back(cell_text(cell, columns_[i].precision));
        row[columns_[i].key] = cell_json(cell);
    }
    if (!cells.empty()) {
        if (const auto* wrong = std::get_if<std::int64_t>(&cells.back())) {
            total_wrong_ += *wrong;
            ++checked_rows_;
        }
    }
    rows_.push_back(std::move(row));
    os_ << format_row(texts, false) << "\n" << std::flush;
}

int Report::finish(const std::vector<std::pair<std::string, std::string>>& summary) {
    const bool ok = total_wrong_ == 0;
    const bool checked = checked_rows_ > 0;
    const std::int64_t num_rows = static_cast<std::int64_t>(rows_.size());
    std::size_t label_width = std::string("Out of bounds values").size();
    for (const auto& line : summary) label_width = std::max(label_width, line.first.size());
    os_ << std::left;
    if (checked) {
        os_ << "# " << std::setw(static_cast<int>(label_width)) << "Out of bounds values"
            << " : " << total_wrong_ << " " << (ok ? "OK" : "FAILED") << "\n";
        if (checked_rows_ < num_rows)
            os_ << "# " << std::setw(static_cast<int>(label_width)) << "Rows not checked"
                << " : " << num_rows - checked_rows_ << " of " << num_rows << "\n";
    } else {
        // Nothing was compared, so there is no count to print: "0 OK" would claim a check that did not run.
        const char* why = !common_.check
                              ? (device_.backend() == Backend::kEmu ? "--backend emu: nothing is computed" : "-c 0")
                          : num_rows == 0 ? "no rows"
                                          : "no row has a check";
        os_ << "# Results not checked (" << why << ")\n";
    }
    for (const auto& [label, value] : summary)
        os_ << "# " << std::setw(static_cast<int>(label_width)) << label << " : " << value << "\n";
    os_ << std::right << "#\n" << std::flush;

    if (!common_.json_path.empty()) {
        nlohmann::ordered_json j;
        j["benchmark"] = benchmark_;
        j["version"] = scmoe_version();
        j["args"] = args_;
        j["command"] = command_;
        j["device"] = device_.description();
        j["backend"] = backend_name(device_.backend());
        j["date"] = date_;
        j["host"] = host_;
        nlohmann::ordered_json env = nlohmann::ordered_json::object();
        for (const auto& [name, value] : environment_) env[name] = value;
        j["environment"] = env;
        j["notes"] = notes_;
        j["rows"] = rows_;
        j["summary"] = nlohmann::ordered_json::object();
        for (const auto& [label, value] : summary) j["summary"][label] = value;
        j["wrong"] = checked ? nlohmann::ordered_json(total_wrong_) : nlohmann::ordered_json(nullptr);
        std::ofstream out(common_.json_path);
        out << j.dump(2) << "\n";
        if (!out) throw std::runtime_error("cannot write the JSON report to '" + common_.json_path + "'");
    }
    return ok ? kExitOk : kExitWrong;
}

}  // namespace scmoe::bench
