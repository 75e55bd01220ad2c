// Attention (causal or not) through the cuDNN frontend's SDPA graphs (cudnn_attention.h). Host C++
// only: the graphs run cuDNN's own fused flash-attention kernels.
//
// NOTES:
//   - Tensors are strided views over scmoe's buffers (cudnn_attention_plan.h); K and V (and dK, dV)
//     are views of kv_heads heads after Q's, passed as offset pointers. kv_heads < heads is cuDNN's
//     native grouped-query attention; where this cuDNN refuses it, the graph's build fails and auto
//     runs the own kernel for the shape (saying so once), explicit cudnn throws with cuDNN's reason.
//   - Any failure while building a graph (validate .. build_plans) means cuDNN cannot run that shape
//     on this device: it is remembered with cuDNN's message. Failures while executing always throw.
//   - Executions of one cached graph are serialised by its mutex (enqueueing only: cheap), so one
//     graph object is never executed from two threads at once.

// The frontend's JSON (de)serialisation of graphs is not used here; leaving it out halves the
// compile time of this file (about 55 s -> 30 s for the header alone with g++ -O2).
#define CUDNN_FRONTEND_SKIP_JSON_LIB
#include "scmoe/kernels/cuda/cudnn_attention.h"

#include <cudnn.h>
#include <cudnn_frontend.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "scmoe/kernels/cuda/check.cuh"
#include "scmoe/kernels/cuda/cudnn_attention_plan.h"
#include "scmoe/kernels/cuda/stream_resources.cuh"
#include "scmoe/kernels/error.h"
#include "scmoe/kernels/math.h"

