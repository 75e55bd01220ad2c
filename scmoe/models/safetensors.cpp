#include "scmoe/models/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <system_error>
#include <utility>

#include "scmoe/kernels/error.h"

namespace scmoe {

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian; so must the host be");

namespace {

using json = nlohmann::json;

// The spec's limit (the Rust reader's MAX_HEADER_SIZE): a larger header is refused, not allocated.
constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;
constexpr const char* kMetadataKey = "__metadata__";

struct DTypeInfo {
    SafetensorsDType dtype;
    const char* name;
    std::size_t size;
};
constexpr std::array<DTypeInfo, 13> kDTypes{{{SafetensorsDType::kF64, "F64", 8},
                                             {SafetensorsDType::kF32, "F32", 4},
                                             {SafetensorsDType::kF16, "F16", 2},
                                             {SafetensorsDType::kBF16, "BF16", 2},
                                             {SafetensorsDType::kI64, "I64", 8},
                                             {SafetensorsDType::kI32, "I32", 4},
                                             {SafetensorsDType::kI16, "I16", 2},
                                             {SafetensorsDType::kI8, "I8", 1},
                                             {SafetensorsDType::kU64, "U64", 8},
                                             {SafetensorsDType::kU32, "U32", 4},
                                             {SafetensorsDType::kU16, "U16", 2},
                                             {SafetensorsDType::kU8, "U8", 1},
                                             {SafetensorsDType::kBool, "BOOL", 1}}};

const DTypeInfo& dtype_info(SafetensorsDType t) {
    for (const DTypeInfo& info : kDTypes) {
        if (info.dtype == t) return info;
    }
    SCMOE_FAIL("invalid SafetensorsDType " << static_cast<int>(t));
}

std::string errno_text(int err) { return std::generic_category().message(err); }

[[noreturn]] void io_fail(const std::string& path, const char* call, int err) {
    SCMOE_FAIL(path << ": " << call << ": " << errno_text(err));
}

[[noreturn]] void corrupted(const std::string& path, const std::string& what) {
    SCMOE_FAIL(path << ": corrupted safetensors file: " << what);
}

std::string shape_text(const std::vector<std::int64_t>& shape) {
    std::string s = "[";
    for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
}

class FileDescriptor {
  public:
    explicit FileDescriptor(int fd) : fd_(fd) {}
    ~FileDescriptor() {
        if (fd_ >= 0) ::close(fd_);
    }
    FileDescriptor(const FileDescriptor&) = delete;
    FileDescriptor& operator=(const FileDescriptor&) = delete;
    int get() const { return fd_; }
    // Closes now, reporting close()'s errno (0 on success): a failed close can mean lost writes.
    int close() {
        const int fd = std::exchange(fd_, -1);
        return ::close(fd) == 0 ? 0 : errno;
    }

  private:
    int fd_;
};

// Collects a file's bytes in `path`.tmp.<pid> and moves them over `path` in commit(); destroyed
// without commit(), it removes the temp file and leaves `path` alone.
class AtomicFile {
  public:
    explicit AtomicFile(std::string path)
        : path_(std::move(path)),
          tmp_path_(path_ + ".tmp." + std::to_string(::getpid())),
          fd_(::open(tmp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)) {
        if (fd_.get() < 0) io_fail(tmp_path_, "open", errno);
    }
    ~AtomicFile() {
        if (!committed_) ::unlink(tmp_path_.c_str());
    }
    AtomicFile(const AtomicFile&) = delete;
    AtomicFile& operator=(const AtomicFile&) = delete;

    void write(const void* data, std::size_t size) {
        const auto* p = static_cast<const char*>(data);
        while (size > 0) {
            const ssize_t n = ::write(fd_.get(), p, std::min<std::size_t>(size, std::size_t{1} << 30));
            if (n < 0) {
                if (errno == EINTR) continue;
                io_fail(tmp_path_, "write", errno);
            }
            p += n;
            size -= static_cast<std::size_t>(n);
        }
    }

