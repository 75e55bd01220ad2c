// The teardown sequence of an NCCL communicator, kept apart from NCCL so that it is tested on any
// machine against a fake (tests/comm/nccl_teardown_test.cpp); NcclCommunicator's destructor runs
// it with the real calls (review L4).
//
// NCCL's documentation (Communicator Creation and Management; the non-blocking communicator
// section): ncclCommFinalize flushes the communicator's outstanding work and must come before
// ncclCommDestroy; a call on a non-blocking communicator may return ncclInProgress, and then "users
// must query the communicator state [ncclCommGetAsyncError] until it becomes ncclSuccess before
// calling another NCCL function"; "if an error occurs, destroy the communicator with abort".
#pragma once

#include <functional>


namespace scmoe::comm_detail {

// What an NCCL call reports, without NCCL's types.
enum class NcclState { kSuccess, kInProgress, kError };

struct NcclTeardownCalls {
    std::function<NcclState()> finalize;     // ncclCommFinalize
    std::function<NcclState()> async_state;  // ncclCommGetAsyncError's state
    std::function<void()> destroy;           // ncclCommDestroy
    std::function<void()> abort;             // ncclCommAbort
    std::function<bool()> past_deadline;     // the teardown's time is up (SCMOE_COMM_TIMEOUT_S)
    std::function<void()> pause;             // between polls (a yield)
    // Frees the communicator's device buffers: last, after destroy or abort, since cudaFree waits for
    // the device, and so for a collective that never completes (review 2, #16).
    std::function<void()> release;
};

enum class NcclTeardown {
    kFinalizedAndDestroyed,  // finalize completed, then destroy
    kAbortedAfterError,      // finalize or its completion failed: abort
    kAbortedAfterTimeout,    // finalize never completed within the deadline: abort
};

// finalize; while in progress, poll the state (pausing in between) until success, an error or the
// deadline; then destroy on success, abort otherwise; then release. Never throws on its own (a
// destructor runs it).
NcclTeardown tear_down_nccl(const NcclTeardownCalls& calls);

const char* nccl_teardown_name(NcclTeardown outcome);

}  // namespace scmoe::comm_detail
