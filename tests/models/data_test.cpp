// The byte-level data reader: exact batches from hand-checkable files, shards, seeded order,
// state/restore, bad input, and the default corpus.
#include "scmoe/models/data.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "scmoe/kernels/error.h"

namespace fs = std::filesystem;
using scmoe::models::ByteBatcher;
using scmoe::models::ByteBatcherConfig;
using scmoe::models::ByteBatcherState;
using scmoe::models::ByteDataset;
using scmoe::models::data_file_problem;

namespace {

// A fresh directory per test, removed afterwards.
class DataTest : public ::testing::Test {
  protected:
    fs::path dir;
    void SetUp() override {
        const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
        dir = fs::temp_directory_path() / ("scmoe_data_test_" + std::to_string(::getpid()) + "_" + info->name());
        fs::remove_all(dir);
        fs::create_directories(dir);
    }
    void TearDown() override { fs::remove_all(dir); }

    // Writes bytes (first + i) % 256 for i in [0, count) to dir/name.
    std::string write_ramp(const std::string& name, int first, int count) {
        const fs::path path = dir / name;
        std::ofstream out(path, std::ios::binary);
        for (int i = 0; i < count; ++i) out.put(static_cast<char>((first + i) % 256));
        return path.string();
    }
};

ByteBatcherConfig make_config(std::int64_t batch, std::int64_t seq_len, std::uint64_t seed = 0, bool shuffle = true,
                              int rank = 0, int world = 1) {
    ByteBatcherConfig c;
    c.batch = batch;
    c.seq_len = seq_len;
    c.seed = seed;
    c.shuffle = shuffle;
    c.rank = rank;
    c.world = world;
    return c;
}

std::string error_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const scmoe::Error& e) {
        return e.what();
    }
    return "(no error)";
}

// Window offsets one rank visits in `count` single-window batches, checking each batch against the stream.
std::vector<std::int64_t> walk(ByteBatcher& batcher, std::int64_t count) {
    std::vector<std::int64_t> offsets;
    for (std::int64_t i = 0; i < count; ++i) {
        const std::int64_t offset = batcher.peek_window_offset();
        offsets.push_back(offset);
        const ByteBatcher::Batch b = batcher.next();
        const std::int64_t seq_len = batcher.config().seq_len;
        std::vector<std::uint8_t> expect(static_cast<std::size_t>(seq_len + 1));
        batcher.data().read(offset, seq_len + 1, expect.data());
        for (std::int64_t t = 0; t < seq_len; ++t) {
            EXPECT_EQ(b.inputs[static_cast<std::size_t>(t)], expect[static_cast<std::size_t>(t)]);
            EXPECT_EQ(b.targets[static_cast<std::size_t>(t)], expect[static_cast<std::size_t>(t + 1)]);
        }
    }
    return offsets;
}

}  // namespace

TEST_F(DataTest, ReadSpansFiles) {
    ByteDataset data({write_ramp("a", 0, 100), write_ramp("b", 100, 50), write_ramp("c", 150, 3)});
    EXPECT_EQ(data.size(), 153);
    std::vector<std::uint8_t> out(63);
    data.read(90, 63, out.data());
    for (int i = 0; i < 63; ++i) EXPECT_EQ(out[static_cast<std::size_t>(i)], 90 + i);
    data.read(153, 0, out.data());  // empty read at the end is fine
    EXPECT_NE(error_of([&] { data.read(150, 4, out.data()); }).find("outside the stream"), std::string::npos);
}

TEST_F(DataTest, ExactSequentialBatches) {
    // 1024 bytes: 0..255 four times. seq_len 8: window w starts at 8w; 127 windows.
    ByteBatcher batcher(ByteDataset({write_ramp("ramp", 0, 1024)}), make_config(3, 8, 0, /*shuffle=*/false));
    EXPECT_EQ(batcher.num_windows(), 127);
    for (int step = 0; step < 50; ++step) {  // 150 windows: wraps into epoch 1
        const ByteBatcher::Batch b = batcher.next();
        ASSERT_EQ(b.inputs.size(), 24u);
        for (int row = 0; row < 3; ++row) {
            const int window = (step * 3 + row) % 127;
            for (int t = 0; t < 8; ++t) {
                const auto i = static_cast<std::size_t>(row * 8 + t);
                EXPECT_EQ(b.inputs[i], (window * 8 + t) % 256) << "step " << step << " row " << row;
                EXPECT_EQ(b.targets[i], (window * 8 + t + 1) % 256) << "step " << step << " row " << row;
            }
        }
    }
    EXPECT_EQ(batcher.state().epoch, 1);
    EXPECT_EQ(batcher.state().position, 150 - 127);
}

