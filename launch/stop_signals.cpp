#include "launch/stop_signals.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <stdexcept>

#include "launch/cli_options.h"

namespace scmoe::launch {
namespace {

struct Named {
    int signal;
    const char* name;
};
constexpr Named kCatchable[] = {{SIGTERM, "SIGTERM"}, {SIGINT, "SIGINT"},   {SIGHUP, "SIGHUP"},  {SIGQUIT, "SIGQUIT"},
                                {SIGUSR1, "SIGUSR1"}, {SIGUSR2, "SIGUSR2"}, {SIGXCPU, "SIGXCPU"}};

// What the handler reads: the request, and its two lines per signal, built before it is installed.
static_assert(std::atomic<int>::is_always_lock_free, "the stop request must be async-signal-safe");
std::atomic<int> g_requested{0};
constexpr int kMaxSignal = 65;
constexpr std::size_t kLineBytes = 320;
struct Line {
    char text[kLineBytes];
    std::size_t size;
};
Line g_first[kMaxSignal], g_again[kMaxSignal];

void set_line(Line& line, const std::string& text) {
    line.size = std::min(text.size(), kLineBytes);
    std::memcpy(line.text, text.data(), line.size);
}

void write_line(const Line& line) {
    for (std::size_t done = 0; done < line.size;) {
        const ssize_t n = ::write(STDERR_FILENO, line.text + done, line.size - done);
        if (n > 0) {
            done += static_cast<std::size_t>(n);
        } else if (n < 0 && errno != EINTR) {
            return;
        }
    }
}

extern "C" void on_stop_signal(int signal) {
    const int saved_errno = errno;
    if (signal <= 0 || signal >= kMaxSignal) return;
    int none = 0;
    if (g_requested.compare_exchange_strong(none, signal)) {
        write_line(g_first[signal]);
        errno = saved_errno;
        return;
    }
    // A second stop signal: end now, by that signal. It is blocked in this handler, so it is
    // delivered, with its default action, as the handler returns.
    write_line(g_again[signal]);
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(signal, &dfl, nullptr);
    raise(signal);
    errno = saved_errno;
}

}  // namespace

std::vector<int> parse_stop_signals(const std::string& text) {
    if (text == "none") return {};
    std::vector<int> out;
    for (std::string word : split_comma_list(text)) {
        std::string upper = word;
        for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
        if (upper.rfind("SIG", 0) != 0) upper = "SIG" + upper;
        const auto it =
            std::find_if(std::begin(kCatchable), std::end(kCatchable), [&](const Named& n) { return upper == n.name; });
        if (it == std::end(kCatchable))
            throw std::invalid_argument(
                "--stop-signals: '" + word +
                "' is not one of SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGXCPU (or 'none')" +
                (upper == "SIGKILL" || upper == "SIGSTOP" ? std::string("; ") + upper + " cannot be caught" : ""));
        if (std::find(out.begin(), out.end(), it->signal) == out.end()) out.push_back(it->signal);
    }
    if (out.empty()) throw std::invalid_argument("--stop-signals is empty (give 'none' for no stop signals)");
    return out;
}

std::string stop_signal_name(int signal) {
    for (const Named& n : kCatchable)
        if (n.signal == signal) return n.name;
    return "signal " + std::to_string(signal);
}

void install_stop_signals(const std::vector<int>& signals, const std::string& who, const std::string& where) {
    for (int signal : signals) {
        if (signal <= 0 || signal >= kMaxSignal) throw std::invalid_argument("stop signal " + std::to_string(signal));
        const std::string name = stop_signal_name(signal);
        set_line(g_first[signal], who + ": " + name + where +
                                      ": stopping after the current step: every rank finishes it, then saves a "
                                      "checkpoint (with --checkpoint-dir) and exits; a second stop signal exits at "
                                      "once\n");
        set_line(g_again[signal], who + ": " + name + " again" + where +
                                      ": exiting at once, without saving; the last complete checkpoint is kept (a "
                                      "save in progress is discarded)\n");
        struct sigaction action {};
        action.sa_handler = on_stop_signal;
        sigemptyset(&action.sa_mask);
        action.sa_flags = SA_RESTART;
        if (sigaction(signal, &action, nullptr) != 0)
            throw std::runtime_error("sigaction(" + name + "): " + std::strerror(errno));
    }
}

int requested_stop_signal() { return g_requested.load(); }

}  // namespace scmoe::launch
