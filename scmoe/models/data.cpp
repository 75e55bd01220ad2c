#include "scmoe/models/data.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string_view>
#include <system_error>
#include <utility>

#include "scmoe/kernels/error.h"

namespace scmoe::models {
namespace {

std::string errno_text(int err) { return std::error_code(err, std::generic_category()).message(); }

// What a file that is not a regular file is, for the error refusing it.
const char* file_kind(mode_t mode) {
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    if (S_ISSOCK(mode)) return "a socket";
    return "a special file";
}

std::uint64_t splitmix64(std::uint64_t x) {
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

// A balanced Feistel network on 2 * half_bits bits: a bijection for any round keys.
std::uint64_t feistel(std::uint64_t x, int half_bits, std::uint64_t key) {
    const std::uint64_t mask = (std::uint64_t{1} << half_bits) - 1;
    std::uint64_t left = x >> half_bits, right = x & mask;
    for (std::uint64_t round = 0; round < 4; ++round) {
        const std::uint64_t f = splitmix64(right ^ splitmix64(key + round)) & mask;
        const std::uint64_t new_right = left ^ f;
        left = right;
        right = new_right;
    }
    return (left << half_bits) | right;
}

}  // namespace

std::int64_t permute_index(std::int64_t i, std::int64_t n, std::uint64_t key) {
    SCMOE_CHECK(n > 0 && i >= 0 && i < n, "permute_index: index " << i << " outside [0, " << n << ")");
    if (n == 1) return 0;
    int half_bits = 1;  // the smallest domain of 4^half_bits >= n; 32 (all 64 bits) covers every int64 n
    while (half_bits < 32 && (std::uint64_t{1} << (2 * half_bits)) < static_cast<std::uint64_t>(n)) ++half_bits;
    // Cycle walking: the domain is < 4n, so on average fewer than 4 steps land back in [0, n).
    auto x = static_cast<std::uint64_t>(i);
    do {
        x = feistel(x, half_bits, key);
    } while (x >= static_cast<std::uint64_t>(n));
    return static_cast<std::int64_t>(x);
}

std::string data_file_problem(const std::string& path) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) return "cannot be opened: " + errno_text(errno);
    if (!S_ISREG(st.st_mode)) return std::string("is ") + file_kind(st.st_mode);
    if (st.st_size == 0) return "is empty";
    return {};
}

// ---- ByteDataset ---------------------------------------------------------------------------------

ByteDataset::ByteDataset(std::vector<std::string> paths, const std::string& role) : paths_(std::move(paths)) {
    SCMOE_CHECK(!paths_.empty(), "ByteDataset: no " << role << " files given");
    starts_.push_back(0);
    try {
        for (const std::string& path : paths_) {
            // O_NONBLOCK: opening a FIFO for reading would wait for a writer, forever; fstat then
            // refuses it (and directories, devices, sockets), which pread could not stream from.
            const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
            if (fd < 0) SCMOE_FAIL("cannot open " << role << " file '" << path << "': " << errno_text(errno));
            fds_.push_back(fd);
            struct stat st {};
            if (::fstat(fd, &st) != 0)
                SCMOE_FAIL("cannot stat " << role << " file '" << path << "': " << errno_text(errno));
            if (!S_ISREG(st.st_mode))
                SCMOE_FAIL(role << " file '" << path << "' is " << file_kind(st.st_mode)
                                << ", not a regular file (its bytes are read by offset, more than once)");
            if (st.st_size == 0) SCMOE_FAIL(role << " file '" << path << "' is empty");
            end_ += static_cast<std::int64_t>(st.st_size);
            starts_.push_back(end_);
        }
    } catch (...) {
        close_all();
        throw;
    }
}

ByteDataset::~ByteDataset() { close_all(); }

ByteDataset::ByteDataset(ByteDataset&& other) noexcept
    : paths_(std::move(other.paths_)),
      fds_(std::exchange(other.fds_, {})),
      starts_(std::move(other.starts_)),
      begin_(std::exchange(other.begin_, 0)),
      end_(std::exchange(other.end_, 0)) {}

ByteDataset& ByteDataset::operator=(ByteDataset&& other) noexcept {
    if (this != &other) {
        close_all();
        paths_ = std::move(other.paths_);
        fds_ = std::exchange(other.fds_, {});
        starts_ = std::move(other.starts_);
        begin_ = std::exchange(other.begin_, 0);
        end_ = std::exchange(other.end_, 0);
    }
    return *this;
}

void ByteDataset::close_all() noexcept {
    for (int fd : fds_) ::close(fd);
    fds_.clear();
}