    void commit() {
        if (::fsync(fd_.get()) != 0) io_fail(tmp_path_, "fsync", errno);
        if (const int err = fd_.close(); err != 0) io_fail(tmp_path_, "close", err);
        if (::rename(tmp_path_.c_str(), path_.c_str()) != 0) {
            const int err = errno;
            SCMOE_FAIL(path_ << ": rename from " << tmp_path_ << ": " << errno_text(err));
        }
        committed_ = true;
        // The rename itself is durable only once the directory entry is on disk.
        std::string dir = std::filesystem::path(path_).parent_path().string();
        if (dir.empty()) dir = ".";
        FileDescriptor dir_fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
        if (dir_fd.get() < 0) io_fail(dir, "open (to fsync the directory)", errno);
        if (::fsync(dir_fd.get()) != 0) io_fail(dir, "fsync (directory)", errno);
    }

  private:
    std::string path_, tmp_path_;
    FileDescriptor fd_;
    bool committed_ = false;
};

// Reads exactly `size` bytes at `offset`; a short read means the file changed under us.
void read_exact(int fd, const std::string& path, std::uint64_t offset, void* data, std::size_t size) {
    auto* p = static_cast<char*>(data);
    while (size > 0) {
        const ssize_t n = ::pread(fd, p, std::min<std::size_t>(size, std::size_t{1} << 30), static_cast<off_t>(offset));
        if (n < 0) {
            if (errno == EINTR) continue;
            io_fail(path, "read", errno);
        }
        if (n == 0) corrupted(path, "unexpected end of file at byte " + std::to_string(offset));
        p += n;
        size -= static_cast<std::size_t>(n);
        offset += static_cast<std::uint64_t>(n);
    }
}

std::vector<std::uint8_t> read_whole_file(const std::string& path) {
    FileDescriptor fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd.get() < 0) io_fail(path, "open", errno);
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0) io_fail(path, "fstat", errno);
    std::vector<std::uint8_t> bytes(static_cast<std::size_t>(st.st_size));
    read_exact(fd.get(), path, 0, bytes.data(), bytes.size());
    return bytes;
}

// Slicing-by-8 tables for the reflected CRC-32 polynomial 0xEDB88320 (zlib, PNG, gzip).
struct CrcTables {
    std::array<std::array<std::uint32_t, 256>, 8> t{};
    CrcTables() {
        for (std::uint32_t i = 0; i < 256; ++i) {
            std::uint32_t c = i;
            for (int k = 0; k < 8; ++k) c = (c & 1u) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
            t[0][i] = c;
        }
        for (std::size_t k = 1; k < 8; ++k) {
            for (std::size_t i = 0; i < 256; ++i) t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xFFu];
        }
    }
};

bool valid_shard_name(const std::string& name) {
    return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
           name.find('\0') == std::string::npos;
}

std::string crc_hex(std::uint32_t crc) {
    char buf[9];
    std::snprintf(buf, sizeof(buf), "%08x", crc);
    return buf;
}

}  // namespace

std::uint32_t crc32_update(std::uint32_t crc, const void* data, std::size_t size) {
    static const CrcTables tables;
    const auto& t = tables.t;
    const auto* p = static_cast<const std::uint8_t*>(data);
    crc = ~crc;
    for (; size >= 8; size -= 8, p += 8) {
        std::uint32_t lo, hi;
        std::memcpy(&lo, p, 4);
        std::memcpy(&hi, p + 4, 4);
        lo ^= crc;
        crc = t[7][lo & 0xFFu] ^ t[6][(lo >> 8) & 0xFFu] ^ t[5][(lo >> 16) & 0xFFu] ^ t[4][lo >> 24] ^
              t[3][hi & 0xFFu] ^ t[2][(hi >> 8) & 0xFFu] ^ t[1][(hi >> 16) & 0xFFu] ^ t[0][hi >> 24];
    }
    for (; size > 0; --size, ++p) crc = t[0][(crc ^ *p) & 0xFFu] ^ (crc >> 8);
    return ~crc;
}

std::size_t safetensors_dtype_size(SafetensorsDType t) { return dtype_info(t).size; }
const char* safetensors_dtype_name(SafetensorsDType t) { return dtype_info(t).name; }

