// The NCCL communicator teardown (review L4) against a fake NCCL: the calls it makes, in order, for
// each way finalize can end; the device buffers are released last in every case (review 2, #16). NcclCommunicator's destructor runs the same sequence with NCCL.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "scmoe/comm/detail/nccl_teardown.h"

namespace scmoe::comm_detail {
namespace {

// A fake communicator: finalize answers `first`, then each poll the next of `polls` (the last one
// repeating); it logs every call.
struct FakeNccl {
    NcclState first = NcclState::kSuccess;
    std::vector<NcclState> polls;
    int deadline_after_polls = 1000;  // past_deadline() turns true after this many polls
    std::vector<std::string> log;
    std::size_t polled = 0;

    NcclTeardownCalls calls() {
        return {[this] {
                    log.push_back("finalize");
                    return first;
                },
                [this] {
                    log.push_back("poll");
                    const NcclState s = polls.empty() ? NcclState::kSuccess : polls[std::min(polled, polls.size() - 1)];
                    ++polled;
                    return s;
                },
                [this] { log.push_back("destroy"); },
                [this] { log.push_back("abort"); },
                [this] { return static_cast<int>(polled) >= deadline_after_polls; },
                [this] { log.push_back("pause"); },
                [this] { log.push_back("release"); }};
    }
};

using Log = std::vector<std::string>;

TEST(NcclTeardown, FinalizeThatCompletesAtOnceIsFollowedByDestroy) {
    FakeNccl nccl;
    EXPECT_EQ(tear_down_nccl(nccl.calls()), NcclTeardown::kFinalizedAndDestroyed);
    EXPECT_EQ(nccl.log, (Log{"finalize", "destroy", "release"}));
}

// A non-blocking communicator: finalize in progress, polled until it succeeds; nothing else is
// called before that (NCCL: no other call while a call is in progress).
TEST(NcclTeardown, FinalizeInProgressIsPolledToCompletionBeforeDestroy) {
    FakeNccl nccl;
    nccl.first = NcclState::kInProgress;
    nccl.polls = {NcclState::kInProgress, NcclState::kInProgress, NcclState::kSuccess};
    EXPECT_EQ(tear_down_nccl(nccl.calls()), NcclTeardown::kFinalizedAndDestroyed);
    EXPECT_EQ(nccl.log, (Log{"finalize", "pause", "poll", "pause", "poll", "pause", "poll", "destroy", "release"}));
}

TEST(NcclTeardown, AnErrorWhileFinalizingAborts) {
    FakeNccl in_finalize;
    in_finalize.first = NcclState::kError;
    EXPECT_EQ(tear_down_nccl(in_finalize.calls()), NcclTeardown::kAbortedAfterError);
    EXPECT_EQ(in_finalize.log, (Log{"finalize", "abort", "release"}));
    FakeNccl in_poll;
    in_poll.first = NcclState::kInProgress;
    in_poll.polls = {NcclState::kInProgress, NcclState::kError};
    EXPECT_EQ(tear_down_nccl(in_poll.calls()), NcclTeardown::kAbortedAfterError);
    EXPECT_EQ(in_poll.log, (Log{"finalize", "pause", "poll", "pause", "poll", "abort", "release"}));
}

// A peer that never finalizes: the teardown gives up at the deadline and aborts; it never hangs.
TEST(NcclTeardown, FinalizeThatNeverCompletesAbortsAtTheDeadline) {
    FakeNccl nccl;
    nccl.first = NcclState::kInProgress;
    nccl.polls = {NcclState::kInProgress};
    nccl.deadline_after_polls = 3;
    EXPECT_EQ(tear_down_nccl(nccl.calls()), NcclTeardown::kAbortedAfterTimeout);
    EXPECT_EQ(nccl.log, (Log{"finalize", "pause", "poll", "pause", "poll", "pause", "poll", "abort", "release"}));
    EXPECT_STREQ(nccl_teardown_name(NcclTeardown::kAbortedAfterTimeout), "aborted after a timeout");
}

}  // namespace
}  // namespace scmoe::comm_detail
