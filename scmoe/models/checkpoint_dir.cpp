// The checkpoint directory of a training run (open_checkpoint_dir): created, locked against a second
// trainer, rolled back or refused when it holds another run's checkpoints, probed for writes and
// free space.
#include "scmoe/models/checkpoint.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <memory>
#include <sstream>

#include "scmoe/kernels/error.h"
#include "scmoe/models/detail/checkpoint_files.h"

namespace scmoe::models {

using namespace detail;

namespace {

// root/lock's flock, released (its text emptied first) when the last owner lets go.
class DirLock {
  public:
    explicit DirLock(int fd) : fd_(fd) {}
    ~DirLock() {
        if (::ftruncate(fd_, 0) != 0) {
        }              // an empty lock file: nobody holds it (a failure here only leaves a stale note)
        ::close(fd_);  // releases the flock
    }
    DirLock(const DirLock&) = delete;
    DirLock& operator=(const DirLock&) = delete;

  private:
    int fd_;
};

std::string host_name() {
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    return host;
}

std::string now_utc() {
    const std::time_t now = std::time(nullptr);
    std::tm tm{};
    gmtime_r(&now, &tm);
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
    return buf;
}

// "host H pid P run R since T" as written by take_lock: the words for an error or a note.
std::string describe_holder(std::string text) {
    while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
    std::istringstream in(text);
    std::string host, pid, run, since, word;
    while (in >> word) {
        const auto eq = word.find('=');
        if (eq == std::string::npos) continue;
        const std::string k = word.substr(0, eq), v = word.substr(eq + 1);
        if (k == "host") host = v;
        if (k == "pid") pid = v;
        if (k == "run") run = v;
        if (k == "since") since = v;
    }
    if (host.empty() && pid.empty()) return "an unknown holder ('" + text + "')";
    return "host " + host + ", pid " + pid + ", run " + run + " (since " + since + ")";
}

// Rank 0: takes root/lock for `run_id`; returns the lock, and a note when a stale holder is replaced.
std::shared_ptr<void> take_lock(const fs::path& root, const std::string& run_id, std::vector<std::string>& notes) {
    const fs::path path = root / "lock";
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    SCMOE_CHECK(fd >= 0, path.string() << ": open: " << std::strerror(errno));
    auto read_holder = [&] {
        std::string text(4096, '\0');
        const ssize_t n = ::pread(fd, text.data(), text.size(), 0);
        text.resize(n > 0 ? static_cast<std::size_t>(n) : 0);
        return text;
    };
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
        const int err = errno;
        const std::string holder = read_holder();
        ::close(fd);
        SCMOE_CHECK(err != EWOULDBLOCK, root.string()
                                            << ": the checkpoint directory is locked by " << describe_holder(holder)
                                            << ": another trainer is using it (wait for it to end, or give "
                                               "this run another --checkpoint-dir)");
        SCMOE_FAIL(path.string() << ": flock: " << std::strerror(err));
    }
    auto lock = std::make_shared<DirLock>(fd);
    const std::string previous = read_holder();
    if (previous.find_first_not_of(" \n") != std::string::npos)
        notes.push_back("took over the lock of " + root.string() + " left by " + describe_holder(previous) +
                        ", which ended without releasing it");
    const std::string text =
        "host=" + host_name() + " pid=" + std::to_string(::getpid()) + " run=" + run_id + " since=" + now_utc() + "\n";
    SCMOE_CHECK(::ftruncate(fd, 0) == 0 &&
                    ::pwrite(fd, text.data(), text.size(), 0) == static_cast<ssize_t>(text.size()) && ::fsync(fd) == 0,
                path.string() << ": writing the lock holder: " << std::strerror(errno));
    return lock;
}

std::string mib(double bytes) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f MiB", bytes / (1024.0 * 1024.0));
    return buf;
}

}  // namespace

