#include "scmoe/moe/detail/nonfinite_checks.h"

#include <mutex>
#include <vector>

#include "scmoe/kernels/elementwise.h"
#include "scmoe/kernels/error.h"

namespace scmoe {

// NOTES: slots come in pinned chunks of kSlotsPerChunk {count, first} pairs; a check takes one
// when enqueued and gives it back when its read has run (or been dropped with its stream). The
// chunks are freed with the pool, i.e. after the layer and every pending check are gone.
struct NonfiniteChecks::Pool {
    static constexpr int kSlotsPerChunk = 32;
    Device& device;
    mutable std::mutex mu;
    std::vector<void*> chunks;
    std::vector<std::int64_t*> free_slots;
    int in_use = 0;

    explicit Pool(Device& d) : device(d) {}
    ~Pool() {
        for (void* c : chunks) device.deallocate_host(c);
    }
    std::int64_t* acquire() {
        std::scoped_lock lock(mu);
        if (free_slots.empty()) {
            auto* chunk = static_cast<std::int64_t*>(device.allocate_host(2 * kSlotsPerChunk * sizeof(std::int64_t)));
            chunks.push_back(chunk);
            for (int i = kSlotsPerChunk - 1; i >= 0; --i) free_slots.push_back(chunk + 2 * i);
        }
        std::int64_t* slot = free_slots.back();
        free_slots.pop_back();
        ++in_use;
        return slot;
    }
    void release(std::int64_t* slot) {
        std::scoped_lock lock(mu);
        free_slots.push_back(slot);
        --in_use;
    }
};

NonfiniteChecks::NonfiniteChecks(Device& device) : pool_(std::make_shared<Pool>(device)) {}

int NonfiniteChecks::slots_in_use() const {
    std::scoped_lock lock(pool_->mu);
    return pool_->in_use;
}

void NonfiniteChecks::enqueue(const Tensor& t, std::int64_t* scratch, const char* what, Stream& stream) {
    std::int64_t* host = pool_->acquire();
    count_nonfinite(t.data, t.numel(), t.dtype, scratch, scratch + 1, stream);
    stream.copy(host, scratch, 2 * sizeof(std::int64_t));
    const std::int64_t width = t.ndim > 1 ? t.dim(1) : 1;
    // The slot goes back to the pool when the check is destroyed: after it ran, or with a stream
    // destroyed unsynchronized.
    std::shared_ptr<std::int64_t> slot(host, [pool = pool_](std::int64_t* p) { pool->release(p); });
    stream.check_at_sync([slot, what, width] {
        const std::int64_t count = slot.get()[0], first = slot.get()[1];
        if (count > 0)
            SCMOE_FAIL("MoeLayer: " << what << " holds " << count << " NaN/Inf value(s), first at [token "
                                    << first / width << ", column " << first % width << "]");
    });
}

}  // namespace scmoe
