#include "launch/train_report.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "scmoe/kernels/error.h"
#include "scmoe/models/safetensors.h"

namespace scmoe::launch {

std::string format_eta(double seconds) {
    const auto s = static_cast<long long>(std::llround(std::max(0.0, seconds)));
    std::ostringstream o;
    if (s >= 3600)
        o << s / 3600 << "h" << std::setw(2) << std::setfill('0') << (s % 3600) / 60 << "m";
    else if (s >= 60)
        o << s / 60 << "m" << std::setw(2) << std::setfill('0') << s % 60 << "s";
    else
        o << s << "s";
    return o.str();
}

std::string step_line(const models::StepMetrics& m, std::int64_t total_steps, double eta_seconds) {
    std::ostringstream line;
    line << std::fixed << "step " << std::setw(5) << m.step << "/" << total_steps << "  loss " << std::setprecision(4)
         << m.loss << "  lr " << std::scientific << std::setprecision(2) << m.lr << std::fixed << "  "
         << std::setprecision(0) << m.tokens_per_s << " tok/s  " << std::setprecision(1) << m.step_ms
         << " ms/step  exposed comm " << m.exposed_comm_pct << "%  dropped " << m.dropped_tokens << "  ETA "
         << format_eta(eta_seconds);
    return line.str();
}

std::string eval_line(const models::EvalMetrics& e) {
    std::ostringstream line;
    line << std::fixed << "eval step " << e.step << ": loss " << std::setprecision(4) << e.loss << "  ppl "
         << std::setprecision(2) << e.ppl << "  (" << e.tokens << " tokens in " << e.windows << " windows, "
         << std::setprecision(1) << e.eval_ms / 1000.0 << " s)";
    return line.str();
}

std::string step_json(const std::string& variant, const models::StepMetrics& m) {
    nlohmann::ordered_json j;
    j["variant"] = variant;
    j["step"] = m.step;
    j["loss"] = m.loss;
    j["router_loss"] = m.router_loss;
    j["lr"] = m.lr;
    j["grad_norm"] = m.grad_norm;
    j["tokens_per_s"] = m.tokens_per_s;
    j["step_ms"] = m.step_ms;
    j["exposed_comm_pct"] = m.exposed_comm_pct;
    j["dropped_tokens"] = m.dropped_tokens;
    return j.dump();
}

void drop_metrics_after(const std::string& path, std::int64_t step) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return;
    std::string kept, line;
    bool dropped = false;
    while (std::getline(in, line)) {
        const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
        if (j.is_object() && j.contains("step") && j["step"].is_number_integer() &&
            j["step"].get<std::int64_t>() > step) {
            dropped = true;
            continue;
        }
        kept += line + "\n";
    }
    SCMOE_CHECK(in.eof(), "--metrics " << path << ": read failed");
    in.close();
    if (dropped) write_file_atomically(path, kept.data(), kept.size());
}

std::string eval_json(const std::string& variant, const models::EvalMetrics& e) {
    nlohmann::ordered_json j;
    j["variant"] = variant;
    j["step"] = e.step;
    j["eval_loss"] = e.loss;
    j["eval_ppl"] = e.ppl;
    j["eval_tokens"] = e.tokens;
    j["eval_ms"] = e.eval_ms;
    return j.dump();
}

void print_summary(const std::vector<RunSummary>& runs, double peak_tflops) {
    const bool eval = std::any_of(runs.begin(), runs.end(), [](const RunSummary& r) { return r.eval.has_value(); });
    const bool infer = std::any_of(runs.begin(), runs.end(), [](const RunSummary& r) { return r.forward_ms > 0; });
    std::cout << "#\n# summary (loss: first step, mean of the last 10% of steps; times: mean over steps after the first"
              << (eval ? "; eval: held-out loss after the last step, nats per byte, and its perplexity" : "")
              << (infer ? "; fwd: mean forward-only pass (inference) after training, and its speedup" : "") << ")\n";
    std::cout << "#  variant              steps  first loss  final loss     tok/s   ms/step  exposed%   dropped  "
                 "speedup  loss vs first"
              << (eval ? "   eval loss  eval ppl" : "") << (infer ? "    fwd ms  fwd speedup" : "") << "\n";
    for (const RunSummary& r : runs) {
        const RunSummary& base = runs.front();
        std::cout << "   " << std::left << std::setw(20) << r.variant << std::right << std::fixed << std::setw(6)
                  << r.steps << std::setprecision(4) << std::setw(12) << r.first_loss << std::setw(12) << r.final_loss
                  << std::setprecision(0) << std::setw(10) << r.tokens_per_s << std::setprecision(1) << std::setw(10)
                  << r.step_ms << std::setw(10) << r.exposed_comm_pct << std::setw(10) << r.dropped
                  << std::setprecision(3) << std::setw(9) << (r.step_ms > 0 ? base.step_ms / r.step_ms : 0.0) << "x"
                  << std::showpos << std::setprecision(2) << std::setw(13)
                  << (base.final_loss > 0 ? (r.final_loss / base.final_loss - 1) * 100 : 0.0) << "%" << std::noshowpos;
        if (r.eval)
            std::cout << std::setprecision(4) << std::setw(12) << r.eval->loss << std::setprecision(2) << std::setw(10)
                      << r.eval->ppl;
        if (infer)
            std::cout << std::setprecision(2) << std::setw(10) << r.forward_ms << std::setprecision(3) << std::setw(12)
                      << (r.forward_ms > 0 ? base.forward_ms / r.forward_ms : 0.0) << "x";
        std::cout << "\n";
    }
    for (const RunSummary& r : runs) {
        std::cout << "# " << r.variant << ": " << std::setprecision(3) << r.tflops_per_device
                  << " model TFLOP/s per rank";
        if (peak_tflops > 0)
            std::cout << ", MFU " << std::setprecision(1) << 100.0 * r.tflops_per_device / peak_tflops << "% of "
                      << peak_tflops << " TFLOP/s";
        std::cout << "\n";
    }
}

}  // namespace scmoe::launch
