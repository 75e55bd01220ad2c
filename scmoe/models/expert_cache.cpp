#include "scmoe/models/expert_cache.h"

#include <algorithm>

#include "scmoe/kernels/error.h"

namespace scmoe::models {


namespace {

std::size_t round_up(std::size_t bytes) { return (bytes + 255) / 256 * 256; }

}  // namespace

ExpertCache::ExpertCache(Device& device, Mode mode, std::int64_t slots, std::size_t w1_bytes, std::size_t w2_bytes)
    : device_(device), mode_(mode), w1_bytes_(w1_bytes), w2_bytes_(w2_bytes) {
    SCMOE_CHECK(slots >= 1, "expert cache of " << slots << " slots: it must hold at least one expert ("
                                               << w1_bytes + w2_bytes << " bytes)");
    SCMOE_CHECK(w1_bytes > 0 && w2_bytes > 0, "expert cache: empty expert weights (w1 " << w1_bytes << " bytes, w2 "
                                                                                         << w2_bytes << " bytes)");
    const std::size_t stride = round_up(w1_bytes) + round_up(w2_bytes);
    buffer_ = DeviceBuffer(device, stride * static_cast<std::size_t>(slots));
    slots_.resize(static_cast<std::size_t>(slots));
    for (std::size_t i = 0; i < slots_.size(); ++i) {
        slots_[i].data = buffer_.as<char>() + i * stride;
        slots_[i].ready = device.create_event();
        slots_[i].free = device.create_event();
    }
    if (mode_ == Mode::kPrefetch) copy_stream_ = device.create_stream();
}

ExpertCache::~ExpertCache() {
    try {
        if (copy_stream_) copy_stream_->synchronize();
    } catch (const std::exception&) {
    }
}

int ExpertCache::add_layer(const void* host_w1, const void* host_w2, int experts) {
    SCMOE_CHECK(host_w1 && host_w2 && experts > 0, "expert cache: a layer needs its host weights and experts > 0");
    layers_.push_back({static_cast<const char*>(host_w1), static_cast<const char*>(host_w2), experts});
    return static_cast<int>(layers_.size()) - 1;
}

int ExpertCache::find(int layer, int expert) const {
    for (std::size_t i = 0; i < slots_.size(); ++i)
        if (slots_[i].layer == layer && slots_[i].expert == expert) return static_cast<int>(i);
    return -1;
}

int ExpertCache::victim() const {
    int best = -1;
    for (std::size_t i = 0; i < slots_.size(); ++i) {
        const Slot& s = slots_[i];
        if (s.pinned) continue;
        if (best < 0 || s.last_use < slots_[static_cast<std::size_t>(best)].last_use) best = static_cast<int>(i);
    }
    return best;
}

void ExpertCache::copy_into(int index, int layer, int expert, Stream& on) {
    Slot& s = slots_[static_cast<std::size_t>(index)];
    const Layer& l = layers_[static_cast<std::size_t>(layer)];
    // A copy on the copy stream must not overwrite what an FFN on the compute stream still reads.
    if (&on == copy_stream_.get() && s.has_free) on.wait(*s.free);
    if (probe_) probe_(on);
    on.copy(s.data, l.w1 + static_cast<std::size_t>(expert) * w1_bytes_, w1_bytes_);
    on.copy(s.data + round_up(w1_bytes_), l.w2 + static_cast<std::size_t>(expert) * w2_bytes_, w2_bytes_);
    s.ready->record(on);
    s.has_ready = true;
    s.layer = layer;
    s.expert = expert;
    ++stats_.copies;
    stats_.bytes_copied += w1_bytes_ + w2_bytes_;
}

void ExpertCache::prefetch(int layer, const std::vector<int>& experts) {
    SCMOE_CHECK(mode_ == Mode::kPrefetch, "ExpertCache.prefetch: the cache is in blocking mode");
    SCMOE_CHECK(layer >= 0 && layer < static_cast<int>(layers_.size()), "ExpertCache.prefetch: layer " << layer);
    const int limit = static_cast<int>(slots_.size()) - 1;
    auto pin = [&](Slot& s) {
        s.pinned = s.gate_pinned = true;
        s.last_use = ++tick_;
        ++gate_pins_;
    };
    // Hits first (so a miss's eviction never takes an expert this gate chose), then the misses.
    for (int e : experts) {
        const int i = find(layer, e);
        if (i < 0 || gate_pins_ >= limit) continue;
        Slot& s = slots_[static_cast<std::size_t>(i)];
        if (s.pinned) continue;
        pin(s);
        ++stats_.hits;
    }
    for (int e : experts) {
        if (gate_pins_ >= limit) break;
        if (find(layer, e) >= 0) continue;
        const int v = victim();
        if (v < 0) break;
        copy_into(v, layer, e, *copy_stream_);
        pin(slots_[static_cast<std::size_t>(v)]);
    }
}

std::pair<void*, void*> ExpertCache::acquire(int layer, int expert, Stream& compute) {
    SCMOE_CHECK(layer >= 0 && layer < static_cast<int>(layers_.size()) && expert >= 0 &&
                    expert < layers_[static_cast<std::size_t>(layer)].experts,
                "ExpertCache.acquire: layer " << layer << ", expert " << expert << " is not registered");
    int i = mode_ == Mode::kPrefetch ? find(layer, expert) : -1;  // blocking: every chosen expert is copied
    if (i >= 0) {
        Slot& s = slots_[static_cast<std::size_t>(i)];
        if (!s.gate_pinned) ++stats_.hits;
        if (s.has_ready) compute.wait(*s.ready);
    } else {
        i = victim();
        SCMOE_CHECK(i >= 0, "ExpertCache.acquire: every one of the " << slots_.size()
                                                                     << " slots is reserved (internal error)");
        if (mode_ == Mode::kPrefetch) {
            copy_into(i, layer, expert, *copy_stream_);
            compute.wait(*slots_[static_cast<std::size_t>(i)].ready);
            ++stats_.late;
        } else {
            copy_into(i, layer, expert, compute);  // in stream order: after the slot's last reader
        }
    }
    Slot& s = slots_[static_cast<std::size_t>(i)];
    s.pinned = true;
    s.last_use = ++tick_;
    return {s.data, s.data + round_up(w1_bytes_)};
}

void ExpertCache::release(int layer, int expert, Stream& compute) {
    const int i = find(layer, expert);
    SCMOE_CHECK(i >= 0 && slots_[static_cast<std::size_t>(i)].pinned,
                "ExpertCache.release: layer " << layer << ", expert " << expert << " was not acquired");
    Slot& s = slots_[static_cast<std::size_t>(i)];
    s.free->record(compute);
    s.has_free = true;
    s.pinned = false;
    if (s.gate_pinned) {
        s.gate_pinned = false;
        --gate_pins_;
    }
}

std::vector<std::pair<int, int>> ExpertCache::contents() const {
    std::vector<std::pair<int, int>> out;
    for (const Slot& s : slots_) out.emplace_back(s.layer, s.expert);
    return out;
}

namespace {

class PinnedHostMemory final : public Device {
  public:
    explicit PinnedHostMemory(Device& inner) : inner_(inner) {}
    Backend backend() const override { return inner_.backend(); }
    std::string description() const override { return "pinned host memory of " + inner_.description(); }
    DType compute_dtype() const override { return inner_.compute_dtype(); }
    void* allocate(std::size_t bytes) override { return inner_.allocate_host(bytes); }
    void deallocate(void* ptr) override { inner_.deallocate_host(ptr); }
    void* allocate_host(std::size_t bytes) override { return inner_.allocate_host(bytes); }
    void deallocate_host(void* ptr) override { inner_.deallocate_host(ptr); }
    std::unique_ptr<Event> create_event() override { return inner_.create_event(); }
    double host_time_us() const override { return inner_.host_time_us(); }
    int sm_count() const override { return inner_.sm_count(); }
    int ordinal() const override { return inner_.ordinal(); }

  protected:
    std::unique_ptr<Stream> make_stream(StreamPriority priority) override { return inner_.create_stream(priority); }

  private:
    Device& inner_;
};

}  // namespace

std::unique_ptr<Device> pinned_host_memory(Device& inner) { return std::make_unique<PinnedHostMemory>(inner); }

}  // namespace scmoe::models
