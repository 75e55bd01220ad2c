// The KV cache of a decoding LanguageModel: one K and one V block per attention layer, each
// [batch, kv_heads, max_length, head_dim] in the compute dtype (scmoe/kernels/attention_decode.h),
// sized once from (batch, max_length) and checked against the device's memory before anything is
// allocated, plus each sequence's cached length (host, and a device copy the decode ops read).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "scmoe/kernels/device.h"
#include "scmoe/kernels/dtype.h"

namespace scmoe::models {

struct KvCacheShape {
    std::int64_t layers = 0, batch = 0, max_length = 0, kv_heads = 0, head_dim = 0;
    DType dtype = DType::kF32;
    std::uint64_t bytes() const;  // K and V of every layer
    std::string describe() const;  // "4 layers x 2 (K, V) x batch 3 x 4 K/V heads x 128 positions x 32 = 1.5 MiB"
};

// Memory the device can still give (CPU: MemAvailable of /proc/meminfo; emulated GPU: its capacity
// less what is allocated); nullopt where it cannot be asked (CUDA: an allocation that fails names
// the free memory itself).
std::optional<std::uint64_t> available_device_memory(Device& device);

class KvCache {
  public:
    // Throws scmoe::Error naming the shape and both byte counts when the cache does not fit the
    // device's available memory (or its allocation fails).
    KvCache(Device& device, const KvCacheShape& shape);
    const KvCacheShape& shape() const { return shape_; }
    void* k(std::int64_t layer, std::int64_t sequence = 0) const { return block(layer, 0, sequence); }
    void* v(std::int64_t layer, std::int64_t sequence = 0) const { return block(layer, 1, sequence); }

    // Cached positions per sequence: host values (what the next pass appends to) and the device copy
    // the ops read (written by upload_lengths).
    std::int64_t length(std::int64_t sequence) const { return lengths_[static_cast<std::size_t>(sequence)]; }
    // Sets sequence b's length (after a pass appended to it, or 0 to start it over).
    void set_length(std::int64_t sequence, std::int64_t length);
    void reset();  // every sequence empty
    // Enqueues on `stream` the copy of the host lengths to the device; the values copied are kept
    // until the next call, so the copy may run later.
    const std::int32_t* upload_lengths(Stream& stream);

  private:
    void* block(std::int64_t layer, int kv, std::int64_t sequence) const;
    KvCacheShape shape_;
    DeviceBuffer buffer_;  // [layers][K, V][batch][kv_heads][max_length][head_dim], then [batch] int32 lengths
    std::int32_t* device_lengths_ = nullptr;
    std::vector<std::int64_t> lengths_;
    std::vector<std::int32_t> staged_lengths_;
};

}  // namespace scmoe::models