TEST_F(DataTest, WindowAcrossFileBoundaryAndEpochWrap) {
    // Stream 0..19 from two files; seq_len 4 -> windows at 0, 4, 8, 12; window 8 spans the boundary.
    ByteBatcher batcher(ByteDataset({write_ramp("a", 0, 10), write_ramp("b", 10, 10)}),
                        make_config(5, 4, 0, /*shuffle=*/false));
    const ByteBatcher::Batch b = batcher.next();
    const std::vector<std::int32_t> inputs = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3};
    const std::vector<std::int32_t> targets = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 1, 2, 3, 4};
    EXPECT_EQ(b.inputs, inputs);
    EXPECT_EQ(b.targets, targets);
    const ByteBatcherState s = batcher.state();
    EXPECT_EQ(s.epoch, 1);
    EXPECT_EQ(s.position, 1);
}

TEST(DataPermutation, IsABijectionForEveryKey) {
    for (std::int64_t n = 1; n <= 300; ++n) {
        for (std::uint64_t key : {0ull, 1ull, 0xdeadbeefull}) {
            std::vector<int> seen(static_cast<std::size_t>(n), 0);
            for (std::int64_t i = 0; i < n; ++i)
                ++seen[static_cast<std::size_t>(scmoe::models::permute_index(i, n, key))];
            for (int count : seen) ASSERT_EQ(count, 1) << "n " << n << " key " << key;
        }
    }
    // Keys give different orders, and the order is not the identity.
    int same = 0, identity = 0;
    for (std::int64_t i = 0; i < 1000; ++i) {
        same += scmoe::models::permute_index(i, 1000, 1) == scmoe::models::permute_index(i, 1000, 2);
        identity += scmoe::models::permute_index(i, 1000, 1) == i;
    }
    EXPECT_LT(same, 50);
    EXPECT_LT(identity, 50);
}

TEST_F(DataTest, RankShardsAreDisjointAndCoverTheStream) {
    const std::string path = write_ramp("ramp", 0, 1001);  // seq_len 10 -> 100 windows
    for (int world : {1, 3, 4, 7}) {
        std::set<std::int64_t> all;
        std::int64_t sum = 0;
        for (int rank = 0; rank < world; ++rank) {
            ByteBatcher batcher(ByteDataset({path}), make_config(1, 10, 42, true, rank, world));
            const std::int64_t n = batcher.num_windows();
            sum += n;
            EXPECT_LE(std::abs(n - 100 / world), 1);
            const std::vector<std::int64_t> offsets = walk(batcher, n);  // one epoch: each window once
            const std::set<std::int64_t> mine(offsets.begin(), offsets.end());
            EXPECT_EQ(static_cast<std::int64_t>(mine.size()), n) << "rank " << rank;
            for (std::int64_t off : mine) {
                EXPECT_GE(off / 10, batcher.first_window());  // contiguous: its own region
                EXPECT_LT(off / 10, batcher.first_window() + n);
                EXPECT_TRUE(all.insert(off).second) << "window " << off / 10 << " on two ranks";
            }
        }
        EXPECT_EQ(sum, 100);
        EXPECT_EQ(static_cast<std::int64_t>(all.size()), 100) << "world " << world;
    }
}

TEST_F(DataTest, SeedDeterminesTheOrder) {
    const std::string path = write_ramp("ramp", 7, 5000);
    auto run = [&](std::uint64_t seed) {
        ByteBatcher batcher(ByteDataset({path}), make_config(4, 16, seed));
        std::vector<std::int32_t> tokens;
        for (int i = 0; i < 200; ++i) {  // 800 windows: past the 312-window epoch twice
            const ByteBatcher::Batch b = batcher.next();
            tokens.insert(tokens.end(), b.inputs.begin(), b.inputs.end());
        }
        return tokens;
    };
    EXPECT_EQ(run(5), run(5));
    EXPECT_NE(run(5), run(6));
    // Successive epochs use different orders.
    ByteBatcher batcher(ByteDataset({path}), make_config(1, 16, 5));
    const std::vector<std::int64_t> first = walk(batcher, batcher.num_windows());
    const std::vector<std::int64_t> second = walk(batcher, batcher.num_windows());
    EXPECT_NE(first, second);
    EXPECT_EQ(std::set<std::int64_t>(first.begin(), first.end()), std::set<std::int64_t>(second.begin(), second.end()));
}

