// Test only (LD_PRELOAD): kills this process (SIGKILL, as a power cut or the OOM killer would end
// it) at a chosen file-system call of a checkpoint save (tests/train/checkpoint_crash_test.py).
//
//   SCMOE_TEST_CRASH_ROOT  the checkpoint root: only calls on paths under it count (unset: the shim
//                          does nothing)
//   SCMOE_TEST_CRASH_ARM   a substring of a path, e.g. "step-00000004.tmp": counting starts at the
//                          first call on such a path (that call is number 1)
//   SCMOE_TEST_CRASH_NTH   the counted call at which the process is killed, before the call runs;
//                          0: never (then the number of counted calls is printed at exit)
//   SCMOE_TEST_CRASH_NO_EXCHANGE  1: renameat2(RENAME_EXCHANGE) fails with EINVAL, as on file
//                          systems without it (NFS): the save's other way of replacing a step runs
//
// Counted calls: open/openat for writing, mkdir, rename/renameat/renameat2, unlink/unlinkat, rmdir,
// remove, fsync/fdatasync (on an fd whose path is under the root), over every thread.
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>

namespace {

std::atomic<bool> g_armed{false};
std::atomic<int> g_counted{0};

void say(const char* text) { (void)!write(STDERR_FILENO, text, strlen(text)); }

struct Report {
    ~Report() {
        const char* nth = getenv("SCMOE_TEST_CRASH_NTH");
        if (getenv("SCMOE_TEST_CRASH_ROOT") == nullptr || (nth && atoi(nth) != 0)) return;
        char line[128];
        snprintf(line, sizeof line, "crash_shim: %d counted calls\n", g_counted.load());
        say(line);
    }
} g_report;

bool under_root(const char* path) {
    const char* root = getenv("SCMOE_TEST_CRASH_ROOT");
    return root && *root && path && strncmp(path, root, strlen(root)) == 0;
}

void maybe_crash(const char* call, const char* path, const char* path2 = nullptr) {
    if (!under_root(path) && !under_root(path2)) return;
    if (!g_armed.load()) {
        const char* arm = getenv("SCMOE_TEST_CRASH_ARM");
        if (!arm || !((path && strstr(path, arm)) || (path2 && strstr(path2, arm)))) return;
        g_armed = true;
    }
    const int n = g_counted.fetch_add(1) + 1;
    const char* nth_text = getenv("SCMOE_TEST_CRASH_NTH");
    if (!nth_text || atoi(nth_text) != n) return;
    char line[1200];
    snprintf(line, sizeof line, "crash_shim: SIGKILL at call %d, %s(%s%s%s)\n", n, call, path ? path : "",
             path2 ? ", " : "", path2 ? path2 : "");
    say(line);
    kill(getpid(), SIGKILL);
    for (;;) pause();
}

void maybe_crash_fd(const char* call, int fd) {
    char link[64], path[1024];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    const ssize_t n = readlink(link, path, sizeof path - 1);
    if (n <= 0) return;
    path[n] = 0;
    maybe_crash(call, path);
}

template <class Fn>
Fn* real(Fn*, const char* name) {
    return reinterpret_cast<Fn*>(dlsym(RTLD_NEXT, name));
}
#define REAL(name) real(&name, #name)

bool writes(int flags) { return (flags & (O_WRONLY | O_RDWR | O_CREAT)) != 0; }

mode_t mode_arg(int flags, va_list ap) {
    return (flags & (O_CREAT | O_TMPFILE)) ? static_cast<mode_t>(va_arg(ap, int)) : 0;
}

}  // namespace

extern "C" {

int open(const char* path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    const mode_t mode = mode_arg(flags, ap);
    va_end(ap);
    if (writes(flags)) maybe_crash("open", path);
    return REAL(open)(path, flags, mode);
}

int open64(const char* path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    const mode_t mode = mode_arg(flags, ap);
    va_end(ap);
    if (writes(flags)) maybe_crash("open", path);
    return REAL(open64)(path, flags, mode);
}

int openat(int dir, const char* path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    const mode_t mode = mode_arg(flags, ap);
    va_end(ap);
    if (writes(flags)) maybe_crash("openat", path);
    return REAL(openat)(dir, path, flags, mode);
}

int mkdir(const char* path, mode_t mode) noexcept {
    maybe_crash("mkdir", path);
    return REAL(mkdir)(path, mode);
}

int rename(const char* from, const char* to) noexcept {
    maybe_crash("rename", from, to);
    return REAL(rename)(from, to);
}

int renameat(int from_dir, const char* from, int to_dir, const char* to) noexcept {
    maybe_crash("renameat", from, to);
    return REAL(renameat)(from_dir, from, to_dir, to);
}

int renameat2(int from_dir, const char* from, int to_dir, const char* to, unsigned int flags) noexcept {
    const char* no_exchange = getenv("SCMOE_TEST_CRASH_NO_EXCHANGE");
    if ((flags & RENAME_EXCHANGE) && no_exchange && strcmp(no_exchange, "1") == 0 &&
        (under_root(from) || under_root(to))) {
        errno = EINVAL;
        return -1;
    }
    maybe_crash("renameat2", from, to);
    return REAL(renameat2)(from_dir, from, to_dir, to, flags);
}

int unlink(const char* path) noexcept {
    maybe_crash("unlink", path);
    return REAL(unlink)(path);
}

int unlinkat(int dir, const char* path, int flags) noexcept {
    maybe_crash("unlinkat", path);
    return REAL(unlinkat)(dir, path, flags);
}

int rmdir(const char* path) noexcept {
    maybe_crash("rmdir", path);
    return REAL(rmdir)(path);
}

int remove(const char* path) noexcept {
    maybe_crash("remove", path);
    return REAL(remove)(path);
}

int fsync(int fd) {
    maybe_crash_fd("fsync", fd);
    return REAL(fsync)(fd);
}

int fdatasync(int fd) {
    maybe_crash_fd("fdatasync", fd);
    return REAL(fdatasync)(fd);
}

}  // extern "C"
