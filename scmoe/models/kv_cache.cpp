#include "scmoe/models/kv_cache.h"

#include <fstream>
#include <limits>
#include <sstream>

#include "scmoe/kernels/emu/emu_device.h"
#include "scmoe/kernels/error.h"

namespace scmoe::models {
namespace {

std::string format_mib(std::uint64_t bytes) {
    std::ostringstream o;
    o.precision(1);
    o << std::fixed << static_cast<double>(bytes) / (1024.0 * 1024.0) << " MiB";
    return o.str();
}

std::uint64_t block_bytes(const KvCacheShape& s) {
    return static_cast<std::uint64_t>(s.batch * s.kv_heads * s.max_length * s.head_dim) * dtype_size(s.dtype);
}

}  // namespace

std::uint64_t KvCacheShape::bytes() const { return 2 * static_cast<std::uint64_t>(layers) * block_bytes(*this); }

std::string KvCacheShape::describe() const {
    std::ostringstream o;
    o << layers << " layers x 2 (K, V) x batch " << batch << " x " << kv_heads << " K/V heads x " << max_length
      << " positions x head_dim " << head_dim << " x " << dtype_size(dtype) << " B = " << bytes() << " bytes ("
      << format_mib(bytes()) << ")";
    return o.str();
}

std::optional<std::uint64_t> available_device_memory(Device& device) {
    if (device.backend() == Backend::kEmu) {
        const emu::MemoryStats m = emu::as_emu(device).memory();
        return m.capacity > m.in_use ? m.capacity - m.in_use : 0;
    }
    if (device.backend() != Backend::kCpu) return std::nullopt;
    std::ifstream meminfo("/proc/meminfo");
    for (std::string key; meminfo >> key;) {
        std::uint64_t kib = 0;
        meminfo >> kib;
        if (key == "MemAvailable:") return kib * 1024;
        meminfo.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
    }
    return std::nullopt;  // not Linux: nothing to compare with
}

KvCache::KvCache(Device& device, const KvCacheShape& shape) : shape_(shape) {
    SCMOE_CHECK(shape.layers > 0 && shape.batch > 0 && shape.max_length > 0 && shape.kv_heads > 0 && shape.head_dim > 0,
                "KV cache: every size must be positive: " << shape.describe());
    const std::uint64_t need = shape.bytes() + static_cast<std::uint64_t>(shape.batch) * sizeof(std::int32_t);
    if (const std::optional<std::uint64_t> free = available_device_memory(device))
        SCMOE_CHECK(need <= *free, "KV cache of " << shape.describe() << " does not fit the " << backend_name(device.backend())
                                                  << " device's available memory, " << *free << " bytes ("
                                                  << format_mib(*free) << "): use fewer prompts or fewer new tokens");
    try {
        buffer_ = DeviceBuffer(device, need);
    } catch (const std::exception& e) {
        SCMOE_FAIL("KV cache of " << shape.describe() << ": allocation failed: " << e.what());
    }
    device_lengths_ = reinterpret_cast<std::int32_t*>(static_cast<char*>(buffer_.data()) + shape.bytes());
    lengths_.assign(static_cast<std::size_t>(shape.batch), 0);
}

void* KvCache::block(std::int64_t layer, int kv, std::int64_t sequence) const {
    SCMOE_CHECK(layer >= 0 && layer < shape_.layers && sequence >= 0 && sequence < shape_.batch,
                "KV cache: layer " << layer << " / sequence " << sequence << " outside " << shape_.layers
                                   << " layers x batch " << shape_.batch);
    const std::uint64_t per_sequence = block_bytes(shape_) / static_cast<std::uint64_t>(shape_.batch);
    return static_cast<char*>(buffer_.data()) + (2 * static_cast<std::uint64_t>(layer) + kv) * block_bytes(shape_) +
           static_cast<std::uint64_t>(sequence) * per_sequence;
}

void KvCache::set_length(std::int64_t sequence, std::int64_t length) {
    SCMOE_CHECK(sequence >= 0 && sequence < shape_.batch, "KV cache: sequence " << sequence << " outside batch " << shape_.batch);
    SCMOE_CHECK(length >= 0 && length <= shape_.max_length,
                "KV cache: sequence " << sequence << " would hold " << length << " positions; the cache holds "
                                      << shape_.max_length);
    lengths_[static_cast<std::size_t>(sequence)] = length;
}

void KvCache::reset() { lengths_.assign(lengths_.size(), 0); }

const std::int32_t* KvCache::upload_lengths(Stream& stream) {
    // The previous copy's source must outlive it: stage into a fresh vector only after the stream
    // has run that copy (the caller synchronizes between passes: a pass reads its logits back).
    staged_lengths_.assign(lengths_.begin(), lengths_.end());
    stream.copy(device_lengths_, staged_lengths_.data(), staged_lengths_.size() * sizeof(std::int32_t));
    return device_lengths_;
}

}  // namespace scmoe::models