SafetensorsDType to_safetensors_dtype(DType t) {
    switch (t) {
        case DType::kF32:
            return SafetensorsDType::kF32;
        case DType::kBF16:
            return SafetensorsDType::kBF16;
        case DType::kI32:
            return SafetensorsDType::kI32;
    }
    SCMOE_FAIL("to_safetensors_dtype: invalid DType " << static_cast<int>(t));
}

std::int64_t SafetensorsFile::Entry::numel() const {
    std::int64_t n = 1;
    for (std::int64_t d : shape) n *= d;
    return n;
}

void write_file_atomically(const std::string& path, const void* data, std::size_t size) {
    AtomicFile file(path);
    file.write(data, size);
    file.commit();
}

void write_safetensors(const std::string& path, const std::vector<SafetensorsTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
    // Validate everything before a byte is written.
    struct Planned {
        const SafetensorsTensor* tensor;
        std::size_t bytes;
    };
    std::vector<Planned> planned;
    std::set<std::string> names;
    for (const SafetensorsTensor& t : tensors) {
        const std::string what = path + ": cannot write safetensors: tensor \"" + t.name + "\"";
        SCMOE_CHECK(!t.name.empty() && t.name != kMetadataKey,
                    path << ": cannot write safetensors: tensor name \"" << t.name << "\" is reserved or empty");
        SCMOE_CHECK(names.insert(t.name).second, what << " appears twice");
        std::uint64_t bytes = safetensors_dtype_size(t.dtype);
        for (std::int64_t d : t.shape) {
            SCMOE_CHECK(d >= 0, what << ": negative dimension in shape " << shape_text(t.shape));
            SCMOE_CHECK(!__builtin_mul_overflow(bytes, static_cast<std::uint64_t>(d), &bytes),
                        what << ": shape " << shape_text(t.shape) << " overflows");
        }
        SCMOE_CHECK(t.data != nullptr || bytes == 0, what << ": data is null but the tensor has " << bytes << " bytes");
        planned.push_back({&t, static_cast<std::size_t>(bytes)});
    }
    SCMOE_CHECK(!metadata.contains(kSafetensorsCrcKey),
                path << ": cannot write safetensors: metadata key \"" << kSafetensorsCrcKey << "\" is reserved");

    // Largest elements first, then by name: with the data section 8-byte aligned, every tensor starts
    // aligned to its element size (as the Python writer does), so readers can map it in place.
    std::sort(planned.begin(), planned.end(), [](const Planned& a, const Planned& b) {
        const std::size_t sa = safetensors_dtype_size(a.tensor->dtype), sb = safetensors_dtype_size(b.tensor->dtype);
        return sa != sb ? sa > sb : a.tensor->name < b.tensor->name;
    });

    std::string header;
    try {
        json j = json::object();
        json meta(metadata);
        std::uint32_t crc = 0;
        std::uint64_t offset = 0;
        for (const Planned& p : planned) {
            crc = crc32_update(crc, p.tensor->data, p.bytes);
            j[p.tensor->name] = {{"dtype", safetensors_dtype_name(p.tensor->dtype)},
                                 {"shape", p.tensor->shape},
                                 {"data_offsets", {offset, offset + p.bytes}}};
            offset += p.bytes;
        }
        meta[kSafetensorsCrcKey] = crc_hex(crc);
        j[kMetadataKey] = std::move(meta);
        header = j.dump();
    } catch (const json::exception& e) {
        SCMOE_FAIL(path << ": cannot write safetensors: building the header: " << e.what());
    }
    header.append((8 - header.size() % 8) % 8, ' ');

    std::array<std::uint8_t, 8> length{};
    const std::uint64_t n = header.size();
    std::memcpy(length.data(), &n, 8);

    AtomicFile file(path);
    file.write(length.data(), length.size());
    file.write(header.data(), header.size());
    for (const Planned& p : planned) file.write(p.tensor->data, p.bytes);
    file.commit();
}

