#include "scmoe/kernels/attention.h"

#include <algorithm>
#include <atomic>
#include <string_view>

#include "scmoe/kernels/error.h"

namespace scmoe {
namespace {

void check_common(const char* op, std::int64_t batch, std::int64_t seq, std::int64_t heads, std::int64_t head_dim,
                  DType dtype, Backend backend) {
    SCMOE_CHECK(batch > 0 && seq > 0 && heads > 0 && head_dim > 0,
                op << ": batch, seq, heads and head_dim must be positive, got batch=" << batch << " seq=" << seq
                   << " heads=" << heads << " head_dim=" << head_dim);
    SCMOE_CHECK(dtype == DType::kF32 || (dtype == DType::kBF16 && backend != Backend::kCpu),
                op << ": dtype " << dtype_name(dtype) << " not supported on " << backend_name(backend)
                   << " (CPU: f32; CUDA: f32 or bf16)");
    SCMOE_CHECK(backend == Backend::kCpu || head_dim <= kAttentionCudaMaxHeadDim,
                op << ": head_dim " << head_dim << " exceeds the CUDA kernels' limit " << kAttentionCudaMaxHeadDim);
}

void check_kv_heads(const char* op, std::int64_t heads, std::int64_t kv_heads) {
    SCMOE_CHECK(kv_heads >= 0 && (kv_heads == 0 || (kv_heads <= heads && heads % kv_heads == 0)),
                op << ": kv_heads " << kv_heads << " must divide heads " << heads << " (0: kv_heads = heads)");
}

}  // namespace

void check_attention_args(const AttentionArgs& a, Backend backend) {
    check_common("attention_forward", a.batch, a.seq, a.heads, a.head_dim, a.dtype, backend);
    check_kv_heads("attention_forward", a.heads, a.kv_heads);
    SCMOE_CHECK(a.qkv && a.out, "attention_forward: qkv and out must not be null");
}

void check_attention_backward_args(const AttentionBackwardArgs& a, Backend backend) {
    check_common("attention_backward", a.batch, a.seq, a.heads, a.head_dim, a.dtype, backend);
    check_kv_heads("attention_backward", a.heads, a.kv_heads);
    SCMOE_CHECK(a.qkv && a.out && a.lse && a.grad_out && a.grad_qkv,
                "attention_backward: qkv, out, lse, grad_out and grad_qkv must not be null");
    SCMOE_CHECK(a.grad_qkv != a.qkv && a.grad_qkv != a.grad_out,
                "attention_backward: grad_qkv must not alias qkv or grad_out");
}

const char* attention_provider_name(AttentionProvider provider) {
    switch (provider) {
        case AttentionProvider::kAuto:
            return "auto";
        case AttentionProvider::kOwn:
            return "own";
        case AttentionProvider::kCudnn:
            return "cudnn";
    }
    return "unknown";
}

AttentionProvider parse_attention_provider(const char* name) {
    const std::string_view n = name ? name : "";
    if (n == "auto") return AttentionProvider::kAuto;
    if (n == "own") return AttentionProvider::kOwn;
    if (n == "cudnn") return AttentionProvider::kCudnn;
    SCMOE_FAIL("attention provider '" << n << "': expected auto, own or cudnn");
}

// SCMOE_WITH_CUDNN: 1 when scmoe/kernels/cuda/cudnn_attention.cpp is built (top-level CMakeLists.txt).
#if defined(SCMOE_WITH_CUDNN) && SCMOE_WITH_CUDNN
bool attention_cudnn_built() { return true; }
#else
bool attention_cudnn_built() { return false; }
#endif

namespace {
struct AttentionCounters {
    std::atomic<long long> cudnn_forward{0}, cudnn_backward{0}, cudnn_deterministic_backward{0}, own_forward{0},
        own_backward{0};
    std::atomic<std::int64_t> cudnn_max_workspace_bytes{0};
};
AttentionCounters& attention_counters() {
    static AttentionCounters counters;
    return counters;
}
}  // namespace

AttentionStats attention_stats() {
    const AttentionCounters& c = attention_counters();
    return {c.cudnn_forward.load(), c.cudnn_backward.load(), c.cudnn_deterministic_backward.load(),
            c.own_forward.load(), c.own_backward.load(), c.cudnn_max_workspace_bytes.load()};
}

namespace detail {
void note_attention_call(bool cudnn, bool backward, bool deterministic, std::int64_t workspace_bytes) {
    AttentionCounters& c = attention_counters();
    if (!cudnn) {
        (backward ? c.own_backward : c.own_forward).fetch_add(1);
        return;
    }
    (backward ? c.cudnn_backward : c.cudnn_forward).fetch_add(1);
    if (backward && deterministic) c.cudnn_deterministic_backward.fetch_add(1);
    std::int64_t seen = c.cudnn_max_workspace_bytes.load();
    while (workspace_bytes > seen && !c.cudnn_max_workspace_bytes.compare_exchange_weak(seen, workspace_bytes)) {
    }
}
}  // namespace detail

void check_attention_provider(AttentionProvider provider, Backend backend) {
    SCMOE_CHECK(backend != Backend::kCpu || provider != AttentionProvider::kCudnn,
                "attention provider cudnn needs the CUDA backend; the CPU backend has auto and own");
}

}  // namespace scmoe
