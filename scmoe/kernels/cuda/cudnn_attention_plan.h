// Host-side arithmetic of the cuDNN attention provider, free of cuDNN and CUDA types so that CPU
// unit tests (tests/unit/attention_cudnn_plan_test.cpp) check it on machines without a GPU:
//   - the strided [batch, heads, seq, dim] views cuDNN gets over scmoe's buffers (no copies),
//   - the key graphs are cached under,
//   - which implementation an attention call runs (the provider choice).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string_view>

#include "scmoe/kernels/attention.h"
#include "scmoe/kernels/dtype.h"
#include "scmoe/kernels/error.h"

namespace scmoe::cuda {

// A 4-d view [batch, heads, seq, dim] into a row-major buffer, in elements.
struct AttentionView {
    std::array<std::int64_t, 4> dims{};
    std::array<std::int64_t, 4> strides{};
    std::int64_t offset = 0;  // of element (0, 0, 0, 0) from the buffer's start
    // Element offset of (b, h, i, e) from the buffer's start.
    std::int64_t at(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t e) const {
        return offset + b * strides[0] + h * strides[1] + i * strides[2] + e * strides[3];
    }
};

// The views of one attention call. qkv rows are [q (heads*head_dim) | k (kv_heads*head_dim) | v],
// token t = b*seq + i (scmoe/kernels/attention.h), so q/k/v share their strides and differ by offset
// and, with GQA, by their head count: k and v are [batch, kv_heads, seq, dim], which cuDNN's SDPA
// takes as grouped-query attention (query head h reads K/V head h / (heads / kv_heads)). dQ/dK/dV
// use the same views over grad_qkv, dO the view `o` over grad_out. stats: lse [batch, heads, seq]
// as [b, h, s, 1]. kv_heads 0 means heads.
struct AttentionViews {
    AttentionView q, k, v, o, stats;
};

inline AttentionViews attention_views(std::int64_t batch, std::int64_t seq, std::int64_t heads, std::int64_t head_dim,
                                      std::int64_t kv_heads = 0) {
    const std::int64_t kv = attention_kv_heads(heads, kv_heads);
    const std::int64_t width = heads * head_dim;  // q in a qkv row; an out row
    const std::int64_t qkv_row = attention_qkv_width(heads, kv_heads, head_dim);
    AttentionViews v;
    v.q.dims = {batch, heads, seq, head_dim};
    v.q.strides = {seq * qkv_row, head_dim, qkv_row, 1};
    v.k = v.q;
    v.k.dims = {batch, kv, seq, head_dim};
    v.k.offset = width;
    v.v = v.k;
    v.v.offset = width + kv * head_dim;
    v.o.dims = {batch, heads, seq, head_dim};
    v.o.strides = {seq * width, head_dim, width, 1};
    v.stats.dims = {batch, heads, seq, 1};
    v.stats.strides = {heads * seq, seq, 1, 1};
    return v;
}

enum class AttentionDirection : std::uint8_t { kForward, kBackward };

// One cuDNN graph per key: built once, then executed for every call of that shape on that device.
struct CudnnAttentionKey {
    int device = 0;
    std::int64_t batch = 0, seq = 0, heads = 0, head_dim = 0;
    DType dtype = DType::kBF16;
    AttentionDirection direction = AttentionDirection::kForward;
    bool with_stats = false;     // forward: lse requested (training); backward: always true
    bool deterministic = false;  // backward: cuDNN's deterministic algorithm; forward: false
    // The SMs the graph's kernels may occupy (Graph::set_sm_count); 0 = every SM, which is what
    // scmoe passes: on an H100 (cuDNN 9.19) every SDPA engine refused 131 of 132 SMs
    // ("target_sm_count != deviceProp.multiProcessorCount"), and the fallback kernel is ~100x slower
    // and gives other bits. A graph is built per count.
    int sm_count = 0;
    std::int64_t kv_heads = 0;  // K/V heads (GQA), the effective count: = heads without GQA
    bool causal = true;         // the SDPA graph's causal mask (AttentionArgs::causal)
    // Spelled out: attention.cu includes this header and may build as C++17 (scmoe/kernels/cuda/CMakeLists.txt).
    bool operator==(const CudnnAttentionKey& o) const {
        return device == o.device && batch == o.batch && seq == o.seq && heads == o.heads && head_dim == o.head_dim &&
               kv_heads == o.kv_heads && dtype == o.dtype && direction == o.direction && with_stats == o.with_stats &&
               deterministic == o.deterministic && sm_count == o.sm_count && causal == o.causal;
    }
};

struct CudnnAttentionKeyHash {
    std::size_t operator()(const CudnnAttentionKey& k) const noexcept {
        std::size_t h = std::hash<int>{}(k.device);
        auto mix = [&h](std::size_t v) { h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2); };
        for (std::int64_t v : {k.batch, k.seq, k.heads, k.head_dim, k.kv_heads}) mix(std::hash<std::int64_t>{}(v));
        mix(static_cast<std::size_t>(k.dtype));
        mix(static_cast<std::size_t>(k.direction));
        mix((k.with_stats ? 1u : 0u) | (k.deterministic ? 2u : 0u) | (k.causal ? 4u : 0u));
        mix(std::hash<int>{}(k.sm_count));
        return h;
    }
};

