// R, the SMs an exchange's kernels need: what compute leaves free while an exchange is meant to
// overlap it (the LayerScheduler sets Stream::set_sm_budget(SMs - R) on its backbone stream then).
//
// Why: a persistent compute kernel (CUTLASS's sm_90 grouped GEMM, 64,512 of 65,536 registers and up
// to 227 KB of shared memory per SM) holds every SM of its grid until it ends, and no NCCL block
// fits beside it (review 2, #6); NCCL runs one CTA, so one SM, per channel. Limited to SMs - R, the
// kernel leaves the exchange R SMs.
//
// R is, in this order:
//   1. SCMOE_COMM_SMS, when set: a count >= 0 (0: reserve nothing; "auto": as unset).
//   2. The communicator's own count where it knows it (Communicator::kernel_sms >= 0: the emulated
//      NCCL's channels; 0 for the in-process and MPI communicators, whose exchanges use no SMs; 1 for
//      an EmulatedLink's hold kernel over them).
//   3. NCCL's channel settings, where set (NCCL User Guide, "Environment Variables"):
//      NCCL_MAX_CTAS (since 2.17; supersedes NCCL_MAX_NCHANNELS), NCCL_MAX_NCHANNELS ("limits the
//      number of channels NCCL can use. Reducing the number of channels also reduces the number of
//      CUDA blocks used for communication") and NCCL_MAX_P2P_NCHANNELS (the exchange is NCCL
//      point-to-point: ncclSend/ncclRecv; NCCL's src/graph/paths.cc, docs/emu-sources.md item 4)
//      cap it, the smallest set one winning; NCCL_MIN_CTAS and NCCL_MIN_NCHANNELS raise it.
//   4. Otherwise 32: NCCL's documented default for the most CTAs a kernel uses (ncclConfig_t
//      maxCTAs: "Set to a positive integer value, up to 32. The default value is 32", NCCL 2.19 User
//      Guide, API Types; NCCL_MIN_NCHANNELS's own default is "platform dependent").
#pragma once

#include <functional>
#include <string>

namespace scmoe {

class Communicator;

// NCCL's documented default for ncclConfig_t::maxCTAs (see above).
inline constexpr int kNcclDefaultMaxCtas = 32;

struct CommSms {
    int sms = 0;
    std::string source;  // where the count comes from: "SCMOE_COMM_SMS", "NCCL_MAX_NCHANNELS", ...
};

// R from the environment `env` (returns a variable's value or nullptr) and the communicator's own
// count (Communicator::kernel_sms; -1: not known), by the rules above. Throws Error naming a variable
// that is set to something else than an integer (>= 0 for SCMOE_COMM_SMS, >= 1 for NCCL's).
CommSms resolve_comm_sms(const std::function<const char*(const char*)>& env, int kernel_sms);

// resolve_comm_sms with the process environment and `comm`'s kernel_sms() (comm may be null).
CommSms default_comm_sms(const Communicator* comm);

}  // namespace scmoe