TEST_F(DataTest, RestoreContinuesExactlyAcrossAnEpochBoundary) {
    const std::string path = write_ramp("ramp", 3, 777);                           // seq_len 8 -> 97 windows; batch 5
    ByteBatcher original(ByteDataset({path}), make_config(5, 8, 11, true, 1, 2));  // 49 windows on rank 1
    for (int i = 0; i < 8; ++i) original.next();  // 40 windows in; the next batches cross into epoch 1
    const ByteBatcherState saved = original.state();
    EXPECT_EQ(saved.epoch, 0);
    EXPECT_EQ(saved.position, 40);
    std::vector<ByteBatcher::Batch> expected;
    for (int i = 0; i < 30; ++i) expected.push_back(original.next());  // through epochs 1 and 2
    EXPECT_GE(original.state().epoch, 3);

    // A fresh batcher with another seed takes the saved one.
    ByteBatcher resumed(ByteDataset({path}), make_config(5, 8, 999, true, 1, 2));
    resumed.restore(saved);
    EXPECT_EQ(resumed.state().seed, 11u);
    for (int i = 0; i < 30; ++i) {
        const ByteBatcher::Batch b = resumed.next();
        ASSERT_EQ(b.inputs, expected[static_cast<std::size_t>(i)].inputs) << "batch " << i;
        ASSERT_EQ(b.targets, expected[static_cast<std::size_t>(i)].targets) << "batch " << i;
    }

    // A state from another shard layout, or out of range, is refused.
    ByteBatcher other_world(ByteDataset({path}), make_config(5, 8, 11, true, 0, 3));
    EXPECT_NE(error_of([&] { other_world.restore(saved); }).find("different data"), std::string::npos);
    ByteBatcherState bad = saved;
    bad.position = saved.num_windows;
    EXPECT_NE(error_of([&] { resumed.restore(bad); }).find("out of range"), std::string::npos);
    // The last countable epoch (a corrupt state, found by the data fuzzer in CI as a signed overflow):
    // the batch at the epoch's end is refused, not wrapped.
    bad = saved;
    bad.epoch = std::numeric_limits<std::int64_t>::max();
    bad.position = saved.num_windows - 1;
    resumed.restore(bad);
    EXPECT_NE(error_of([&] { resumed.next(); }).find("cannot be counted past"), std::string::npos);
}

