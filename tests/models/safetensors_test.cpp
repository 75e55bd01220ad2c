// safetensors checkpoint files: round trips, the exact bytes of a tiny file, atomic writes, and
// refusal of corrupted files with a message naming what is wrong.
#include "scmoe/models/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "scmoe/kernels/error.h"

namespace scmoe {
namespace {

namespace fs = std::filesystem;

class SafetensorsTest : public ::testing::Test {
  protected:
    void SetUp() override {
        const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
        dir_ = fs::temp_directory_path() / ("scmoe_safetensors_" + std::to_string(::getpid()) + "_" + info->name());
        fs::remove_all(dir_);
        fs::create_directories(dir_);
    }
    void TearDown() override { fs::remove_all(dir_); }

    std::string path(const std::string& name) const { return (dir_ / name).string(); }

    std::vector<std::string> dir_entries() const {
        std::vector<std::string> names;
        for (const auto& e : fs::directory_iterator(dir_)) names.push_back(e.path().filename().string());
        std::sort(names.begin(), names.end());
        return names;
    }

    fs::path dir_;
};

std::vector<std::uint8_t> file_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void put_bytes(const std::string& path, const std::vector<std::uint8_t>& bytes) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// A file with the given header text and `data_bytes` zero bytes of data; `header_length` overrides the
// length field.
void put_raw(const std::string& path, const std::string& header, std::size_t data_bytes,
             std::uint64_t header_length = UINT64_MAX) {
    std::vector<std::uint8_t> bytes(8);
    const std::uint64_t n = header_length == UINT64_MAX ? header.size() : header_length;
    std::memcpy(bytes.data(), &n, 8);
    bytes.insert(bytes.end(), header.begin(), header.end());
    bytes.resize(bytes.size() + data_bytes, 0);
    put_bytes(path, bytes);
}

// The message read_safetensors() throws, or "" when it does not throw.
std::string read_error(const std::string& path) {
    try {
        read_safetensors(path);
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

template <class T>
std::vector<std::uint8_t> as_bytes(const std::vector<T>& v) {
    std::vector<std::uint8_t> b(v.size() * sizeof(T));
    if (!b.empty()) std::memcpy(b.data(), v.data(), b.size());
    return b;
}

TEST_F(SafetensorsTest, RoundTripsDTypesShapesAndMetadata) {
    std::vector<float> f32(12);
    for (std::size_t i = 0; i < f32.size(); ++i) f32[i] = static_cast<float>(i) * 0.25f - 3.0f;
    std::vector<std::uint16_t> bf16{0x3F80, 0xC000, 0x0000, 0x7F80, 0x3E80, 0xBF00, 0x4040, 0x0001, 0xFFFF, 0x4000};
    std::vector<std::int32_t> i32{-7, 0, 1, 2147483647, -2147483647 - 1, 42, 5};
    std::vector<std::int64_t> i64{-1, 1LL << 40, 3, -(1LL << 62)};
    std::vector<std::uint8_t> u8{0, 1, 127, 128, 255};
    std::vector<double> f64{3.141592653589793};
    const std::vector<SafetensorsTensor> tensors{
        {"layers.0.expert_w1", SafetensorsDType::kF32, {3, 4}, f32.data()},
        {"layers.0.gate_w", SafetensorsDType::kBF16, {2, 5}, bf16.data()},
        {"tokens", SafetensorsDType::kI32, {7}, i32.data()},
        {"counts", SafetensorsDType::kI64, {2, 2}, i64.data()},
        {"mask", SafetensorsDType::kU8, {5}, u8.data()},
        {"scale", SafetensorsDType::kF64, {}, f64.data()},
        {"empty", SafetensorsDType::kF32, {0, 3}, nullptr},
    };
    const std::map<std::string, std::string> metadata{
        {"config", R"({"hidden": 64, "experts": 8, "note": "quotes \" and unicode é"})"}, {"step", "100"}};
    write_safetensors(path("ckpt.safetensors"), tensors, metadata);

    const SafetensorsFile file = read_safetensors(path("ckpt.safetensors"));
    EXPECT_EQ(file.metadata, metadata);
    ASSERT_EQ(file.tensors.size(), tensors.size());
    const std::vector<std::vector<std::uint8_t>> expected_bytes{
        as_bytes(f32), as_bytes(bf16), as_bytes(i32), as_bytes(i64), u8, as_bytes(f64), {}};
    for (std::size_t i = 0; i < tensors.size(); ++i) {
        SCOPED_TRACE(tensors[i].name);
        ASSERT_TRUE(file.tensors.contains(tensors[i].name));
        const SafetensorsFile::Entry& e = file.tensors.at(tensors[i].name);
        EXPECT_EQ(e.dtype, tensors[i].dtype);
        EXPECT_EQ(e.shape, tensors[i].shape);
        EXPECT_EQ(e.bytes, expected_bytes[i]);
    }
    EXPECT_EQ(file.tensors.at("scale").numel(), 1);
    EXPECT_EQ(file.tensors.at("empty").numel(), 0);
    EXPECT_EQ(dir_entries(), std::vector<std::string>{"ckpt.safetensors"});

    // The data section starts 8-byte aligned and every tensor at a multiple of its element size.
    const std::vector<std::uint8_t> raw = file_bytes(path("ckpt.safetensors"));
    std::uint64_t header_size = 0;
    std::memcpy(&header_size, raw.data(), 8);
    EXPECT_EQ(header_size % 8, 0u);
}

TEST_F(SafetensorsTest, EmptyFileRoundTrips) {
    write_safetensors(path("empty.safetensors"), {}, {});
    const SafetensorsFile file = read_safetensors(path("empty.safetensors"));
    EXPECT_TRUE(file.tensors.empty());
    EXPECT_TRUE(file.metadata.empty());
}

TEST_F(SafetensorsTest, TinyFileHasExactlyTheExpectedBytes) {
    const std::vector<float> a{1.0f, -2.0f};
    write_safetensors(path("tiny.safetensors"), {{"a", SafetensorsDType::kF32, {2}, a.data()}}, {{"step", "17"}});
    // CRC-32 of 00 00 80 3f 00 00 00 c0 is 0xc3872656 (Python: zlib.crc32(struct.pack('<2f', 1, -2))).
    // The JSON is 113 bytes; 7 spaces pad the header to 120 = 0x78.
    const std::string header =
        R"({"__metadata__":{"scmoe.data_crc32":"c3872656","step":"17"},"a":{"data_offsets":[0,8],"dtype":"F32","shape":[2]}})"
        "       ";
    std::vector<std::uint8_t> expected{0x78, 0, 0, 0, 0, 0, 0, 0};
    expected.insert(expected.end(), header.begin(), header.end());
    expected.insert(expected.end(), {0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0xc0});
    ASSERT_EQ(header.size(), 120u);
    EXPECT_EQ(file_bytes(path("tiny.safetensors")), expected);
}

TEST_F(SafetensorsTest, Crc32MatchesZlib) {
    EXPECT_EQ(crc32_update(0, "123456789", 9), 0xCBF43926u);
    EXPECT_EQ(crc32_update(0, nullptr, 0), 0u);
    // Incremental updates over odd splits equal one pass (the 8-byte fast path and the byte tail agree).
    std::vector<std::uint8_t> data(1000);
    for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::uint8_t>(i * 131 + 7);
    const std::uint32_t whole = crc32_update(0, data.data(), data.size());
    EXPECT_EQ(crc32_update(crc32_update(0, data.data(), 13), data.data() + 13, data.size() - 13), whole);
}

TEST_F(SafetensorsTest, OverwriteReplacesTheFileAndLeavesNoTempFile) {
    const std::vector<float> one{1.0f}, two{2.0f};
    write_safetensors(path("c.safetensors"), {{"w", SafetensorsDType::kF32, {1}, one.data()}}, {{"step", "1"}});
    write_safetensors(path("c.safetensors"), {{"w", SafetensorsDType::kF32, {1}, two.data()}}, {{"step", "2"}});
    const SafetensorsFile file = read_safetensors(path("c.safetensors"));
    EXPECT_EQ(file.metadata.at("step"), "2");
    EXPECT_EQ(file.tensors.at("w").bytes, as_bytes(two));
    EXPECT_EQ(dir_entries(), std::vector<std::string>{"c.safetensors"});
}

TEST_F(SafetensorsTest, InvalidTensorsAreRefusedBeforeTheExistingFileIsTouched) {
    const std::vector<float> good{1.0f, 2.0f};
    const std::string p = path("c.safetensors");
    write_safetensors(p, {{"w", SafetensorsDType::kF32, {2}, good.data()}}, {{"step", "1"}});
    const std::vector<std::uint8_t> before = file_bytes(p);

    auto error_of = [&](const std::vector<SafetensorsTensor>& tensors, const std::map<std::string, std::string>& meta) {
        try {
            write_safetensors(p, tensors, meta);
        } catch (const Error& e) {
            return std::string(e.what());
        }
        return std::string();
    };
    EXPECT_NE(error_of({{"w", SafetensorsDType::kF32, {2}, nullptr}}, {}).find("data is null"), std::string::npos);
    EXPECT_NE(error_of({{"w", SafetensorsDType::kF32, {-1}, good.data()}}, {}).find("negative dimension"),
              std::string::npos);
    EXPECT_NE(
        error_of({{"w", SafetensorsDType::kF32, {1}, good.data()}, {"w", SafetensorsDType::kF32, {1}, good.data()}}, {})
            .find("appears twice"),
        std::string::npos);
    EXPECT_NE(error_of({{"__metadata__", SafetensorsDType::kF32, {1}, good.data()}}, {}).find("reserved"),
              std::string::npos);
    EXPECT_NE(error_of({}, {{kSafetensorsCrcKey, "0"}}).find("reserved"), std::string::npos);
    EXPECT_NE(error_of({}, {{"bad utf-8", "\xff\xfe"}}).find("building the header"), std::string::npos);

    EXPECT_EQ(file_bytes(p), before);
    EXPECT_EQ(dir_entries(), std::vector<std::string>{"c.safetensors"});
}

TEST_F(SafetensorsTest, FailedRenameRemovesTheTempFile) {
    // The target is a directory: the temp file is written and synced, then rename() fails.
    fs::create_directory(path("target"));
    const std::vector<float> w{1.0f};
    try {
        write_safetensors(path("target"), {{"w", SafetensorsDType::kF32, {1}, w.data()}}, {});
        ADD_FAILURE() << "renaming a file over a directory succeeded";
    } catch (const Error& e) {
        const std::string message = e.what();
        EXPECT_NE(message.find(path("target") + ": rename from " + path("target") + ".tmp."), std::string::npos)
            << message;
        EXPECT_NE(message.find("directory"), std::string::npos) << message;  // EISDIR's text
    }
    EXPECT_EQ(dir_entries(), std::vector<std::string>{"target"});
}

TEST_F(SafetensorsTest, MissingDirectoryIsReportedWithTheFailingCall) {
    const std::vector<float> w{1.0f};
    const std::string p = path("missing/c.safetensors");
    try {
        write_safetensors(p, {{"w", SafetensorsDType::kF32, {1}, w.data()}}, {});
        ADD_FAILURE() << "wrote into a missing directory";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(p + ".tmp." + std::to_string(::getpid()) + ": open: No such file"),
                  std::string::npos)
            << e.what();
    }
}

TEST_F(SafetensorsTest, ReadOnlyDirectoryKeepsTheExistingFile) {
    // Only meaningful when permissions apply to us (CI runs as root).
    if (::geteuid() == 0) GTEST_SKIP() << "running as root: a read-only directory is still writable";
    const std::vector<float> w{1.0f};
    write_safetensors(path("c.safetensors"), {{"w", SafetensorsDType::kF32, {1}, w.data()}}, {{"step", "1"}});
    const std::vector<std::uint8_t> before = file_bytes(path("c.safetensors"));
    fs::permissions(dir_, fs::perms::owner_read | fs::perms::owner_exec);
    EXPECT_THROW(write_safetensors(path("c.safetensors"), {{"w", SafetensorsDType::kF32, {1}, w.data()}}, {}), Error);
    fs::permissions(dir_, fs::perms::owner_all);
    EXPECT_EQ(file_bytes(path("c.safetensors")), before);
    EXPECT_EQ(dir_entries(), std::vector<std::string>{"c.safetensors"});
}

TEST_F(SafetensorsTest, MissingFileIsAnIoError) {
    const std::string message = read_error(path("nope.safetensors"));
    EXPECT_NE(message.find(path("nope.safetensors") + ": open: No such file"), std::string::npos) << message;
}

// Each corruption is refused with "<path>: corrupted safetensors file: <what>"; `what` is checked.
void expect_corrupted(const std::string& path, const std::string& what) {
    const std::string message = read_error(path);
    EXPECT_NE(message.find(path + ": corrupted safetensors file: "), std::string::npos) << message;
    EXPECT_NE(message.find(what), std::string::npos) << "expected \"" << what << "\" in: " << message;
}

TEST_F(SafetensorsTest, TruncatedFilesAreRefused) {
    std::vector<float> w(16, 1.5f);
    const std::string good = path("good.safetensors");
    write_safetensors(good, {{"w", SafetensorsDType::kF32, {16}, w.data()}}, {{"step", "3"}});
    const std::vector<std::uint8_t> bytes = file_bytes(good);

    const std::string p = path("bad.safetensors");
    put_bytes(p, {bytes.begin(), bytes.end() - 3});
    expect_corrupted(p, "tensor \"w\": data_offsets [0, 64) extend past the data section of 61 bytes");
    put_bytes(p, {bytes.begin(), bytes.begin() + 40});
    expect_corrupted(p, "exceeds the 32 bytes after the length field");
    put_bytes(p, {bytes.begin(), bytes.begin() + 5});
    expect_corrupted(p, "the file has 5 bytes, fewer than the 8-byte header length");
    put_bytes(p, {});
    expect_corrupted(p, "the file has 0 bytes");
    EXPECT_EQ(read_safetensors(good).tensors.at("w").bytes, as_bytes(w)) << "the good file is untouched";
}

TEST_F(SafetensorsTest, HeaderLengthBeyondTheFileIsRefused) {
    const std::string p = path("bad.safetensors");
    const std::string header = R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
    put_raw(p, header, 4, header.size() + 5);
    expect_corrupted(p, "header length " + std::to_string(header.size() + 5) + " exceeds the " +
                            std::to_string(header.size() + 4) + " bytes after the length field");
    put_raw(p, header, 4, 1ULL << 60);
    expect_corrupted(p, "exceeds the format's limit");
}

TEST_F(SafetensorsTest, BadJsonIsRefused) {
    const std::string p = path("bad.safetensors");
    put_raw(p, R"({"w":{"dtype":"F32","shape":[1],)", 4);
    expect_corrupted(p, "the header is not valid JSON");
    put_raw(p, R"(["w"])", 0);
    expect_corrupted(p, "does not start with '{'");
    put_raw(p, "", 0);
    expect_corrupted(p, "does not start with '{'");
    put_raw(p, R"({"w":[1,2]})", 0);
    expect_corrupted(p, "tensor \"w\": its entry is not a JSON object");
    put_raw(p, R"({"w":{"dtype":"F32","shape":[1]}})", 4);
    expect_corrupted(p, "needs \"dtype\", \"shape\" and \"data_offsets\"");
    put_raw(p, R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"extra":1}})", 4);
    expect_corrupted(p, "tensor \"w\": unexpected key \"extra\"");
    put_raw(p, R"({"__metadata__":{"step":100}})", 0);
    expect_corrupted(p, "__metadata__[\"step\"] is not a string");
    put_raw(p, R"({"__metadata__":["step"]})", 0);
    expect_corrupted(p, "__metadata__ is not a JSON object");
}

TEST_F(SafetensorsTest, BadOffsetsAreRefused) {
    const std::string p = path("bad.safetensors");
    put_raw(
        p,
        R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
        12);
    expect_corrupted(p, "tensors \"a\" [0, 8) and \"b\" [4, 12) overlap");
    put_raw(
        p,
        R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
        8);
    expect_corrupted(p, "overlap");
    put_raw(p, R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 4);
    expect_corrupted(p, "tensor \"a\": data_offsets [0, 8) extend past the data section of 4 bytes");
    put_raw(p, R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", 16);
    expect_corrupted(p, "bytes [0, 8) of the data section belong to no tensor");
    put_raw(p, R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 12);
    expect_corrupted(p, "the data section has 12 bytes but the tensors cover only 8");
    put_raw(p, R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8);
    expect_corrupted(p, "is not [begin, end] with 0 <= begin <= end");
    put_raw(p, R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[-8,0]}})", 8);
    expect_corrupted(p, "is not [begin, end] with 0 <= begin <= end");
    put_raw(p, R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", 8);
    expect_corrupted(p, "is not [begin, end]");
}

TEST_F(SafetensorsTest, UnknownDTypeIsRefused) {
    const std::string p = path("bad.safetensors");
    put_raw(p, R"({"a":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[0,2]}})", 2);
    expect_corrupted(p, "tensor \"a\": unknown dtype \"F8_E4M3\"");
    put_raw(p, R"({"a":{"dtype":4,"shape":[2],"data_offsets":[0,8]}})", 8);
    expect_corrupted(p, "tensor \"a\": unknown dtype 4");
}

TEST_F(SafetensorsTest, SizeMismatchIsRefused) {
    const std::string p = path("bad.safetensors");
    put_raw(p, R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8);
    expect_corrupted(p, "tensor \"a\": data_offsets [0,8] hold 8 bytes, but shape [3] F32 needs 12");
    put_raw(p, R"({"a":{"dtype":"BF16","shape":[2,-1],"data_offsets":[0,8]}})", 8);
    expect_corrupted(p, "shape [2,-1] is not a list of non-negative integers");
    put_raw(p, R"({"a":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", 8);
    expect_corrupted(p, "is not a list of non-negative integers");
    put_raw(p, R"({"a":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8);
    expect_corrupted(p, "overflows");
}

TEST_F(SafetensorsTest, DamagedTensorBytesFailTheChecksum) {
    std::vector<float> w(16, 1.5f);
    const std::string p = path("c.safetensors");
    write_safetensors(p, {{"w", SafetensorsDType::kF32, {16}, w.data()}}, {{"step", "3"}});
    std::vector<std::uint8_t> bytes = file_bytes(p);
    bytes[bytes.size() - 5] ^= 0x10;
    put_bytes(p, bytes);
    expect_corrupted(p, "the data section's CRC-32 is");
    expect_corrupted(p, "the tensor bytes are damaged");
}

TEST_F(SafetensorsTest, FilesFromOtherWritersNeedNoChecksum) {
    // As the Python package writes it: no CRC, header padded with spaces.
    const std::string p = path("py.safetensors");
    put_raw(p, R"({"__metadata__":{"format":"pt"},"a":{"dtype":"I32","shape":[1],"data_offsets":[0,4]}}   )", 4);
    const SafetensorsFile file = read_safetensors(p);
    EXPECT_EQ(file.metadata, (std::map<std::string, std::string>{{"format", "pt"}}));
    EXPECT_EQ(file.tensors.at("a").bytes, std::vector<std::uint8_t>(4, 0));
}

TEST_F(SafetensorsTest, IndexRoundTrips) {
    SafetensorsIndex index;
    index.metadata = {{"config", R"({"hidden": 64})"}, {"step", "100"}, {"world_size", "2"}};
    index.weight_map = {{"layers.0.expert_w1.rank0", "model-00001-of-00002.safetensors"},
                        {"layers.0.expert_w1.rank1", "model-00002-of-00002.safetensors"},
                        {"embed", "model-00001-of-00002.safetensors"}};
    write_safetensors_index(path("model.safetensors.index.json"), index);
    const SafetensorsIndex back = read_safetensors_index(path("model.safetensors.index.json"));
    EXPECT_EQ(back.metadata, index.metadata);
    EXPECT_EQ(back.weight_map, index.weight_map);
    EXPECT_EQ(dir_entries(), std::vector<std::string>{"model.safetensors.index.json"});
}

TEST_F(SafetensorsTest, IndexFromHuggingFaceReads) {
    const std::string p = path("hf.index.json");
    const std::string text =
        R"({"metadata": {"total_size": 123}, "weight_map": {"w": "model-00001-of-00001.safetensors"}})";
    put_bytes(p, {text.begin(), text.end()});
    const SafetensorsIndex index = read_safetensors_index(p);
    EXPECT_EQ(index.metadata.at("total_size"), "123");
    EXPECT_EQ(index.weight_map.at("w"), "model-00001-of-00001.safetensors");
}

TEST_F(SafetensorsTest, BadIndexIsRefused) {
    SafetensorsIndex index;
    index.weight_map = {{"w", "../escape.safetensors"}};
    EXPECT_THROW(write_safetensors_index(path("i.json"), index), Error);
    EXPECT_TRUE(dir_entries().empty());

    auto error_of = [&](const std::string& text) {
        put_bytes(path("i.json"), {text.begin(), text.end()});
        try {
            read_safetensors_index(path("i.json"));
        } catch (const Error& e) {
            return std::string(e.what());
        }
        return std::string();
    };
    EXPECT_NE(error_of(R"({"weight_map": {"w": "a.safetensors")").find("corrupted safetensors index: not valid JSON"),
              std::string::npos);
    EXPECT_NE(error_of(R"({"metadata": {}})").find("no \"weight_map\" object"), std::string::npos);
    EXPECT_NE(
        error_of(R"({"weight_map": {"w": "/etc/passwd"}})").find("weight_map[\"w\"] = \"/etc/passwd\" is not a plain"),
        std::string::npos);
    EXPECT_NE(error_of(R"({"weight_map": {"w": 3}})").find("is not a plain file name"), std::string::npos);
    EXPECT_NE(error_of("[]").find("not a JSON object"), std::string::npos);
}

// Found by tests/fuzz/checkpoint_fuzz (corpus/checkpoint/regression-number-overflow-1e700.json): a
// number too large for a double (1e700) makes nlohmann's parser throw out_of_range, not parse_error,
// and the readers caught only parse_error, so it escaped as a non-scmoe exception (std::terminate
// in the fuzzer). The safetensors header had the same gap.
TEST_F(SafetensorsTest, NumberOverflowInJsonIsRefused) {
    const std::string index_text = R"({"metadata": {"total_size": 1e700}, "weight_map": {"w": "a.safetensors"}})";
    put_bytes(path("i.json"), {index_text.begin(), index_text.end()});
    try {
        read_safetensors_index(path("i.json"));
        ADD_FAILURE() << "read an index with a number beyond a double";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("corrupted safetensors index: not valid JSON"), std::string::npos)
            << e.what();
    }
    const std::string p = path("overflow.safetensors");
    put_raw(p, R"({"w":{"dtype":"F32","shape":[1e700],"data_offsets":[0,4]}})", 4);
    expect_corrupted(p, "the header is not valid JSON");
}

}  // namespace
}  // namespace scmoe
