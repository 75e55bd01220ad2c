// Private: per-stream resources of the CUDA backend, looked up from the cudaStream_t an op gets.
//
// Ops receive only a cudaStream_t, but cuBLAS needs a handle bound to that stream (with its own
// workspace, set once) and some ops need a little device scratch (router statistics). Streams made
// by CudaDevice register their resources at creation; any other stream (a host trainer's own) gets
// them created on first use and kept for the life of the process.
//
// NOTES: work on one stream is serialised, so a stream's scratch is never used by two ops at once.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <memory>

namespace scmoe::cuda {

// Per-stream state of an optional library (cuDNN attention: its handle and workspace), made by the
// library's first op on the stream and destroyed with the stream's resources.
struct StreamExtension {
    virtual ~StreamExtension() = default;
};

struct StreamResources {
    int device = 0;
    cublasHandle_t cublas = nullptr;  // bound to the stream, workspace set; take it through cublas_handle()
    void* cublas_workspace = nullptr;
    void* scratch = nullptr;      // kScratchBytes of device memory, 256-byte aligned
    void* host_pinned = nullptr;  // pinned host staging, grown on demand (see host_staging)
    std::size_t host_pinned_bytes = 0;
    std::unique_ptr<StreamExtension> cudnn;    // scmoe/kernels/cuda/cudnn_attention.cpp; null until first used
    std::unique_ptr<StreamExtension> cutlass;  // scmoe/kernels/cuda/cutlass_grouped_gemm.cuh: initialized GEMMs
    // Stream::set_sm_budget of the backend's Stream (0: every SM): the grid limit of the persistent
    // grouped GEMM (cutlass-grouped) enqueued from now on. Streams the backend did not create keep 0.
    int sm_budget = 0;
};

constexpr std::size_t kCublasWorkspaceBytes = std::size_t{32} << 20;  // what cuBLAS recommends on Hopper
constexpr std::size_t kScratchBytes = std::size_t{1} << 20;

// Creates and registers the resources of a stream created by the backend (device current).
void register_stream(cudaStream_t stream, int device);
// Frees them; the stream must be idle.
void unregister_stream(cudaStream_t stream) noexcept;
// The stream's resources; created on first use for streams the backend did not create.
StreamResources& stream_resources(cudaStream_t stream);
// The stream's cuBLAS handle. It keeps cuBLAS's default SM count target (every SM) whatever the
// stream's SM budget: a target changes cuBLAS's kernel choice and with it the result's bits, and
// overlap on and off must give the same bits (an H100 run of scmoe-bench block showed 76818
// elements differing between them while the target followed the budget). cuBLAS's kernels are not
// persistent: an exchange's kernels become resident as their blocks finish.
cublasHandle_t cublas_handle(StreamResources& res);
// Pinned host memory of at least `bytes` owned by the stream (reallocated when too small).
void* host_staging(StreamResources& res, std::size_t bytes);

}  // namespace scmoe::cuda