TEST_F(DataTest, BadInput) {
    const std::string missing = (dir / "no_such_file.txt").string();
    std::string e = error_of([&] { ByteDataset d({write_ramp("ok", 0, 10), missing}); });
    EXPECT_NE(e.find(missing), std::string::npos) << e;
    EXPECT_NE(e.find("No such file or directory"), std::string::npos) << e;

    const std::string empty = write_ramp("empty", 0, 0);
    e = error_of([&] { ByteDataset d({empty}); });
    EXPECT_NE(e.find(empty), std::string::npos) << e;
    EXPECT_NE(e.find("is empty"), std::string::npos) << e;

    e = error_of([&] { ByteDataset d({dir.string()}); });
    EXPECT_NE(e.find("is a directory, not a regular file"), std::string::npos) << e;
    EXPECT_EQ(data_file_problem(dir.string()), "is a directory");
    // A FIFO is refused at once, never waited on (opening it for reading would block until a writer
    // comes; issue 26: --data on a FIFO hung forever).
    const std::string fifo = (dir / "fifo").string();
    ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
    e = error_of([&] { ByteDataset d({fifo}); });
    EXPECT_NE(e.find("'" + fifo + "' is a FIFO (named pipe), not a regular file"), std::string::npos) << e;
    EXPECT_EQ(data_file_problem(fifo), "is a FIFO (named pipe)");
    e = error_of([&] { ByteDataset d({"/dev/null"}, "eval data"); });
    EXPECT_NE(e.find("eval data file '/dev/null' is a character device"), std::string::npos) << e;
    EXPECT_EQ(data_file_problem(missing), "cannot be opened: No such file or directory");
    EXPECT_EQ(data_file_problem(empty), "is empty");
    EXPECT_EQ(data_file_problem(write_ramp("fine", 0, 4)), "");
    EXPECT_NE(error_of([&] { ByteDataset d(std::vector<std::string>{}); }).find("no data files"), std::string::npos);

    const std::string path = write_ramp("short", 0, 16);
    auto batcher_error = [&](const ByteBatcherConfig& c) {
        return error_of([&] { ByteBatcher b(ByteDataset({path}), c); });
    };
    EXPECT_NE(batcher_error(make_config(1, 16)).find("shorter than one sequence"), std::string::npos);
    EXPECT_EQ(batcher_error(make_config(1, 15)), "(no error)");  // exactly seq_len + 1 bytes
    EXPECT_NE(batcher_error(make_config(1, 8, 0, true, 0, 2)).find("fewer than the 2 ranks"), std::string::npos);
    EXPECT_NE(batcher_error(make_config(0, 4)).find("batch must be positive"), std::string::npos);
    EXPECT_NE(batcher_error(make_config(-1, 4)).find("batch must be positive"), std::string::npos);
    EXPECT_NE(batcher_error(make_config(1, 0)).find("seq_len must be positive"), std::string::npos);
    EXPECT_NE(batcher_error(make_config(1, -3)).find("seq_len must be positive"), std::string::npos);
    EXPECT_NE(batcher_error(make_config(1, 4, 0, true, 0, 0)).find("world must be positive"), std::string::npos);
    EXPECT_NE(batcher_error(make_config(1, 4, 0, true, 2, 2)).find("rank 2 outside"), std::string::npos);
    EXPECT_NE(batcher_error(make_config(1, 4, 0, true, -1, 2)).find("rank -1 outside"), std::string::npos);
}

TEST_F(DataTest, DefaultCorpusIsReadableAndLarge) {
    const scmoe::models::DefaultCorpus corpus = scmoe::models::default_corpus();
    ASSERT_FALSE(corpus.paths.empty());
    EXPECT_FALSE(corpus.description.empty());
    ByteBatcher batcher(ByteDataset(corpus.paths), make_config(8, 128, 1));
    EXPECT_GT(batcher.data().size(), 10 * 1024);
    const ByteBatcher::Batch b = batcher.next();
    for (std::int32_t token : b.inputs) EXPECT_TRUE(token >= 0 && token < scmoe::models::kByteVocab);
}

TEST_F(DataTest, GeneratedFallbackCorpus) {
    const scmoe::models::DefaultCorpus corpus =
        scmoe::models::default_corpus((dir / "no_licenses_here").string(), dir.string());
    ASSERT_EQ(corpus.paths.size(), 1u);
    EXPECT_NE(corpus.description.find("generated"), std::string::npos);
    ByteDataset data(corpus.paths);
    EXPECT_EQ(data.size(), 256 * 1024);
    // Deterministic, English-like: letters, spaces and punctuation only.
    const std::string text = scmoe::models::generate_corpus_text(256 * 1024);
    EXPECT_EQ(text, scmoe::models::generate_corpus_text(256 * 1024));
    std::vector<std::uint8_t> bytes(text.size());
    data.read(0, data.size(), bytes.data());
    EXPECT_EQ(std::string(bytes.begin(), bytes.end()), text);
    for (char ch : text) EXPECT_TRUE(std::isalpha(static_cast<unsigned char>(ch)) || std::strchr(" ,.?\n", ch));
    // A second call reuses the file.
    EXPECT_EQ(scmoe::models::default_corpus((dir / "no_licenses_here").string(), dir.string()).paths, corpus.paths);
}

// Found by tests/fuzz/data_fuzz (corpus/data/regression-read-range-overflow.bin): ByteDataset::read
// computed offset + count, which overflows for large arguments. The fuzzer's input was offset
// -4374882000130015232, count -9217951078113326015 (the overflow was in the error message, UBSan);
// a large count at a valid offset wrapped the sum negative, passed the range check and read past
// the stream and the caller's buffer.
TEST_F(DataTest, ReadRangeThatOverflowsIsRefused) {
    const ByteDataset d({write_ramp("ten", 0, 10)});
    std::vector<std::uint8_t> out(10);
    constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
    EXPECT_THROW(d.read(-4374882000130015232, -9217951078113326015, out.data()), scmoe::Error);
    EXPECT_THROW(d.read(2, kMax, out.data()), scmoe::Error);
    EXPECT_THROW(d.read(kMax, 1, out.data()), scmoe::Error);
    EXPECT_NE(error_of([&] { d.read(2, kMax, out.data()); }).find("outside the stream of 10 bytes"), std::string::npos);
    d.read(2, 8, out.data());  // the last 8 bytes still read
    EXPECT_EQ(out[0], 2);
    EXPECT_EQ(out[7], 9);
}