void ByteDataset::restrict_to(std::int64_t begin, std::int64_t end) {
    SCMOE_CHECK(0 <= begin && begin < end && end <= starts_.back(),
                "ByteDataset::restrict_to: bytes [" << begin << ", " << end << ") outside the files' " << starts_.back()
                                                    << " bytes");
    begin_ = begin;
    end_ = end;
}

void ByteDataset::read(std::int64_t offset, std::int64_t count, std::uint8_t* out) const {
    // Written so that no sum can overflow: offset and count may be anything.
    SCMOE_CHECK(offset >= 0 && count >= 0 && offset <= size() && count <= size() - offset,
                "ByteDataset::read: " << count << " bytes at offset " << offset << " outside the stream of " << size()
                                      << " bytes");
    if (count == 0) return;
    offset += begin_;
    // The file holding `offset`: the one before the first start past it.
    auto file =
        static_cast<std::size_t>(std::upper_bound(starts_.begin(), starts_.end(), offset) - starts_.begin() - 1);
    while (count > 0) {
        const std::int64_t in_file = offset - starts_[file];
        const std::int64_t chunk = std::min(count, starts_[file + 1] - offset);
        std::int64_t done = 0;
        while (done < chunk) {
            const ssize_t got = ::pread(fds_[file], out + done, static_cast<std::size_t>(chunk - done),
                                        static_cast<off_t>(in_file + done));
            if (got < 0 && errno == EINTR) continue;
            if (got < 0) SCMOE_FAIL("cannot read data file '" << paths_[file] << "': " << errno_text(errno));
            if (got == 0) SCMOE_FAIL("data file '" << paths_[file] << "' shrank while in use");
            done += got;
        }
        out += chunk;
        offset += chunk;
        count -= chunk;
        ++file;
    }
}

// ---- ByteBatcher ---------------------------------------------------------------------------------

ByteBatcher::ByteBatcher(ByteDataset data, const ByteBatcherConfig& config) : data_(std::move(data)), config_(config) {
    SCMOE_CHECK(config.batch > 0, "ByteBatcher: batch must be positive, got " << config.batch);
    SCMOE_CHECK(config.seq_len > 0, "ByteBatcher: seq_len must be positive, got " << config.seq_len);
    SCMOE_CHECK(config.world > 0, "ByteBatcher: world must be positive, got " << config.world);
    SCMOE_CHECK(config.rank >= 0 && config.rank < config.world,
                "ByteBatcher: rank " << config.rank << " outside [0, " << config.world << ")");
    // size - 1 < seq_len rather than size < seq_len + 1: seq_len may be the largest int64 (size >= 1).
    SCMOE_CHECK(data_.size() - 1 >= config.seq_len,
                "ByteBatcher: the data (" << data_.size() << " bytes) is shorter than one sequence of seq_len + 1 = "
                                          << config.seq_len << " + 1 bytes");
    const std::int64_t total_windows = (data_.size() - 1) / config.seq_len;
    SCMOE_CHECK(total_windows >= config.world,
                "ByteBatcher: the data has " << total_windows << " windows of " << config.seq_len
                                             << " tokens, fewer than the " << config.world << " ranks sharing it");
    first_window_ = total_windows * config.rank / config.world;
    num_windows_ = total_windows * (config.rank + 1) / config.world - first_window_;
    bytes_.resize(static_cast<std::size_t>(config.seq_len + 1));
}

std::int64_t ByteBatcher::window_at(std::int64_t epoch, std::int64_t position) const {
    if (!config_.shuffle) return first_window_ + position;
    const std::uint64_t key =
        splitmix64(splitmix64(config_.seed) ^
                   splitmix64((static_cast<std::uint64_t>(config_.rank) << 40) ^ static_cast<std::uint64_t>(epoch)));
    return first_window_ + permute_index(position, num_windows_, key);
}

std::int64_t ByteBatcher::peek_window_offset() const { return window_at(epoch_, position_) * config_.seq_len; }

void ByteBatcher::next(std::int32_t* inputs, std::int32_t* targets) {
    const std::int64_t seq_len = config_.seq_len;
    for (std::int64_t b = 0; b < config_.batch; ++b) {
        data_.read(peek_window_offset(), seq_len + 1, bytes_.data());
        std::int32_t* in = inputs + b * seq_len;
        std::int32_t* tg = targets + b * seq_len;
        for (std::int64_t t = 0; t < seq_len; ++t) {
            in[t] = bytes_[static_cast<std::size_t>(t)];
            tg[t] = bytes_[static_cast<std::size_t>(t + 1)];
        }
        if (++position_ == num_windows_) {
            // Only a corrupt restored state can be here (2^63 epochs cannot be trained through).
            SCMOE_CHECK(epoch_ < std::numeric_limits<std::int64_t>::max(),
                        "ByteBatcher: epoch " << epoch_ << " cannot be counted past (a corrupt restored state?)");
            position_ = 0;
            ++epoch_;
        }
    }
}

