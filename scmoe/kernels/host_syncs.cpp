#include "scmoe/kernels/host_syncs.h"

namespace scmoe {
namespace {
thread_local std::uint64_t syncs = 0;
}  // namespace

std::uint64_t host_syncs_this_thread() { return syncs; }

namespace detail {
void count_host_sync() { ++syncs; }
}  // namespace detail

}  // namespace scmoe
