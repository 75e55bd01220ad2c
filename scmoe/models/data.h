// Training data: byte-level tokens (vocab 256, token = byte) streamed from text files, sharded by rank,
// walked in a seeded order that a checkpoint can save and restore exactly.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace scmoe::models {

inline constexpr std::int64_t kByteVocab = 256;

// Why `path` cannot be a data file, found without opening it (opening a FIFO would wait for a
// writer), as a predicate: "is a FIFO (named pipe)", "is a directory", "is a character device", ...,
// "is empty", or "cannot be opened: " and the errno text of a failed stat; empty when it is a
// non-empty regular file.
std::string data_file_problem(const std::string& path);

// One or more files read as one byte stream (their concatenation, in the order given). Files stay open
// and are read with pread on demand: nothing is loaded whole. Throws scmoe::Error naming the path for a
// file that is missing, unreadable or not a regular file (saying what it is: a FIFO, a directory, a
// device; never waiting on a FIFO), or empty; `role` names
// the files in those messages ("data file '...'", "eval data file '...'").
class ByteDataset {
  public:
    explicit ByteDataset(std::vector<std::string> paths, const std::string& role = "data");
    ~ByteDataset();
    ByteDataset(ByteDataset&& other) noexcept;
    ByteDataset& operator=(ByteDataset&& other) noexcept;
    ByteDataset(const ByteDataset&) = delete;
    ByteDataset& operator=(const ByteDataset&) = delete;

    std::int64_t size() const { return end_ - begin_; }  // bytes in the stream (after restrict_to)
    const std::vector<std::string>& paths() const { return paths_; }

    // Narrows the stream to bytes [begin, end) of the files' concatenation: size() and read() then see
    // only those, read offset 0 being byte `begin`. How a held-out split keeps training off its bytes.
    // Throws unless 0 <= begin < end <= the files' total size.
    void restrict_to(std::int64_t begin, std::int64_t end);

    // Copies bytes [offset, offset + count) of the stream into out (count bytes), crossing file
    // boundaries as needed. Throws if the range leaves the stream or a file shrank since it was opened.
    void read(std::int64_t offset, std::int64_t count, std::uint8_t* out) const;

  private:
    std::vector<std::string> paths_;
    std::vector<int> fds_;
    std::vector<std::int64_t> starts_;  // offset of each file's first byte; starts_.back() = total bytes
    std::int64_t begin_ = 0, end_ = 0;  // the stream: bytes [begin_, end_) of the concatenation
    void close_all() noexcept;
};

struct ByteBatcherConfig {
    std::int64_t batch = 8;      // sequences per batch (> 0)
    std::int64_t seq_len = 256;  // tokens per sequence (> 0); each sequence reads seq_len + 1 bytes
    int rank = 0;                // this rank, in [0, world)
    int world = 1;               // ranks sharing the stream (> 0)
    std::uint64_t seed = 0;      // picks the order windows are visited in, per epoch
    bool shuffle = true;         // false: visit the shard's windows in stream order (evaluation, tests)
};

// Where a batcher stands: enough to continue exactly after a restart. num_windows guards against
// resuming on different data, seq_len or world (restore() throws if it differs).
struct ByteBatcherState {
    std::uint64_t seed = 0;
    std::int64_t epoch = 0;        // completed passes over this rank's shard
    std::int64_t position = 0;     // index, in this epoch's order, of the next window
    std::int64_t num_windows = 0;  // windows in this rank's shard
};

// Batches of next-byte prediction windows for one rank.
//
// Windows: window w covers stream bytes [w * seq_len, w * seq_len + seq_len] (seq_len + 1 bytes);
// inputs are its first seq_len bytes, targets its last seq_len. Consecutive windows share one byte, so
// every stream byte after the first is a target of exactly one window; a tail shorter than a full
// window is never used. There are num_windows = (size - 1) / seq_len of them.
//
// Shards: contiguous. Rank r owns windows [W * r / world, W * (r + 1) / world) — its own region of
// the files, disjoint in targets from every other rank's, all ranks together covering every window.
//
// Order: each epoch visits every window of the shard once, in a permutation keyed by (seed, rank,
// epoch) — a Feistel network on the window index with cycle walking, so it needs O(1) memory and is
// identical on every platform (no std::shuffle or std:: distributions). A batch that runs past the end
// of the shard continues with the next epoch. Each batch costs `batch` preads of seq_len + 1 bytes.
class ByteBatcher {
  public:
    // Throws scmoe::Error for batch/seq_len <= 0, world <= 0, rank outside [0, world), a stream shorter
    // than seq_len + 1 bytes, or fewer windows than ranks.
    ByteBatcher(ByteDataset data, const ByteBatcherConfig& config);