ByteBatcher::Batch ByteBatcher::next() {
    Batch batch;
    batch.inputs.resize(static_cast<std::size_t>(config_.batch * config_.seq_len));
    batch.targets.resize(batch.inputs.size());
    next(batch.inputs.data(), batch.targets.data());
    return batch;
}

ByteBatcherState ByteBatcher::state() const { return {config_.seed, epoch_, position_, num_windows_}; }

void ByteBatcher::restore(const ByteBatcherState& state) {
    SCMOE_CHECK(state.num_windows == num_windows_, "ByteBatcher::restore: the saved state covers "
                                                       << state.num_windows << " windows but this rank's shard has "
                                                       << num_windows_ << " (different data, seq_len or world?)");
    SCMOE_CHECK(state.epoch >= 0 && state.position >= 0 && state.position < num_windows_,
                "ByteBatcher::restore: epoch " << state.epoch << ", position " << state.position << " out of range");
    config_.seed = state.seed;
    epoch_ = state.epoch;
    position_ = state.position;
}

// ---- EvalWindows --------------------------------------------------------------------------------

EvalWindows::EvalWindows(ByteDataset data, std::int64_t seq_len, std::int64_t max_windows, int rank, int world)
    : data_(std::move(data)), seq_len_(seq_len), world_(world) {
    SCMOE_CHECK(seq_len > 0, "EvalWindows: seq_len must be positive, got " << seq_len);
    SCMOE_CHECK(world > 0 && rank >= 0 && rank < world,
                "EvalWindows: rank " << rank << " outside [0, " << world << ")");
    if (data_.size() - 1 < seq_len) {  // not size < seq_len + 1: seq_len may be the largest int64 (size >= 1)
        std::string files;
        for (const std::string& p : data_.paths()) files += (files.empty() ? "'" : ", '") + p + "'";
        SCMOE_FAIL("eval data " << files << " (" << data_.size()
                                << " bytes) is shorter than one window of seq + 1 = " << seq_len << " + 1 bytes");
    }
    stream_windows_ = (data_.size() - 1) / seq_len;
    num_windows_ = max_windows > 0 ? std::min(stream_windows_, max_windows) : stream_windows_;
    first_window_ = num_windows_ * rank / world;
    shard_windows_ = num_windows_ * (rank + 1) / world - first_window_;
    bytes_.resize(static_cast<std::size_t>(seq_len + 1));
}

std::int64_t EvalWindows::num_batches(std::int64_t batch) const {
    SCMOE_CHECK(batch > 0, "EvalWindows::num_batches: batch must be positive, got " << batch);
    const std::int64_t largest_shard = (num_windows_ + world_ - 1) / world_;
    return largest_shard / batch + (largest_shard % batch != 0);  // rounded up; no overflow for any batch
}

void EvalWindows::read(std::int64_t first, std::int64_t count, std::int32_t* inputs, std::int32_t* targets) const {
    // Written so that no sum can overflow: first and count may be anything.
    SCMOE_CHECK(first >= 0 && count >= 0 && first <= stream_windows_ && count <= stream_windows_ - first,
                "EvalWindows::read: " << count << " windows from window " << first << " outside the stream's "
                                      << stream_windows_);
    for (std::int64_t w = 0; w < count; ++w) {
        data_.read((first + w) * seq_len_, seq_len_ + 1, bytes_.data());
        for (std::int64_t t = 0; t < seq_len_; ++t) {
            inputs[w * seq_len_ + t] = bytes_[static_cast<std::size_t>(t)];
            targets[w * seq_len_ + t] = bytes_[static_cast<std::size_t>(t + 1)];
        }
    }
}

// ---- The default corpus --------------------------------------------------------------------------