namespace scmoe::cuda {
namespace {

namespace fe = cudnn_frontend;
using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;

// Tensor uids of the variant packs.
enum Uid : std::int64_t { kUidQ = 1, kUidK, kUidV, kUidO, kUidStats, kUidGradOut, kUidGradQ, kUidGradK, kUidGradV };

// "attention_forward (cuDNN SDPA, bf16 batch=2 seq=100 heads=4 head_dim=64, device 0)": every error names it.
std::string describe(const char* op, const CudnnAttentionKey& k) {
    std::ostringstream os;
    os << op << " (cuDNN SDPA, " << dtype_name(k.dtype) << " batch=" << k.batch << " seq=" << k.seq
       << " heads=" << k.heads;
    if (k.kv_heads != k.heads) os << " kv_heads=" << k.kv_heads;
    os << " head_dim=" << k.head_dim << (k.causal ? "" : ", non-causal") << (k.with_stats ? "" : ", no lse")
       << (k.direction == AttentionDirection::kBackward && !k.deterministic ? ", non-deterministic" : "");
    if (k.sm_count > 0) os << ", " << k.sm_count << " SMs";
    os << ", device " << k.device << ")";
    return os.str();
}

void check_cuda(const std::string& what, const char* call, cudaError_t err) {
    if (err != cudaSuccess)
        SCMOE_FAIL(what << ": " << call << " failed: " << cudaGetErrorName(err) << ": " << cudaGetErrorString(err));
}

void check_cudnn(const std::string& what, const char* call, cudnnStatus_t status) {
    if (status != CUDNN_STATUS_SUCCESS) SCMOE_FAIL(what << ": " << call << " failed: " << cudnnGetErrorString(status));
}

// ---- Per-stream handle and workspace ------------------------------------------------------

struct CudnnStreamState final : StreamExtension {
    cudnnHandle_t handle = nullptr;
    void* workspace = nullptr;  // stream-ordered allocation, grown on demand
    std::int64_t workspace_bytes = 0;
    ~CudnnStreamState() override {
        // NOTES: the stream is idle when its resources go (unregister_stream); cudaFree also takes
        // cudaMallocAsync memory. Errors cannot be reported from a destructor.
        if (workspace) cudaFree(workspace);
        if (handle) cudnnDestroy(handle);
    }
};

// The stream's cuDNN handle (bound to the stream once, at creation), made on first use.
CudnnStreamState& stream_state(cudaStream_t stream, const std::string& what) {
    StreamResources& res = stream_resources(stream);
    static std::mutex mu;  // streams are driven by one thread at a time; guard creation anyway
    std::scoped_lock lock(mu);
    if (!res.cudnn) {
        auto state = std::make_unique<CudnnStreamState>();
        check_cudnn(what, "cudnnCreate", cudnnCreate(&state->handle));
        check_cudnn(what, "cudnnSetStream", cudnnSetStream(state->handle, stream));
        res.cudnn = std::move(state);
    }
    return static_cast<CudnnStreamState&>(*res.cudnn);
}

// At least `bytes` of workspace on the stream. Growing frees the old buffer in stream order, so no
// host synchronisation; graphs are cached, so growth happens once per new largest shape.
void* workspace(CudnnStreamState& state, cudaStream_t stream, std::int64_t bytes, const std::string& what) {
    if (bytes <= 0) return nullptr;
    if (state.workspace_bytes < bytes) {
        if (state.workspace) check_cuda(what, "cudaFreeAsync(workspace)", cudaFreeAsync(state.workspace, stream));
        state.workspace = nullptr;
        state.workspace_bytes = 0;
        check_cuda(what, "cudaMallocAsync(workspace)",
                   cudaMallocAsync(&state.workspace, static_cast<std::size_t>(bytes), stream));
        state.workspace_bytes = bytes;
    }
    return state.workspace;
}

// ---- Graph cache --------------------------------------------------------------------------

struct CachedGraph {
    std::mutex mu;  // guards everything below; held while building and while enqueueing an execution
    bool built = false;
    bool supported = false;
    std::string unsupported_reason;  // cuDNN's message when !supported
    bool fallback_said = false;      // the stderr line of auto's fallback is printed
    std::shared_ptr<fe::graph::Graph> graph;
    std::int64_t workspace_bytes = 0;
};

std::shared_ptr<CachedGraph> cache_entry(const CudnnAttentionKey& key) {
    static std::mutex mu;
    // NOTES: intentionally leaked, like the stream registry: destroying cuDNN plans from a static
    // destructor can run after the CUDA runtime has shut down.
    static auto* cache =
        new std::unordered_map<CudnnAttentionKey, std::shared_ptr<CachedGraph>, CudnnAttentionKeyHash>();
    std::scoped_lock lock(mu);
    std::shared_ptr<CachedGraph>& slot = (*cache)[key];
    if (!slot) slot = std::make_shared<CachedGraph>();
    return slot;
}

std::vector<std::int64_t> to_vector(const std::array<std::int64_t, 4>& a) { return {a.begin(), a.end()}; }

TensorPtr input_tensor(fe::graph::Graph& g, const char* name, Uid uid, const AttentionView& view, fe::DataType_t type) {
    return g.tensor(fe::graph::Tensor_attributes()
                        .set_name(name)
                        .set_uid(uid)
                        .set_dim(to_vector(view.dims))
                        .set_stride(to_vector(view.strides))
                        .set_data_type(type));
}

void set_output(const TensorPtr& t, Uid uid, const AttentionView& view, fe::DataType_t type) {
    t->set_output(true)
        .set_uid(uid)
        .set_dim(to_vector(view.dims))
        .set_stride(to_vector(view.strides))
        .set_data_type(type);
}

fe::DataType_t io_type(DType dtype) {
    SCMOE_CHECK(dtype == DType::kBF16, "cuDNN attention: dtype " << dtype_name(dtype) << " (bf16 only)");
    return fe::DataType_t::BFLOAT16;
}

// sm_count > 0: cuDNN's plans are built for (and its kernels launched on) at most that many SMs.
std::shared_ptr<fe::graph::Graph> new_graph(DType dtype, int sm_count) {
    auto g = std::make_shared<fe::graph::Graph>();
    g->set_io_data_type(io_type(dtype))
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    if (sm_count > 0) g->set_sm_count(sm_count);
    return g;
}

// softmax(scale * q k^T) v. Causal: query i sees keys 0..i, the diagonal band [-inf, 0] from the top
// left; non-causal: no mask, every key.
std::shared_ptr<fe::graph::Graph> forward_graph(const CudnnAttentionKey& k) {
    const AttentionViews views = attention_views(k.batch, k.seq, k.heads, k.head_dim, k.kv_heads);
    const fe::DataType_t io = io_type(k.dtype);
    auto g = new_graph(k.dtype, k.sm_count);
    TensorPtr q = input_tensor(*g, "q", kUidQ, views.q, io);
    TensorPtr kk = input_tensor(*g, "k", kUidK, views.k, io);
    TensorPtr v = input_tensor(*g, "v", kUidV, views.v, io);
    auto options = fe::graph::SDPA_attributes()
                       .set_name("scmoe_attention_forward")
                       .set_generate_stats(k.with_stats)
                       .set_attn_scale(math::attention_scale(k.head_dim));
    if (k.causal) options.set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT).set_diagonal_band_right_bound(0);
    auto [o, stats] = g->sdpa(q, kk, v, options);
    set_output(o, kUidO, views.o, io);
    if (k.with_stats) set_output(stats, kUidStats, views.stats, fe::DataType_t::FLOAT);
    return g;
}

std::shared_ptr<fe::graph::Graph> backward_graph(const CudnnAttentionKey& k) {
    const AttentionViews views = attention_views(k.batch, k.seq, k.heads, k.head_dim, k.kv_heads);
    const fe::DataType_t io = io_type(k.dtype);
    auto g = new_graph(k.dtype, k.sm_count);
    TensorPtr q = input_tensor(*g, "q", kUidQ, views.q, io);
    TensorPtr kk = input_tensor(*g, "k", kUidK, views.k, io);
    TensorPtr v = input_tensor(*g, "v", kUidV, views.v, io);
    TensorPtr o = input_tensor(*g, "o", kUidO, views.o, io);
    TensorPtr grad_out = input_tensor(*g, "grad_out", kUidGradOut, views.o, io);
    TensorPtr stats = input_tensor(*g, "lse", kUidStats, views.stats, fe::DataType_t::FLOAT);
    auto options = fe::graph::SDPA_backward_attributes()
                       .set_name("scmoe_attention_backward")
                       .set_attn_scale(math::attention_scale(k.head_dim))
                       .set_deterministic_algorithm(k.deterministic);
    if (k.causal) options.set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT).set_diagonal_band_right_bound(0);
    auto [dq, dk, dv] = g->sdpa_backward(q, kk, v, o, grad_out, stats, options);
    set_output(dq, kUidGradQ, views.q, io);
    set_output(dk, kUidGradK, views.k, io);
    set_output(dv, kUidGradV, views.v, io);
    return g;
}