// Found by tests/fuzz/data_fuzz (corpus/data/regression-permute-huge-n.bin): for n > 2^62 the search
// for the Feistel domain shifted 1 by 64 bits (undefined; on x86 it never ended). Every n > 0 must
// give an index in [0, n).
TEST(DataPermutation, HandlesTheLargestDomains) {
    constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
    for (const std::int64_t n : {(std::int64_t{1} << 62) + 1, kMax - 1, kMax}) {
        for (const std::int64_t i : {std::int64_t{0}, n / 2, n - 1}) {
            for (const std::uint64_t key : {0ull, 0x5c3eull, ~0ull}) {
                const std::int64_t p = scmoe::models::permute_index(i, n, key);
                EXPECT_GE(p, 0) << "i " << i << " n " << n;
                EXPECT_LT(p, n) << "i " << i << " n " << n;
            }
        }
    }
    EXPECT_THROW(scmoe::models::permute_index(0, 0, 1), scmoe::Error);
    EXPECT_THROW(scmoe::models::permute_index(-1, kMax, 1), scmoe::Error);
}

// Found by tests/fuzz/data_fuzz (corpus/data/regression-eval-read-range-overflow.bin): EvalWindows::read
// computed first + count (UBSan: -6908486506036322272 + -6908428033697243104 in the range message);
// a large count from a valid first window wrapped negative, passed the check and read past the
// caller's buffers. num_batches rounded up with batch - 1 added, overflowing for the largest batches.
TEST_F(DataTest, EvalWindowRangesThatOverflowAreRefused) {
    using scmoe::models::EvalWindows;
    const EvalWindows windows(ByteDataset({write_ramp("eval", 0, 33)}), 8, 0, 0, 1);  // 4 windows
    ASSERT_EQ(windows.stream_windows(), 4);
    std::vector<std::int32_t> inputs(4 * 8), targets(4 * 8);
    constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
    EXPECT_THROW(windows.read(-6908486506036322272, -6908428033697243104, inputs.data(), targets.data()),
                 scmoe::Error);
    EXPECT_THROW(windows.read(1, kMax, inputs.data(), targets.data()), scmoe::Error);
    EXPECT_THROW(windows.read(kMax, 1, inputs.data(), targets.data()), scmoe::Error);
    windows.read(1, 3, inputs.data(), targets.data());  // the last three windows still read
    EXPECT_EQ(inputs[0], 8);
    EXPECT_EQ(targets[3 * 8 - 1], 32);
    EXPECT_EQ(windows.num_batches(kMax), 1);
    EXPECT_EQ(windows.num_batches(3), 2);
}

// Found by tests/fuzz/data_fuzz (corpus/data/regression-seq-len-max.bin): the length checks computed
// seq_len + 1, overflowing for the largest seq_len (UBSan: "9223372036854775807 + 1" in EvalWindows;
// ByteBatcher had the same check). Unsanitized, the messages named the wrapped sum
// -9223372036854775808, and whether the check held was up to the optimizer.
TEST_F(DataTest, LargestSeqLenIsRefused) {
    const std::string path = write_ramp("short", 0, 16);
    constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
    const std::string e = error_of([&] { scmoe::models::EvalWindows w(ByteDataset({path}), kMax, 0, 0, 1); });
    EXPECT_NE(e.find("is shorter than one window of seq + 1 = 9223372036854775807 + 1 bytes"), std::string::npos) << e;
    const std::string batcher_error = error_of([&] { ByteBatcher b(ByteDataset({path}), make_config(1, kMax)); });
    EXPECT_NE(batcher_error.find("shorter than one sequence of seq_len + 1 = 9223372036854775807 + 1 bytes"),
              std::string::npos)
        << batcher_error;  // not the wrapped sum -9223372036854775808
    EXPECT_EQ(error_of([&] { ByteBatcher b(ByteDataset({path}), make_config(1, 15)); }), "(no error)");
}