SafetensorsFile read_safetensors(const std::string& path) {
    FileDescriptor fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd.get() < 0) io_fail(path, "open", errno);
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0) io_fail(path, "fstat", errno);
    const auto file_size = static_cast<std::uint64_t>(st.st_size);
    if (file_size < 8) {
        corrupted(path, "the file has " + std::to_string(file_size) + " bytes, fewer than the 8-byte header length");
    }
    std::uint64_t header_size = 0;
    read_exact(fd.get(), path, 0, &header_size, 8);
    if (header_size > kMaxHeaderBytes) {
        corrupted(path, "header length " + std::to_string(header_size) + " exceeds the format's limit of " +
                            std::to_string(kMaxHeaderBytes) + " bytes");
    }
    if (header_size > file_size - 8) {
        corrupted(path, "header length " + std::to_string(header_size) + " exceeds the " +
                            std::to_string(file_size - 8) + " bytes after the length field (truncated file?)");
    }
    std::string header(static_cast<std::size_t>(header_size), '\0');
    read_exact(fd.get(), path, 8, header.data(), header.size());
    if (header.empty() || header[0] != '{') corrupted(path, "the header does not start with '{'");
    json j;
    try {
        j = json::parse(header);
    } catch (const json::exception& e) {  // parse_error, or out_of_range for a number like 1e700
        corrupted(path, std::string("the header is not valid JSON: ") + e.what());
    }
    if (!j.is_object()) corrupted(path, "the header is not a JSON object");

    const std::uint64_t data_begin = 8 + header_size;
    const std::uint64_t data_size = file_size - data_begin;
    SafetensorsFile file;
    struct Span {
        std::uint64_t begin, end;
        const std::string* name;
        SafetensorsFile::Entry* entry;
    };
    std::vector<Span> spans;
    for (const auto& [name, value] : j.items()) {
        if (name == kMetadataKey) {
            if (!value.is_object()) corrupted(path, "__metadata__ is not a JSON object");
            for (const auto& [key, v] : value.items()) {
                if (!v.is_string()) corrupted(path, "__metadata__[\"" + key + "\"] is not a string");
                file.metadata[key] = v.get<std::string>();
            }
            continue;
        }
        const std::string what = "tensor \"" + name + "\": ";
        if (!value.is_object()) corrupted(path, what + "its entry is not a JSON object");
        for (const auto& [key, v] : value.items()) {
            if (key != "dtype" && key != "shape" && key != "data_offsets") {
                corrupted(path, what + "unexpected key \"" + key + "\"");
            }
        }
        if (!value.contains("dtype") || !value.contains("shape") || !value.contains("data_offsets")) {
            corrupted(path, what + "needs \"dtype\", \"shape\" and \"data_offsets\"");
        }
        SafetensorsFile::Entry& entry = file.tensors[name];
        const json& dtype = value["dtype"];
        const DTypeInfo* info = nullptr;
        if (dtype.is_string()) {
            for (const DTypeInfo& d : kDTypes) {
                if (dtype.get<std::string>() == d.name) info = &d;
            }
        }
        if (info == nullptr) corrupted(path, what + "unknown dtype " + dtype.dump());
        entry.dtype = info->dtype;

        const json& shape = value["shape"];
        if (!shape.is_array()) corrupted(path, what + "shape " + shape.dump() + " is not an array");
        std::uint64_t bytes = info->size;
        for (const json& d : shape) {
            if (!d.is_number_unsigned() || d.get<std::uint64_t>() > std::numeric_limits<std::int64_t>::max()) {
                corrupted(path, what + "shape " + shape.dump() + " is not a list of non-negative integers");
            }
            const auto dim = d.get<std::uint64_t>();
            if (__builtin_mul_overflow(bytes, dim, &bytes))
                corrupted(path, what + "shape " + shape.dump() + " overflows");
            entry.shape.push_back(static_cast<std::int64_t>(dim));
        }

        const json& offsets = value["data_offsets"];
        if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
            !offsets[1].is_number_unsigned() || offsets[0].get<std::uint64_t>() > offsets[1].get<std::uint64_t>()) {
            corrupted(path, what + "data_offsets " + offsets.dump() + " is not [begin, end] with 0 <= begin <= end");
        }
        const Span span{offsets[0].get<std::uint64_t>(), offsets[1].get<std::uint64_t>(), &name, &entry};
        if (span.end - span.begin != bytes) {
            corrupted(path, what + "data_offsets " + offsets.dump() + " hold " + std::to_string(span.end - span.begin) +
                                " bytes, but shape " + shape.dump() + " " + info->name + " needs " +
                                std::to_string(bytes));
        }
        spans.push_back(span);
    }

    // The tensors must tile the data section: sorted by offset, each starts where the previous ended.
    std::sort(spans.begin(), spans.end(),
              [](const Span& a, const Span& b) { return a.begin != b.begin ? a.begin < b.begin : a.end < b.end; });
    std::uint64_t cursor = 0;
    const Span* previous = nullptr;
    auto range = [](const Span& s) { return "[" + std::to_string(s.begin) + ", " + std::to_string(s.end) + ")"; };
    for (const Span& s : spans) {
        if (s.end > data_size) {
            corrupted(path, "tensor \"" + *s.name + "\": data_offsets " + range(s) +
                                " extend past the data section of " + std::to_string(data_size) +
                                " bytes (truncated file?)");
        }
        if (s.begin < cursor) {
            corrupted(path, "tensors \"" + *previous->name + "\" " + range(*previous) + " and \"" + *s.name + "\" " +
                                range(s) + " overlap");
        }
        if (s.begin > cursor) {
            corrupted(path, "bytes [" + std::to_string(cursor) + ", " + std::to_string(s.begin) +
                                ") of the data section belong to no tensor");
        }
        cursor = s.end;
        previous = &s;
    }
    if (cursor != data_size) {
        corrupted(path, "the data section has " + std::to_string(data_size) + " bytes but the tensors cover only " +
                            std::to_string(cursor));
    }

    std::uint32_t crc = 0;
    for (const Span& s : spans) {
        s.entry->bytes.resize(static_cast<std::size_t>(s.end - s.begin));
        read_exact(fd.get(), path, data_begin + s.begin, s.entry->bytes.data(), s.entry->bytes.size());
        crc = crc32_update(crc, s.entry->bytes.data(), s.entry->bytes.size());
    }
    if (auto it = file.metadata.find(kSafetensorsCrcKey); it != file.metadata.end()) {
        if (it->second != crc_hex(crc)) {
            corrupted(path, "the data section's CRC-32 is " + crc_hex(crc) + " but the header records \"" + it->second +
                                "\": the tensor bytes are damaged");
        }
        file.metadata.erase(it);
    }
    return file;
}