// A deterministic backward's workspace above this is reported once on stderr: with cuDNN below 9.25
// it grows with b*h*s*s (201 MB at 8x12x1024, 17 GB at 4x32x8192), per stream.
constexpr std::int64_t kReportedWorkspaceBytes = std::int64_t{256} << 20;

// Builds entry.graph for `key` (entry.mu held). A step that fails, or a frontend call that throws
// while the graph is put together (its sdpa node refuses a shape by throwing), leaves entry
// unsupported with cuDNN's message; the caller decides whether that throws.
void build(CachedGraph& entry, const CudnnAttentionKey& key, cudnnHandle_t handle) {
    entry.built = true;
    std::shared_ptr<fe::graph::Graph> g;
    try {
        g = key.direction == AttentionDirection::kForward ? forward_graph(key) : backward_graph(key);
    } catch (const std::exception& e) {
        entry.unsupported_reason = std::string("building the graph: ") + e.what();
        return;
    }
    auto step = [&entry](const char* name, fe::error_t err) {
        if (err.is_good()) return true;
        entry.unsupported_reason = std::string(name) + ": " + err.get_message();
        return false;
    };
    std::int64_t workspace_bytes = 0;
    const bool ok =
        step("validate", g->validate()) && step("build_operation_graph", g->build_operation_graph(handle)) &&
        step("create_execution_plans", g->create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK})) &&
        step("check_support", g->check_support()) &&
        step("build_plans", g->build_plans(fe::BuildPlanPolicy_t::HEURISTICS_CHOICE)) &&
        step("get_workspace_size", g->get_workspace_size(workspace_bytes));
    if (!ok) return;
    entry.graph = std::move(g);
    entry.workspace_bytes = workspace_bytes;
    entry.supported = true;
    if (key.direction == AttentionDirection::kBackward && key.deterministic &&
        workspace_bytes > kReportedWorkspaceBytes)
        std::fprintf(stderr,
                     "scmoe: %s: cuDNN's deterministic backward needs %.0f MiB of workspace on each stream that runs "
                     "it (cuDNN %zu); SCMOE_ATTENTION_DETERMINISTIC=0 runs its atomic backward without it\n",
                     describe("attention_backward", key).c_str(), static_cast<double>(workspace_bytes) / (1 << 20),
                     cudnnGetVersion());
}