// The forward has no atomics: one graph whatever SCMOE_ATTENTION_DETERMINISTIC says.
// sm_count: the stream's SM budget (0: every SM).
inline CudnnAttentionKey cudnn_attention_key(int device, const AttentionArgs& a, int sm_count = 0) {
    return {device,
            a.batch,
            a.seq,
            a.heads,
            a.head_dim,
            a.dtype,
            AttentionDirection::kForward,
            a.lse != nullptr,
            false,
            sm_count,
            attention_kv_heads(a.heads, a.kv_heads),
            a.causal};
}
inline CudnnAttentionKey cudnn_attention_key(int device, const AttentionBackwardArgs& a, bool deterministic,
                                             int sm_count = 0) {
    return {device,
            a.batch,
            a.seq,
            a.heads,
            a.head_dim,
            a.dtype,
            AttentionDirection::kBackward,
            true,
            deterministic,
            sm_count,
            attention_kv_heads(a.heads, a.kv_heads),
            a.causal};
}

// cuDNN's fused attention reads 16-byte vectors: every base pointer and every stride must be a
// multiple of 16 bytes, i.e. head_dim a multiple of 8 bf16 elements. 256 is its largest head_dim.
inline constexpr std::int64_t kCudnnAttentionHeadDimMultiple = 8;
inline constexpr std::int64_t kCudnnAttentionMaxHeadDim = 256;
inline constexpr std::size_t kCudnnAttentionAlignmentBytes = 16;

enum class AttentionPath : std::uint8_t { kOwn, kCudnn };

struct AttentionPathChoice {
    AttentionPath path = AttentionPath::kOwn;
    // True when the caller asked for cuDNN explicitly: an unsupported shape throws instead of
    // falling back to the own kernel.
    bool cudnn_required = false;
};

// The provider a call runs with: `requested`, or for kAuto the value of SCMOE_ATTENTION_PROVIDER
// (`env_value`, null or empty when unset). Throws on an unknown value, naming the variable.
inline AttentionProvider effective_attention_provider(AttentionProvider requested, const char* env_value) {
    if (requested != AttentionProvider::kAuto || env_value == nullptr || env_value[0] == '\0') return requested;
    const std::string_view v = env_value;
    for (AttentionProvider p : {AttentionProvider::kAuto, AttentionProvider::kOwn, AttentionProvider::kCudnn})
        if (v == attention_provider_name(p)) return p;
    SCMOE_FAIL("SCMOE_ATTENTION_PROVIDER='" << v << "': expected auto, own or cudnn");
}

// What runs a CUDA attention call. `aligned`: every pointer of the call is 16-byte aligned.
// Explicit kCudnn throws where cuDNN cannot run (not built, dtype, head_dim, alignment); kAuto
// picks cuDNN exactly where it may run and the own kernel elsewhere. `op` names the op in errors.
inline AttentionPathChoice choose_attention_path(const char* op, AttentionProvider provider, DType dtype,
                                                 std::int64_t head_dim, bool aligned, bool cudnn_built) {
    if (provider == AttentionProvider::kOwn) return {AttentionPath::kOwn, false};
    const bool head_dim_ok = head_dim % kCudnnAttentionHeadDimMultiple == 0 && head_dim <= kCudnnAttentionMaxHeadDim;
    if (provider == AttentionProvider::kCudnn) {
        SCMOE_CHECK(cudnn_built, op << ": provider cudnn: this scmoe was built without cuDNN (SCMOE_WITH_CUDNN; "
                                       "cmake/FindCudnnFrontend.cmake)");
        SCMOE_CHECK(dtype == DType::kBF16,
                    op << ": provider cudnn: dtype " << dtype_name(dtype) << " (cuDNN's fused attention is bf16 here)");
        SCMOE_CHECK(head_dim_ok, op << ": provider cudnn: head_dim " << head_dim << " (cuDNN needs a multiple of "
                                    << kCudnnAttentionHeadDimMultiple << ", at most " << kCudnnAttentionMaxHeadDim
                                    << ")");
        SCMOE_CHECK(aligned,
                    op << ": provider cudnn: pointers must be " << kCudnnAttentionAlignmentBytes << "-byte aligned");
        return {AttentionPath::kCudnn, true};
    }
    if (cudnn_built && dtype == DType::kBF16 && head_dim_ok && aligned) return {AttentionPath::kCudnn, false};
    return {AttentionPath::kOwn, false};
}

// SCMOE_ATTENTION_DETERMINISTIC (`env_value`, null or empty when unset) on a device of compute
// capability `cc` (90 for 9.0): "1" runs cuDNN's deterministic backward (bitwise reproducible; with
// cuDNN below 9.25 its dP-workspace path, b*h*s*s*2 bytes of workspace per stream), "0" its faster
// backward with atomic dQ accumulation. Unset: deterministic from sm_90 on, where cuDNN has it; below,
// cuDNN may turn the deterministic graph down or not keep its promise (TransformerEngine disables
// fused attention for determinism below sm_90), so the default there is the atomic backward.
// Throws on any other value.
inline bool attention_deterministic_from_env(const char* env_value, int cc) {
    if (env_value == nullptr || env_value[0] == '\0') return cc >= 90;
    const std::string_view v = env_value;
    if (v == "1") return true;
    if (v == "0") return false;
    SCMOE_FAIL("SCMOE_ATTENTION_DETERMINISTIC='" << v << "': expected 0 or 1");
}

}  // namespace scmoe::cuda

namespace scmoe::detail {
// scmoe/kernels/attention.cpp: counts what attention_stats() reports (`workspace_bytes`: the cuDNN graph's).
void note_attention_call(bool cudnn, bool backward, bool deterministic, std::int64_t workspace_bytes);
}  // namespace scmoe::detail