    // Fills the next batch: inputs and targets are [batch, seq_len] int32 token ids in [0, 256),
    // targets[b][t] = inputs[b][t + 1] for t < seq_len - 1.
    void next(std::int32_t* inputs, std::int32_t* targets);

    struct Batch {
        std::vector<std::int32_t> inputs, targets;  // [batch, seq_len] each
    };
    Batch next();

    // Stream offset of the first byte of the window that next() will read first (for tests and logs).
    std::int64_t peek_window_offset() const;

    ByteBatcherState state() const;
    // Continues from a state() of a batcher over the same data, seq_len, world and rank; the seed is
    // taken from the state. Throws if the state does not fit this batcher.
    void restore(const ByteBatcherState& state);

    const ByteBatcherConfig& config() const { return config_; }
    const ByteDataset& data() const { return data_; }
    std::int64_t num_windows() const { return num_windows_; }  // this rank's shard
    std::int64_t first_window() const { return first_window_; }

  private:
    ByteDataset data_;
    ByteBatcherConfig config_;
    std::int64_t first_window_ = 0, num_windows_ = 0;
    std::int64_t epoch_ = 0, position_ = 0;
    std::vector<std::uint8_t> bytes_;  // one window's bytes

    std::int64_t window_at(std::int64_t epoch, std::int64_t position) const;
};

// The image of i under a seeded permutation of [0, n): permute_index(., n, key) is a bijection on
// [0, n) for every key. Deterministic across platforms and compilers.
std::int64_t permute_index(std::int64_t i, std::int64_t n, std::uint64_t key);

// Held-out evaluation windows: the stream's windows as ByteBatcher defines them (window w = bytes
// [w * seq_len, w * seq_len + seq_len]; inputs its first seq_len bytes, targets its last seq_len, so
// every byte after the first is a target of exactly one window), the first num_windows() of them in
// stream order, sharded contiguously: rank r evaluates [N * r / world, N * (r + 1) / world). Unlike
// ByteBatcher's, a shard may be empty (fewer windows than ranks).
class EvalWindows {
  public:
    // max_windows <= 0: every window of the stream. Throws scmoe::Error naming the files when the
    // stream is shorter than one window (seq_len + 1 bytes), or for seq_len <= 0 or a bad rank/world.
    EvalWindows(ByteDataset data, std::int64_t seq_len, std::int64_t max_windows, int rank, int world);

    std::int64_t stream_windows() const { return stream_windows_; }  // (size - 1) / seq_len
    std::int64_t num_windows() const { return num_windows_; }        // evaluated, over every rank
    std::int64_t first_window() const { return first_window_; }      // this rank's shard
    std::int64_t shard_windows() const { return shard_windows_; }
    // Passes of at most `batch` windows that cover the largest shard: the same on every rank.
    std::int64_t num_batches(std::int64_t batch) const;
    const ByteDataset& data() const { return data_; }

    // Reads windows [first, first + count) of the stream: inputs and targets [count, seq_len] int32.
    void read(std::int64_t first, std::int64_t count, std::int32_t* inputs, std::int32_t* targets) const;

  private:
    ByteDataset data_;
    std::int64_t seq_len_, world_;
    std::int64_t stream_windows_ = 0, num_windows_ = 0, first_window_ = 0, shard_windows_ = 0;
    mutable std::vector<std::uint8_t> bytes_;  // one window's bytes
};

// The corpus used when no --data is given, so the quickstart needs no download. Its last tenth is
// held out: training reads bytes [0, held_out_begin), --eval-data default bytes [held_out_begin,
// total_bytes), so no training window touches a held-out byte.
struct DefaultCorpus {
    std::vector<std::string> paths;
    std::string description;  // one line for the trainer to print
    std::int64_t total_bytes = 0;
    std::int64_t held_out_begin = 0;  // total_bytes - total_bytes / 10
};

// Prefers the license texts Debian's base-files package installs in every Debian and Ubuntu system
// (Essential: yes), under license_dir: GPL-3, GPL-2, LGPL-2.1, LGPL-3, Apache-2.0, GFDL-1.3, MPL-2.0,
// Artistic, BSD, CC0-1.0 — those present, in that order (about 150 KB on Debian 12). If none is there
// (another distribution), writes a deterministic English-like text of 256 KiB to
// fallback_dir/scmoe-default-corpus-v1.txt (the system temp directory when empty) and uses that.
DefaultCorpus default_corpus(const std::string& license_dir = "/usr/share/common-licenses",
                             const std::string& fallback_dir = "");

// The fallback text: `bytes` bytes of sentences drawn from a fixed word list by a seeded generator.
std::string generate_corpus_text(std::int64_t bytes, std::uint64_t seed = 0);

}  // namespace scmoe::models