std::vector<std::string> open_checkpoint_dir(const std::string& root, CheckpointTarget t,
                                             const CheckpointDirOptions& o) {
    SCMOE_CHECK(t.run, "open_checkpoint_dir: needs the run (CheckpointTarget::run) to keep the lock in");
    std::vector<std::string> notes;
    collectively(t, "checkpoint directory " + root, [&] {
        if (t.layout.rank != 0) return;
        const fs::path dir = root;
        std::error_code ec;
        fs::create_directories(dir, ec);
        SCMOE_CHECK(!ec && fs::is_directory(dir),
                    root << ": cannot create the checkpoint directory: " << (ec ? ec.message() : "not a directory"));
        if (t.run->run_id.empty()) t.run->run_id = new_id();
        t.run->dir_lock = take_lock(dir, t.run->run_id, notes);

        if (!t.run->resumed_from.empty()) {
            // A rollback (a resume from an older step of this root): `latest` names where this run
            // is from now on, so that a crash before its first save resumes it, not the abandoned
            // newer steps (left on disk as they are).
            const fs::path from = fs::weakly_canonical(t.run->resumed_from, ec);
            const std::string name = from.filename().string();
            if (step_of_dir_name(name) >= 0 && from.parent_path() == fs::weakly_canonical(dir, ec)) {
                std::string latest;
                try {
                    latest = read_text((dir / "latest").string());
                } catch (const std::exception&) {
                }
                if (latest != name + "\n") {
                    write_text((dir / "latest").string(), name + "\n");
                    std::string newer;
                    for (const auto& [step, path] : step_dirs(dir))
                        if (step > step_of_dir_name(name))
                            newer = path.filename().string() + (newer.empty() ? "" : ", ") + newer;
                    notes.push_back("latest now names " + name + ", the step this run resumed from" +
                                    (newer.empty() ? std::string() : "; the newer " + newer + " are left as they are"));
                }
            }
        }
        if (t.run->resumed_from.empty()) {
            const auto steps = step_dirs(dir);
            const bool has_latest = fs::exists(dir / "latest");
            if (!steps.empty() || has_latest) {
                std::string names, run;
                for (std::size_t i = 0; i < steps.size(); ++i) {
                    if (i == 4) {
                        names += " and " + std::to_string(steps.size() - 4) + " more";
                        break;
                    }
                    names += (i ? ", " : "") + steps[i].second.filename().string();
                }
                try {
                    if (!steps.empty())
                        run = parse_checkpoint_manifest(read_manifest_text(steps.front().second),
                                                        steps.front().second.string())
                                  .run_id;
                } catch (const std::exception&) {
                }
                const std::string what = (names.empty() ? std::string("a 'latest' file") : names) +
                                         (run.empty() ? std::string() : " of run " + run);
                SCMOE_CHECK(o.overwrite, root << ": the checkpoint directory holds checkpoints (" << what
                                              << "): a fresh run would overwrite them; resume them (--resume auto), "
                                                 "give another --checkpoint-dir, or pass --overwrite to delete them");
                for (const auto& [step, path] : steps) fs::remove_all(path);
                for (const auto& e : fs::directory_iterator(dir)) {
                    const std::string n = e.path().filename().string();
                    if (n.rfind("step-", 0) == 0) fs::remove_all(e.path());  // .tmp / .old leftovers
                }
                fs::remove(dir / "latest");
                fsync_dir(dir);
                notes.push_back("--overwrite: deleted the checkpoints in " + root + " (" + what + ")");
            }
        }

        // Writable, fsync-able: found now, not after a whole --checkpoint-every interval.
        const fs::path probe = dir / (".write-probe-" + std::to_string(::getpid()));
        try {
            write_text(probe.string(), "scmoe-train write probe\n");
        } catch (const std::exception& e) {
            SCMOE_FAIL(root << ": the checkpoint directory is not writable: " << e.what());
        }
        fs::remove(probe);

        struct statvfs sv {};
        SCMOE_CHECK(::statvfs(dir.c_str(), &sv) == 0, root << ": statvfs: " << std::strerror(errno));
        const double free_bytes = static_cast<double>(sv.f_bavail) * static_cast<double>(sv.f_frsize);
        const double per = static_cast<double>(t.model.num_global_params()) * 3.0 * sizeof(float) + (1 << 20);
        // keep + 1 exist at once while a save is written (all of them with keep <= 0); the kept
        // steps already here take their place, so only the rest must fit in the free space.
        const std::int64_t total = o.keep > 0 ? std::int64_t{o.keep} + 1 : std::max<std::int64_t>(o.saves, 1);
        const auto here = static_cast<std::int64_t>(step_dirs(dir).size());
        const std::int64_t count =
            std::max<std::int64_t>(1, total - (o.keep > 0 ? std::min<std::int64_t>(here, o.keep) : 0));
        SCMOE_CHECK(free_bytes >= per * static_cast<double>(count),
                    root << ": " << mib(free_bytes) << " free; the checkpoints "
                         << (o.keep > 0 ? "--keep " + std::to_string(o.keep) : std::string("this run"))
                         << " implies need about " << mib(per * static_cast<double>(count)) << " more (" << count
                         << " of about " << mib(per) << " each: the f32 weights and two AdamW moments of "
                         << t.model.num_global_params() << " parameters)");
    });
    return notes;
}

}  // namespace scmoe::models
