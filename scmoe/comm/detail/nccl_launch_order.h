// NCCL_LAUNCH_ORDER_IMPLICIT, scmoe's default (review R1). A rank drives several NCCL communicators
// on one GPU at once: the expert-parallel all-to-alls on the MoE stream and the gradient
// all-reduces (world and expert-data-parallel) on the reducer stream. NCCL's user guide ("Using
// multiple NCCL communicators concurrently"): before 2.26 the operations of all communicators had
// to be serialized into one global order or they could deadlock; from 2.26,
// NCCL_LAUNCH_ORDER_IMPLICIT=1 makes NCCL follow the order in which the host issues them, so the
// host order must match on every device. scmoe issues in one deterministic order on every rank
// (BlockStack agrees its schedule over the world), so it turns the variable on where NCCL has it,
// unless the user set it. NCCL >= 2.31 also has a per-communicator ncclConfig_t.launchOrderImplicit.
// Private to comm/; no NCCL types, so the rule is tested without NCCL.
#pragma once

namespace scmoe::comm_detail {

// NCCL's version code (ncclGetVersion: major * 10000 + minor * 100 + patch) of the first release with
// NCCL_LAUNCH_ORDER_IMPLICIT.
inline constexpr int kNcclLaunchOrderImplicitSince = 22600;

// The value to set NCCL_LAUNCH_ORDER_IMPLICIT to before a communicator is created, or nullptr to
// leave the environment alone: the user's own setting (`current`, any value, even empty) always
// wins, and older NCCL releases do not know the variable.
inline const char* nccl_launch_order_implicit_value(int nccl_version, const char* current) {
    if (current != nullptr) return nullptr;
    return nccl_version >= kNcclLaunchOrderImplicitSince ? "1" : nullptr;
}

}  // namespace scmoe::comm_detail
