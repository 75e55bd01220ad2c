// Checkpoint files in the safetensors format (https://github.com/huggingface/safetensors), plus the
// sharded-checkpoint index JSON (as in Hugging Face's model.safetensors.index.json).
//
// File layout, all little-endian:
//   [8 bytes]  N, u64: length of the header
//   [N bytes]  JSON object: {"__metadata__": {str: str}, "<name>": {"dtype": "F32", "shape": [2, 3],
//              "data_offsets": [begin, end]}, ...}; offsets are bytes relative to the data section,
//              [begin, end). We pad the header with spaces so the data section starts 8-byte aligned.
//   [rest]     the data section: every tensor's bytes, row-major, covering it with no gaps or overlaps.
//
// Writes are atomic: a crash or error leaves either the previous file or the new one at `path`, never a
// mix. Reads validate the whole structure and refuse anything else with
//   scmoe::Error "<path>: corrupted safetensors file: <what>".
// The writer also stores a CRC-32 of the data section in the metadata (key kSafetensorsCrcKey); the
// reader verifies it when present, so flipped bits inside tensor data are caught too. Other
// safetensors readers (the Python package) simply see one more metadata string.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "scmoe/kernels/dtype.h"

namespace scmoe {

// Element types of a safetensors file; the names (safetensors_dtype_name) are the spec's.
enum class SafetensorsDType : std::uint8_t {
    kF64,
    kF32,
    kF16,
    kBF16,
    kI64,
    kI32,
    kI16,
    kI8,
    kU64,
    kU32,
    kU16,
    kU8,
    kBool
};

// Bytes per element: 8, 4, 2, 2, 8, 4, 2, 1, 8, 4, 2, 1, 1.
std::size_t safetensors_dtype_size(SafetensorsDType t);
// "F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U64", "U32", "U16", "U8", "BOOL".
const char* safetensors_dtype_name(SafetensorsDType t);
// scmoe's tensor dtypes: kF32 -> kF32, kBF16 -> kBF16, kI32 -> kI32.
SafetensorsDType to_safetensors_dtype(DType t);

// Metadata key the writer fills with the data section's CRC-32 (zlib's polynomial) as 8 lowercase hex
// digits; callers may not set it, and read_safetensors() verifies and removes it.
inline constexpr const char* kSafetensorsCrcKey = "scmoe.data_crc32";

// One tensor to write. `data` is host memory of numel(shape) * dtype size bytes; it may be null only
// when the tensor has no elements. An empty shape is a scalar (one element).
struct SafetensorsTensor {
    std::string name;
    SafetensorsDType dtype = SafetensorsDType::kF32;
    std::vector<std::int64_t> shape;
    const void* data = nullptr;
};

// Writes `tensors` and string `metadata` (e.g. {"config": <json>, "step": "100"}) to `path` atomically:
// the bytes go to `path`.tmp.<pid>, which is flushed and fsync'ed, renamed over `path`, and then the
// directory is fsync'ed. The data section holds the tensors by element size (largest first), then name,
// so each starts aligned to its element size; the header lists them by name. Everything is validated before the temp
// file is created (unique non-empty names other than "__metadata__", non-negative dims, non-null data);
// on any failure the temp file is removed, an existing file at `path` is untouched, and scmoe::Error
// names the path and the failing call with its errno text (a failed directory fsync is reported after
// the rename, when the new file is already in place).
void write_safetensors(const std::string& path, const std::vector<SafetensorsTensor>& tensors,
                       const std::map<std::string, std::string>& metadata);

// A whole file read into host memory.
struct SafetensorsFile {
    struct Entry {
        SafetensorsDType dtype = SafetensorsDType::kF32;
        std::vector<std::int64_t> shape;
        std::vector<std::uint8_t> bytes;  // numel(shape) * dtype size bytes, row-major, little-endian
        std::int64_t numel() const;
    };
    std::map<std::string, std::string> metadata;  // without kSafetensorsCrcKey
    std::map<std::string, Entry> tensors;
};

// Reads and validates `path`: the header length fits the file (and the spec's 100 MB limit), the header
// is a JSON object starting with '{', metadata is string -> string, every tensor has exactly a known
// dtype, a shape of non-negative dims and data_offsets [begin, end) with end - begin = numel x dtype
// size, the tensors tile the data section exactly (in order, no overlap, no gap, nothing outside it),
// and the CRC in the metadata, if present, matches. Throws scmoe::Error
// "<path>: corrupted safetensors file: <what>" on a violation and "<path>: <call>: <errno text>" on an
// I/O error.
SafetensorsFile read_safetensors(const std::string& path);

// The index of a sharded checkpoint: which shard file (a plain file name in the index's directory)
// holds each tensor. Stored as JSON {"metadata": {str: str}, "weight_map": {tensor name: file name}}.
struct SafetensorsIndex {
    std::map<std::string, std::string> metadata;
    std::map<std::string, std::string> weight_map;
};

// Writes `index` to `path` atomically, as write_safetensors() does. Refuses shard names that are not
// plain file names (empty, ".", "..", or containing '/').
void write_safetensors_index(const std::string& path, const SafetensorsIndex& index);

// Reads an index written by write_safetensors_index() or by Hugging Face tools (non-string metadata
// values such as "total_size": 123 are kept as their JSON text, "123"). Throws scmoe::Error
// "<path>: corrupted safetensors index: <what>" when it is not such a JSON object or a shard name is
// not a plain file name.
SafetensorsIndex read_safetensors_index(const std::string& path);

// Writes `size` bytes to `path` atomically (temp file, fsync, rename, directory fsync); used by the
// writers above and for other small checkpoint files. Errors as in write_safetensors().
void write_file_atomically(const std::string& path, const void* data, std::size_t size);

// CRC-32 (zlib's) of `size` bytes, continuing from `crc` (0 to start).
std::uint32_t crc32_update(std::uint32_t crc, const void* data, std::size_t size);

}  // namespace scmoe