std::string generate_corpus_text(std::int64_t bytes, std::uint64_t seed) {
    static constexpr std::string_view kWords[] = {
        "the",     "of",      "and",    "a",      "to",       "in",     "is",    "that",  "it",     "was",
        "for",     "on",      "are",    "as",     "with",     "they",   "be",    "at",    "one",    "have",
        "this",    "from",    "by",     "hot",    "word",     "but",    "what",  "some",  "we",     "can",
        "out",     "other",   "were",   "all",    "there",    "when",   "up",    "use",   "your",   "how",
        "said",    "each",    "which",  "she",    "do",       "their",  "time",  "if",    "will",   "way",
        "about",   "many",    "then",   "them",   "write",    "would",  "like",  "so",    "these",  "her",
        "long",    "make",    "thing",  "see",    "him",      "two",    "has",   "look",  "more",   "day",
        "could",   "go",      "come",   "did",    "number",   "sound",  "no",    "most",  "people", "my",
        "over",    "know",    "water",  "than",   "call",     "first",  "who",   "may",   "down",   "side",
        "been",    "now",     "find",   "river",  "model",    "expert", "token", "layer", "train",  "small",
        "large",   "quickly", "slowly", "bright", "quiet",    "old",    "new",   "city",  "garden", "morning",
        "evening", "machine", "letter", "window", "mountain", "story",  "music"};
    constexpr std::uint64_t kNumWords = sizeof(kWords) / sizeof(kWords[0]);
    std::string text;
    text.reserve(static_cast<std::size_t>(bytes) + 64);
    std::uint64_t state = seed;
    auto draw = [&](std::uint64_t n) { return splitmix64(state++) % n; };
    while (static_cast<std::int64_t>(text.size()) < bytes) {
        const std::uint64_t words = 4 + draw(12);
        for (std::uint64_t w = 0; w < words; ++w) {
            std::string word(kWords[draw(kNumWords)]);
            if (w == 0) word[0] = static_cast<char>(word[0] - 'a' + 'A');
            text += word;
            if (w + 1 < words) text += draw(8) == 0 ? ", " : " ";
        }
        text += draw(10) == 0 ? "?" : ".";
        text += draw(6) == 0 ? "\n\n" : " ";
    }
    text.resize(static_cast<std::size_t>(bytes));
    return text;
}

DefaultCorpus default_corpus(const std::string& license_dir, const std::string& fallback_dir) {
    namespace fs = std::filesystem;
    static constexpr const char* kLicenses[] = {"GPL-3",    "GPL-2",   "LGPL-2.1", "LGPL-3", "Apache-2.0",
                                                "GFDL-1.3", "MPL-2.0", "Artistic", "BSD",    "CC0-1.0"};
    DefaultCorpus corpus;
    std::error_code ec;
    std::uintmax_t total = 0;
    for (const char* name : kLicenses) {
        const fs::path path = fs::path(license_dir) / name;
        const std::uintmax_t size = fs::is_regular_file(path, ec) ? fs::file_size(path, ec) : 0;
        if (ec || size == 0) continue;
        corpus.paths.push_back(path.string());
        total += size;
    }
    auto hold_out_last_tenth = [&corpus](std::int64_t total_bytes) {
        corpus.total_bytes = total_bytes;
        corpus.held_out_begin = total_bytes - total_bytes / 10;
        corpus.description += "; training reads bytes [0, " + std::to_string(corpus.held_out_begin) +
                              "), the last tenth is held out (--eval-data default)";
    };
    if (!corpus.paths.empty()) {
        corpus.description = "default corpus: " + std::to_string(corpus.paths.size()) + " license texts from " +
                             license_dir + " (Debian base-files), " + std::to_string(total) + " bytes";
        hold_out_last_tenth(static_cast<std::int64_t>(total));
        return corpus;
    }
    constexpr std::int64_t kGeneratedBytes = 256 * 1024;
    const fs::path dir = fallback_dir.empty() ? fs::temp_directory_path() : fs::path(fallback_dir);
    const fs::path path = dir / "scmoe-default-corpus-v1.txt";
    if (!(fs::is_regular_file(path, ec) && fs::file_size(path, ec) == kGeneratedBytes)) {
        // Written under a private name, then renamed: ranks generating at once all see a whole file.
        const fs::path tmp = dir / ("scmoe-default-corpus-v1.txt." + std::to_string(::getpid()));
        const std::string text = generate_corpus_text(kGeneratedBytes);
        {
            std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
            out.write(text.data(), static_cast<std::streamsize>(text.size()));
            SCMOE_CHECK(out.good(), "cannot write the generated corpus to '" << tmp.string() << "'");
        }
        fs::rename(tmp, path, ec);
        SCMOE_CHECK(!ec, "cannot rename '" << tmp.string() << "' to '" << path.string() << "': " << ec.message());
    }
    corpus.paths.push_back(path.string());
    corpus.description = "default corpus: no license texts in " + license_dir + "; generated " +
                         std::to_string(kGeneratedBytes) + " bytes of English-like text at " + path.string();
    hold_out_last_tenth(kGeneratedBytes);
    return corpus;
}

}  // namespace scmoe::models
