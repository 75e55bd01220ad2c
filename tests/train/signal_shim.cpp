// Test only (LD_PRELOAD): sends real signals to this process at a chosen file-system call, so that a
// signal lands inside a checkpoint save deterministically (tests/train/signal_stop_test.py).
//
//   SCMOE_TEST_SIGNAL_PATH  a substring of the path, e.g. "step-00000008": calls on other paths are
//                           not counted (unset: the shim does nothing)
//   SCMOE_TEST_SIGNAL_NTH   (1) the matching call that sends them: open/openat for writing, mkdir,
//                           rename/renameat (either path), counted over every thread of the process
//   SCMOE_TEST_SIGNAL       (TERM) the signals to send, comma separated, in order: "TERM,TERM" sends
//                           a second one right after the first
//
// Each signal is sent with kill(getpid(), ...), as another process would send it, before the call
// proceeds (the next only once the previous is no longer pending); a line on stderr names the call
// and the path.
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <atomic>

namespace {

std::atomic<int> g_seen{0};

int signal_number(const char* name) {
    static const struct {
        const char* name;
        int number;
    } k[] = {{"TERM", SIGTERM}, {"INT", SIGINT}, {"HUP", SIGHUP}, {"USR1", SIGUSR1}, {"USR2", SIGUSR2}};
    if (strncmp(name, "SIG", 3) == 0) name += 3;
    for (size_t i = 0; i < sizeof k / sizeof k[0]; ++i)
        if (strcmp(name, k[i].name) == 0) return k[i].number;
    return 0;
}

// Whether `sig` is pending for the process as a whole (ShdPnd in /proc/self/status; sigpending()
// reports only blocked signals).
int process_pending(int sig) {
    FILE* f = fopen("/proc/self/status", "r");
    if (f == nullptr) return 0;
    char line[256];
    unsigned long long mask = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "ShdPnd: %llx", &mask) == 1) break;
    fclose(f);
    return static_cast<int>((mask >> (sig - 1)) & 1u);
}

void maybe_signal(const char* call, const char* path, const char* path2) {
    const char* want = getenv("SCMOE_TEST_SIGNAL_PATH");
    if (want == nullptr || *want == 0) return;
    if (!(path && strstr(path, want)) && !(path2 && strstr(path2, want))) return;
    const char* nth_text = getenv("SCMOE_TEST_SIGNAL_NTH");
    const int nth = nth_text ? atoi(nth_text) : 1;
    if (g_seen.fetch_add(1) + 1 != nth) return;
    const char* list = getenv("SCMOE_TEST_SIGNAL");
    char names[128];
    snprintf(names, sizeof names, "%s", list && *list ? list : "TERM");
    char line[1024];
    const int n = snprintf(line, sizeof line, "signal_shim: sending %s at %s(%s%s%s)\n", names, call, path,
                           path2 ? ", " : "", path2 ? path2 : "");
    if (n > 0)
        (void)!write(STDERR_FILENO, line,
                     static_cast<size_t>(n) < sizeof line ? static_cast<size_t>(n) : sizeof line - 1);
    char* save = nullptr;
    for (char* name = strtok_r(names, ",", &save); name; name = strtok_r(nullptr, ",", &save)) {
        const int sig = signal_number(name);
        if (sig == 0) continue;
        kill(getpid(), sig);
        // Standard signals do not queue: a second one sent while the first is still pending would
        // merge with it. Wait until the first has been taken by a thread (its handler has started).
        while (process_pending(sig)) {
            const struct timespec ms = {0, 1000000};
            nanosleep(&ms, nullptr);
        }
    }
}

template <class Fn>
Fn* real(Fn*, const char* name) {
    return reinterpret_cast<Fn*>(dlsym(RTLD_NEXT, name));
}
#define REAL(name) real(&name, #name)

bool writes(int flags) { return (flags & (O_WRONLY | O_RDWR | O_CREAT)) != 0; }

}  // namespace

extern "C" {

int open(const char* path, int flags, ...) {
    mode_t mode = 0;
    if (flags & (O_CREAT | O_TMPFILE)) {
        va_list ap;
        va_start(ap, flags);
        mode = static_cast<mode_t>(va_arg(ap, int));
        va_end(ap);
    }
    if (writes(flags)) maybe_signal("open", path, nullptr);
    return REAL(open)(path, flags, mode);
}

int open64(const char* path, int flags, ...) {
    mode_t mode = 0;
    if (flags & (O_CREAT | O_TMPFILE)) {
        va_list ap;
        va_start(ap, flags);
        mode = static_cast<mode_t>(va_arg(ap, int));
        va_end(ap);
    }
    if (writes(flags)) maybe_signal("open", path, nullptr);
    return REAL(open64)(path, flags, mode);
}

int openat(int dir, const char* path, int flags, ...) {
    mode_t mode = 0;
    if (flags & (O_CREAT | O_TMPFILE)) {
        va_list ap;
        va_start(ap, flags);
        mode = static_cast<mode_t>(va_arg(ap, int));
        va_end(ap);
    }
    if (writes(flags)) maybe_signal("openat", path, nullptr);
    return REAL(openat)(dir, path, flags, mode);
}

int mkdir(const char* path, mode_t mode) noexcept {
    maybe_signal("mkdir", path, nullptr);
    return REAL(mkdir)(path, mode);
}

int rename(const char* from, const char* to) noexcept {
    maybe_signal("rename", from, to);
    return REAL(rename)(from, to);
}

int renameat(int from_dir, const char* from, int to_dir, const char* to) noexcept {
    maybe_signal("renameat", from, to);
    return REAL(renameat)(from_dir, from, to_dir, to);
}

}  // extern "C"