void write_safetensors_index(const std::string& path, const SafetensorsIndex& index) {
    for (const auto& [name, shard] : index.weight_map) {
        SCMOE_CHECK(valid_shard_name(shard), path << ": cannot write safetensors index: tensor \"" << name
                                                  << "\": shard \"" << shard << "\" is not a plain file name");
    }
    std::string text;
    try {
        text = json{{"metadata", index.metadata}, {"weight_map", index.weight_map}}.dump(2) + "\n";
    } catch (const json::exception& e) {
        SCMOE_FAIL(path << ": cannot write safetensors index: " << e.what());
    }
    write_file_atomically(path, text.data(), text.size());
}

SafetensorsIndex read_safetensors_index(const std::string& path) {
    const std::vector<std::uint8_t> bytes = read_whole_file(path);
    auto fail = [&path](const std::string& what) { SCMOE_FAIL(path << ": corrupted safetensors index: " << what); };
    json j;
    try {
        j = json::parse(bytes.begin(), bytes.end());
    } catch (const json::exception& e) {  // parse_error, or out_of_range for a number like 1e700
        fail(std::string("not valid JSON: ") + e.what());
    }
    if (!j.is_object()) fail("not a JSON object");
    SafetensorsIndex index;
    if (j.contains("metadata") && !j["metadata"].is_null()) {
        if (!j["metadata"].is_object()) fail("\"metadata\" is not a JSON object");
        for (const auto& [key, v] : j["metadata"].items()) {
            index.metadata[key] = v.is_string() ? v.get<std::string>() : v.dump();
        }
    }
    if (!j.contains("weight_map") || !j["weight_map"].is_object()) fail("no \"weight_map\" object");
    for (const auto& [name, v] : j["weight_map"].items()) {
        if (!v.is_string() || !valid_shard_name(v.get<std::string>())) {
            fail("weight_map[\"" + name + "\"] = " + v.dump() + " is not a plain file name");
        }
        index.weight_map[name] = v.get<std::string>();
    }
    return index;
}

}  // namespace scmoe