int compute_capability(int device) {
    int major = 0, minor = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
    return major * 10 + minor;
}

// Runs the graph of `key` with `pack`; false when unsupported and not required (see header).
bool run(const char* op, const CudnnAttentionKey& key, std::unordered_map<std::int64_t, void*>& pack,
         cudaStream_t stream, bool required) {
    const std::string what = describe(op, key);
    CudnnStreamState& state = stream_state(stream, what);
    std::shared_ptr<CachedGraph> entry = cache_entry(key);
    std::scoped_lock lock(entry->mu);
    if (!entry->built) build(*entry, key, state.handle);
    if (!entry->supported) {
        SCMOE_CHECK(!required, what << ": not supported by cuDNN " << cudnnGetVersion() << " on sm_"
                                    << compute_capability(key.device) << ": " << entry->unsupported_reason);
        if (!entry->fallback_said) {
            const bool deterministic_bwd = key.direction == AttentionDirection::kBackward && key.deterministic;
            std::fprintf(stderr,
                         "scmoe: %s: not supported by cuDNN %zu on sm_%d (%s); running the own attention kernel "
                         "for this shape (SCMOE_ATTENTION_PROVIDER=own selects it everywhere%s)\n",
                         what.c_str(), cudnnGetVersion(), compute_capability(key.device),
                         entry->unsupported_reason.c_str(),
                         deterministic_bwd ? "; SCMOE_ATTENTION_DETERMINISTIC=0 tries cuDNN's non-deterministic "
                                             "backward"
                                           : "");
            entry->fallback_said = true;
        }
        return false;
    }
    void* ws = workspace(state, stream, entry->workspace_bytes, what);
    fe::error_t err = entry->graph->execute(state.handle, pack, ws);
    if (err.is_bad()) SCMOE_FAIL(what << ": execute failed: " << err.get_message());
    detail::note_attention_call(true, key.direction == AttentionDirection::kBackward, key.deterministic,
                                entry->workspace_bytes);
    return true;
}

void* at(const void* base, const AttentionView& view, DType dtype) {
    return const_cast<char*>(static_cast<const char*>(base)) +
           view.offset * static_cast<std::int64_t>(dtype_size(dtype));
}

}  // namespace

bool cudnn_attention_forward(const AttentionArgs& a, cudaStream_t stream, bool required) {
    const CudnnAttentionKey key = cudnn_attention_key(stream_device(stream), a, /*sm_count=*/0);
    const AttentionViews views = attention_views(a.batch, a.seq, a.heads, a.head_dim, a.kv_heads);
    std::unordered_map<std::int64_t, void*> pack = {
        {kUidQ, at(a.qkv, views.q, a.dtype)},
        {kUidK, at(a.qkv, views.k, a.dtype)},
        {kUidV, at(a.qkv, views.v, a.dtype)},
        {kUidO, a.out},
    };
    if (a.lse) pack[kUidStats] = a.lse;
    return run("attention_forward", key, pack, stream, required);
}

bool cudnn_attention_backward(const AttentionBackwardArgs& a, cudaStream_t stream, bool required) {
    const int device = stream_device(stream);
    const bool deterministic =
        attention_deterministic_from_env(std::getenv("SCMOE_ATTENTION_DETERMINISTIC"), compute_capability(device));
    const CudnnAttentionKey key = cudnn_attention_key(device, a, deterministic, /*sm_count=*/0);
    const AttentionViews views = attention_views(a.batch, a.seq, a.heads, a.head_dim, a.kv_heads);
    std::unordered_map<std::int64_t, void*> pack = {
        {kUidQ, at(a.qkv, views.q, a.dtype)},          {kUidK, at(a.qkv, views.k, a.dtype)},
        {kUidV, at(a.qkv, views.v, a.dtype)},          {kUidO, const_cast<void*>(a.out)},
        {kUidGradOut, const_cast<void*>(a.grad_out)},  {kUidStats, const_cast<float*>(a.lse)},
        {kUidGradQ, at(a.grad_qkv, views.q, a.dtype)}, {kUidGradK, at(a.grad_qkv, views.k, a.dtype)},
        {kUidGradV, at(a.grad_qkv, views.v, a.dtype)},
    };
    return run("attention_backward", key, pack, stream, required);
}

}  // namespace scmoe::cuda
