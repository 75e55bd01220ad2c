// ExpertCache: device slots for routed experts whose weights live in pinned host memory, for the
// decoder's expert residency modes (issue 27, item 2; scmoe/models/decoder.h):
//
//   blocking  every chosen expert is copied into a slot on the compute stream, then computed: the
//             copy and the FFN are serialized with the backbone (no reuse: the paper's "blocking
//             migration"). One slot suffices (the stream orders a slot's reuse).
//   prefetch  at a layer's gate the host reads which experts the pass chose and issues, on a copy
//             stream, the copy of exactly those not already cached; each expert's FFN then waits only
//             on its own copy's event. The slots are a cache of (layer, expert) with LRU eviction:
//             a hit is not copied. A copy into an evicted slot waits for the last FFN that read it.
//
// Slots are reserved ("pinned") from a layer's gate until its expert has run. A gate pins at most
// slots - 1 of them in all, so an expert that found no slot at its gate (a pass choosing more experts
// than the cache holds, e.g. a long prompt's prefill) is copied at its FFN into an unpinned one, on the
// copy stream, and the pass never waits for a slot that only a later op frees: any budget of at least
// one expert decodes every pass.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "scmoe/kernels/device.h"

namespace scmoe::models {

// Counters of an ExpertCache since it was built.
struct ExpertCacheStats {
    std::int64_t copies = 0;       // experts copied host -> device
    std::int64_t hits = 0;         // chosen experts found in a slot (not copied)
    std::int64_t late = 0;         // prefetch: copies issued at the FFN (no slot was free at the gate)
    std::uint64_t bytes_copied = 0;
};

class ExpertCache {
  public:
    enum class Mode { kBlocking, kPrefetch };
    // One expert's weights: w1 then w2, `expert_bytes` = w1_bytes + w2_bytes. slots >= 1 (throws
    // naming the values otherwise). Allocates slots x expert_bytes of device memory.
    ExpertCache(Device& device, Mode mode, std::int64_t slots, std::size_t w1_bytes, std::size_t w2_bytes);
    ~ExpertCache();
    ExpertCache(const ExpertCache&) = delete;
    ExpertCache& operator=(const ExpertCache&) = delete;

    // A layer's experts in host memory (pinned: Device::allocate_host), [experts, ...] contiguous
    // for w1 and for w2; returns the layer's index.
    int add_layer(const void* host_w1, const void* host_w2, int experts);

    // Prefetch mode, at layer's gate: issues the copies of `experts` (the pass's chosen local
    // experts, ascending) not already cached, on the copy stream, as far as slots allow.
    void prefetch(int layer, const std::vector<int>& experts);
    // At the FFN: expert `expert` of `layer` in a slot, `compute` ordered after its copy (blocking:
    // the copy is enqueued on `compute` itself). Returns the slot's (w1, w2). release() after
    // enqueuing the work that reads it.
    std::pair<void*, void*> acquire(int layer, int expert, Stream& compute);
    void release(int layer, int expert, Stream& compute);

    std::int64_t slots() const { return static_cast<std::int64_t>(slots_.size()); }
    std::size_t expert_bytes() const { return w1_bytes_ + w2_bytes_; }
    std::size_t device_bytes() const { return buffer_.bytes(); }
    const ExpertCacheStats& stats() const { return stats_; }
    // The (layer, expert) in each slot, -1 for an empty one, in slot order: for tests.
    std::vector<std::pair<int, int>> contents() const;
    // Tests: called with the copy stream (prefetch) or the compute stream (blocking) right before an
    // expert's copy is enqueued on it.
    void set_copy_probe(std::function<void(Stream&)> probe) { probe_ = std::move(probe); }
    Stream* copy_stream() { return copy_stream_.get(); }

  private:
    struct Slot {
        int layer = -1, expert = -1;
        std::uint64_t last_use = 0;
        bool pinned = false;       // reserved from a gate (or an acquire) until release
        bool gate_pinned = false;  // reserved by a gate (counts in gate_pins_)
        bool has_ready = false, has_free = false;
        std::unique_ptr<Event> ready, free;  // its copy done (copy stream); its last reader done (compute)
        char* data = nullptr;
    };
    int find(int layer, int expert) const;
    int victim() const;  // the least recently used unpinned slot, -1 if none
    void copy_into(int slot, int layer, int expert, Stream& on);

    Device& device_;
    Mode mode_;
    std::size_t w1_bytes_, w2_bytes_;
    DeviceBuffer buffer_;
    std::unique_ptr<Stream> copy_stream_;  // prefetch only
    std::vector<Slot> slots_;
    struct Layer {
        const char* w1;
        const char* w2;
        int experts;
    };
    std::vector<Layer> layers_;
    std::uint64_t tick_ = 0;
    int gate_pins_ = 0;  // slots pinned by gates (at most slots - 1)
    ExpertCacheStats stats_;
    std::function<void(Stream&)> probe_;
};

// A Device whose allocate() hands out `inner`'s pinned host memory (allocate_host) and which is
// otherwise `inner` (its streams, events and dtype): where a LanguageModel built for offloaded
// decoding keeps its MoE layers' parameter stores (LanguageModel's moe_param_device). It must
// not outlive `inner`.
std::unique_ptr<Device> pinned_host_memory(Device& inner);

}  // namespace scmoe::models
