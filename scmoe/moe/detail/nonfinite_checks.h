// NonfiniteChecks: MoeLayer's NaN/Inf input checks (MoeConfig.check_finite) without host callbacks
// in the streams (review L2). A check counts on the device, copies {count, first index} into a
// pinned host slot of its own, and registers a read with Stream::check_at_sync: the stream's next
// synchronize() (the layer's own count exchange in expert parallelism, or the caller's) throws
// naming the tensor and the first offending element. Every check has its own slot, so forwards
// enqueued back to back without a sync cannot overwrite one another's result. Private to moe/.
#pragma once

#include <cstdint>
#include <memory>

#include "scmoe/kernels/device.h"
#include "scmoe/kernels/tensor.h"

namespace scmoe {

class NonfiniteChecks {
public:
    explicit NonfiniteChecks(Device& device);
    NonfiniteChecks(const NonfiniteChecks&) = delete;
    NonfiniteChecks& operator=(const NonfiniteChecks&) = delete;

    // Enqueues the count of t's NaN/Inf into `scratch` (two int64 of stream memory, reused by the
    // checks of one stream) and its read at `stream`'s next synchronize(). `what` is a string
    // literal ("MoeLayer: <what> holds N NaN/Inf value(s), first at [token i, column j]").
    void enqueue(const Tensor& t, std::int64_t* scratch, const char* what, Stream& stream);

    // Pinned slots held by checks not yet read (a test's view of the pool).
    int slots_in_use() const;

private:
    struct Pool;  // shared with the pending checks, which may outlive this object
    std::shared_ptr<Pool> pool_;
};

}  // namespace scmoe
