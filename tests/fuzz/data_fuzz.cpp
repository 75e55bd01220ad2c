// Fuzzes the data reader (scmoe/models/data.h): ByteDataset over 1-3 files of fuzzed content, ByteBatcher
// and EvalWindows with fuzzed (unbounded) configurations, positions and restored states, and
// permute_index. Bad arguments must throw scmoe::Error; what is accepted must keep the documented
// properties: tokens are bytes, targets are the inputs shifted by one, permute_index is in range.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "scmoe/kernels/error.h"
#include "scmoe/models/data.h"
#include "tests/fuzz/fuzz_util.h"

namespace models = scmoe::models;
using scmoe::fuzz::property_failed;

namespace {

// Most int32 tokens one batch buffer may hold (the harness's own allocation bound).
constexpr std::int64_t kMaxTokens = 1 << 16;

std::int64_t tokens_of(std::int64_t rows, std::int64_t seq_len) {
    std::int64_t n = 0;
    if (rows < 0 || seq_len < 0 || __builtin_mul_overflow(rows, seq_len, &n) || n > kMaxTokens) return -1;
    return n;
}

// An int64 that is small most of the time and anything at all otherwise.
std::int64_t consume_count(FuzzedDataProvider& in) {
    return in.ConsumeBool() ? in.ConsumeIntegralInRange<std::int64_t>(-2, 64) : in.ConsumeIntegral<std::int64_t>();
}
int consume_rank(FuzzedDataProvider& in) {
    return in.ConsumeBool() ? in.ConsumeIntegralInRange<int>(-1, 5) : in.ConsumeIntegral<int>();
}

void check_windows(const std::vector<std::int32_t>& inputs, const std::vector<std::int32_t>& targets, std::int64_t rows,
                   std::int64_t seq_len) {
    for (std::int64_t r = 0; r < rows; ++r) {
        for (std::int64_t t = 0; t < seq_len; ++t) {
            const auto i = static_cast<std::size_t>(r * seq_len + t);
            if (inputs[i] < 0 || inputs[i] > 255 || targets[i] < 0 || targets[i] > 255)
                property_failed("a token outside [0, 256)");
            if (t + 1 < seq_len && targets[i] != inputs[i + 1])
                property_failed("targets are not inputs shifted by one");
        }
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    static const scmoe::fuzz::ScratchFile files[3] = {
        scmoe::fuzz::ScratchFile("data0"), scmoe::fuzz::ScratchFile("data1"), scmoe::fuzz::ScratchFile("data2")};
    FuzzedDataProvider in(data, size);
    const int num_files = in.ConsumeIntegralInRange<int>(1, 3);
    std::vector<std::string> paths;
    for (int f = 0; f < num_files; ++f) {
        const std::string bytes = f + 1 < num_files ? in.ConsumeRandomLengthString(4096) : "";
        paths.push_back(files[f].path());
        files[f].write(bytes);
    }
    // The last file takes what the configuration below leaves; written after it is decoded.
    const std::int64_t restrict_begin = consume_count(in), restrict_end = consume_count(in);
    const bool restrict = in.ConsumeBool();
    const std::int64_t read_offset = consume_count(in), read_count = consume_count(in);
    models::ByteBatcherConfig bc;
    bc.batch = consume_count(in);
    bc.seq_len = consume_count(in);
    bc.rank = consume_rank(in);
    bc.world = consume_rank(in);
    bc.seed = in.ConsumeIntegral<std::uint64_t>();
    bc.shuffle = in.ConsumeBool();
    const int num_next = in.ConsumeIntegralInRange<int>(0, 4);
    models::ByteBatcherState restored;
    restored.seed = in.ConsumeIntegral<std::uint64_t>();
    restored.epoch =
        in.ConsumeBool() ? in.ConsumeIntegralInRange<std::int64_t>(0, 3) : in.ConsumeIntegral<std::int64_t>();
    restored.position = consume_count(in);
    const bool restore_exact_windows = in.ConsumeBool();
    restored.num_windows = consume_count(in);
    const std::int64_t eval_seq = consume_count(in), eval_max = consume_count(in);
    const int eval_rank = consume_rank(in), eval_world = consume_rank(in);
    const std::int64_t eval_batch = consume_count(in), eval_first = consume_count(in), eval_count = consume_count(in);
    const std::int64_t perm_i = in.ConsumeIntegral<std::int64_t>(), perm_n = in.ConsumeIntegral<std::int64_t>();
    const std::uint64_t perm_key = in.ConsumeIntegral<std::uint64_t>();
    files[num_files - 1].write(in.ConsumeRemainingBytesAsString());

    try {
        const std::int64_t i = models::permute_index(perm_i, perm_n, perm_key);
        if (i < 0 || i >= perm_n) property_failed("permute_index left [0, n)");
    } catch (const scmoe::Error&) {
    }

    try {
        models::ByteDataset ds(paths);
        if (restrict) ds.restrict_to(restrict_begin, restrict_end);
        std::vector<std::uint8_t> buf(static_cast<std::size_t>(ds.size()));
        ds.read(read_offset, read_count, buf.data());
    } catch (const scmoe::Error&) {
    }

    try {
        models::ByteDataset ds(paths);
        if (restrict) ds.restrict_to(restrict_begin, restrict_end);
        models::ByteBatcher batcher(std::move(ds), bc);
        const std::int64_t tokens = tokens_of(bc.batch, bc.seq_len);
        std::vector<std::int32_t> inputs(static_cast<std::size_t>(std::max<std::int64_t>(tokens, 0)));
        std::vector<std::int32_t> targets(inputs.size());
        (void)batcher.peek_window_offset();
        for (int k = 0; k < num_next && tokens >= 0; ++k) {
            batcher.next(inputs.data(), targets.data());
            check_windows(inputs, targets, bc.batch, bc.seq_len);
        }
        const models::ByteBatcherState saved = batcher.state();
        if (restore_exact_windows) restored.num_windows = batcher.num_windows();
        try {
            batcher.restore(restored);
        } catch (const scmoe::Error&) {
            batcher.restore(saved);
        }
        for (int k = 0; k < num_next && tokens >= 0; ++k) {
            batcher.next(inputs.data(), targets.data());
            check_windows(inputs, targets, bc.batch, bc.seq_len);
        }
    } catch (const scmoe::Error&) {
    }

    try {
        models::ByteDataset ds(paths, "eval data");
        if (restrict) ds.restrict_to(restrict_begin, restrict_end);
        models::EvalWindows windows(std::move(ds), eval_seq, eval_max, eval_rank, eval_world);
        if (windows.num_windows() < 0 || windows.num_windows() > windows.stream_windows() ||
            windows.first_window() < 0 || windows.shard_windows() < 0 ||
            windows.first_window() + windows.shard_windows() > windows.num_windows())
            property_failed("EvalWindows' shard lies outside its windows");
        try {
            if (windows.num_batches(eval_batch) < 0) property_failed("negative num_batches");
        } catch (const scmoe::Error&) {
        }
        const std::int64_t tokens = tokens_of(windows.stream_windows(), eval_seq);
        if (tokens >= 0) {
            std::vector<std::int32_t> inputs(static_cast<std::size_t>(tokens)), targets(inputs.size());
            // Reads that fit the stream fit these buffers; others must throw before writing.
            windows.read(eval_first, eval_count, inputs.data(), targets.data());
            check_windows(inputs, targets, eval_count, eval_seq);
        }
    } catch (const scmoe::Error&) {
    }
    return 0;
}
