#include "scmoe/comm/detail/nccl_teardown.h"

namespace scmoe::comm_detail {

namespace {
NcclTeardown finalize_then_destroy_or_abort(const NcclTeardownCalls& calls) {
    NcclState state = calls.finalize();
    while (state == NcclState::kInProgress) {
        if (calls.past_deadline()) {
            calls.abort();
            return NcclTeardown::kAbortedAfterTimeout;
        }
        calls.pause();
        state = calls.async_state();
    }
    if (state == NcclState::kError) {
        calls.abort();
        return NcclTeardown::kAbortedAfterError;
    }
    calls.destroy();
    return NcclTeardown::kFinalizedAndDestroyed;
}
}  // namespace

NcclTeardown tear_down_nccl(const NcclTeardownCalls& calls) {
    const NcclTeardown outcome = finalize_then_destroy_or_abort(calls);
    calls.release();
    return outcome;
}

const char* nccl_teardown_name(NcclTeardown outcome) {
    switch (outcome) {
        case NcclTeardown::kFinalizedAndDestroyed:
            return "finalized and destroyed";
        case NcclTeardown::kAbortedAfterError:
            return "aborted after an error";
        case NcclTeardown::kAbortedAfterTimeout:
            return "aborted after a timeout";
    }
    return "?";
}

}  // namespace scmoe::comm_detail
