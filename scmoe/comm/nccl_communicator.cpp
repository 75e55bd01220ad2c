#include "scmoe/comm/nccl_communicator.h"

#include <cuda_runtime.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include "scmoe/comm/detail/collective_util.h"
#include "scmoe/comm/detail/cuda_util.h"
#include "scmoe/comm/detail/nccl_launch_order.h"
#include "scmoe/comm/detail/nccl_teardown.h"
#include "scmoe/kernels/error.h"

namespace scmoe {
namespace {

using comm_detail::DeviceScope;
using comm_detail::is_device_pointer;

using Clock = std::chrono::steady_clock;

Clock::time_point deadline_after(double seconds) {
    return Clock::now() +
           std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(std::min(seconds, 1e9)));
}

void check_cuda(cudaError_t e, int rank, const char* op, const char* call) {
    SCMOE_CHECK(e == cudaSuccess, "rank " << rank << ": " << op << ": " << call << ": " << cudaGetErrorString(e));
}

ncclDataType_t nccl_type(DType dtype) {
    switch (dtype) {
        case DType::kF32:
            return ncclFloat32;
        case DType::kBF16:
            return ncclBfloat16;
        case DType::kI32:
            return ncclInt32;
    }
    SCMOE_FAIL("no NCCL type for dtype " << dtype_name(dtype));
}

}  // namespace

struct NcclCommunicator::Staging {
    std::int64_t* counts_device = nullptr;   // [2n]: send counts, then received counts
    std::int64_t* counts_host = nullptr;     // [2n] pinned: the same, read back
    std::int32_t* barrier_device = nullptr;  // [1] the barrier's all-reduce element
};

NcclCommunicator::NcclCommunicator(ncclComm_t comm, bool owned, int device, double timeout_s)
    : comm_(comm), owned_(owned), device_(device), timeout_s_(timeout_s), staging_(std::make_unique<Staging>()) {
    SCMOE_CHECK(timeout_s > 0.0, "NcclCommunicator timeout " << timeout_s << " s must be positive");
    SCMOE_CHECK(comm != nullptr, "NcclCommunicator: null ncclComm_t");
    DeviceScope scope(device_);
    check_nccl(ncclCommUserRank(comm_, &rank_), "init", "ncclCommUserRank");
    check_nccl(ncclCommCount(comm_, &size_), "init", "ncclCommCount");
    const std::size_t n = static_cast<std::size_t>(size_);
    check_cuda(cudaMalloc(reinterpret_cast<void**>(&staging_->counts_device), 2 * n * sizeof(std::int64_t)), rank_,
               "init", "cudaMalloc");
    check_cuda(cudaMallocHost(reinterpret_cast<void**>(&staging_->counts_host), 2 * n * sizeof(std::int64_t)), rank_,
               "init", "cudaMallocHost");
    check_cuda(cudaMalloc(reinterpret_cast<void**>(&staging_->barrier_device), sizeof(std::int32_t)), rank_, "init",
               "cudaMalloc");
    check_cuda(cudaMemset(staging_->barrier_device, 0, sizeof(std::int32_t)), rank_, "init", "cudaMemset");
}

NcclCommunicator::~NcclCommunicator() {
    int previous = -1;
    if (cudaGetDevice(&previous) != cudaSuccess) previous = -1;
    cudaSetDevice(device_);
    // NOTES: errors ignored: a destructor cannot throw, and the job is going down anyway.
    auto release_staging = [this] {
        if (!staging_) return;
        cudaFree(staging_->counts_device);
        cudaFreeHost(staging_->counts_host);
        cudaFree(staging_->barrier_device);
        staging_.reset();
    };
    if (owned_ && comm_ != nullptr && !broken_) {
        // Review L4: finalize (flushing outstanding work), polled to completion on a non-blocking
        // communicator, then destroy; abort on an error or the timeout (scmoe/comm/detail/nccl_teardown.h).
        using comm_detail::NcclState;
        ncclComm_t comm = comm_;
        const auto deadline = deadline_after(timeout_s_);
        auto state_of = [](ncclResult_t r) {
            return r == ncclSuccess ? NcclState::kSuccess : r == ncclInProgress ? NcclState::kInProgress : NcclState::kError;
        };
        comm_detail::tear_down_nccl({[&] { return state_of(ncclCommFinalize(comm)); },
                                     [&] {
                                         ncclResult_t state = ncclSuccess;
                                         if (ncclCommGetAsyncError(comm, &state) != ncclSuccess) return NcclState::kError;
                                         return state_of(state);
                                     },
                                     [&] { ncclCommDestroy(comm); }, [&] { ncclCommAbort(comm); },
                                     [&] { return Clock::now() > deadline; }, [] { std::this_thread::yield(); },
                                     release_staging});
    }
    release_staging();  // a communicator not owned, or broken (already aborted): nothing outstanding
    if (previous >= 0) cudaSetDevice(previous);
}

std::unique_ptr<NcclCommunicator> NcclCommunicator::init(const ncclUniqueId& id, int rank, int size, int device,
                                                         double timeout_s) {
    SCMOE_CHECK(size >= 1 && rank >= 0 && rank < size, "NcclCommunicator: rank " << rank << " of " << size);
    SCMOE_CHECK(timeout_s > 0.0, "NcclCommunicator timeout " << timeout_s << " s must be positive");
    DeviceScope scope(device);
    int version = 0;
    if (ncclGetVersion(&version) == ncclSuccess) {
        // Before NCCL reads its environment (at the first communicator of the process).
        if (const char* value =
                comm_detail::nccl_launch_order_implicit_value(version, std::getenv("NCCL_LAUNCH_ORDER_IMPLICIT")))
            setenv("NCCL_LAUNCH_ORDER_IMPLICIT", value, 0);
    }
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // so that a peer that never joins gives a timeout, not a hang
    ncclComm_t comm = nullptr;
    ncclResult_t r = ncclCommInitRankConfig(&comm, size, id, rank, &config);
    const auto deadline = deadline_after(timeout_s);
    while (r == ncclInProgress) {
        if (ncclCommGetAsyncError(comm, &r) != ncclSuccess) break;
        if (r != ncclInProgress) break;
        if (Clock::now() > deadline) {
            ncclCommAbort(comm);
            SCMOE_FAIL("rank " << rank << ": NCCL init timed out after " << comm_detail::format_seconds(timeout_s)
                               << " s waiting for the other " << size - 1 << " ranks (SCMOE_COMM_TIMEOUT_S)");
        }
        std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    if (r != ncclSuccess) {
        if (comm != nullptr) ncclCommAbort(comm);
        SCMOE_FAIL("rank " << rank << ": NCCL init: ncclCommInitRankConfig: " << ncclGetErrorString(r));
    }
    return std::unique_ptr<NcclCommunicator>(new NcclCommunicator(comm, /*owned=*/true, device, timeout_s));
}

#if SCMOE_WITH_MPI
std::unique_ptr<NcclCommunicator> NcclCommunicator::from_mpi(MPI_Comm comm, int device, double timeout_s) {
    int rank = 0, size = 1;
    SCMOE_CHECK(MPI_Comm_rank(comm, &rank) == MPI_SUCCESS && MPI_Comm_size(comm, &size) == MPI_SUCCESS,
                "NcclCommunicator::from_mpi: not a valid MPI communicator");
    ncclUniqueId id{};
    if (rank == 0) {
        const ncclResult_t r = ncclGetUniqueId(&id);
        SCMOE_CHECK(r == ncclSuccess, "rank 0: ncclGetUniqueId: " << ncclGetErrorString(r));
    }
    SCMOE_CHECK(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, comm) == MPI_SUCCESS,
                "rank " << rank << ": MPI_Bcast of the ncclUniqueId failed");
    return init(id, rank, size, device, timeout_s);
}
#endif

std::unique_ptr<NcclCommunicator> NcclCommunicator::from_file(const std::string& path, int rank, int size, int device,
                                                              double timeout_s) {
    SCMOE_CHECK(size >= 1 && rank >= 0 && rank < size, "NcclCommunicator: rank " << rank << " of " << size);
    ncclUniqueId id{};
    if (rank == 0) {
        const ncclResult_t r = ncclGetUniqueId(&id);
        SCMOE_CHECK(r == ncclSuccess, "rank 0: ncclGetUniqueId: " << ncclGetErrorString(r));
        // Written whole to a temporary name, then renamed: readers see no file or a complete one.
        const std::string tmp = path + ".tmp." + std::to_string(getpid());
        {
            std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
            out.write(reinterpret_cast<const char*>(&id), sizeof(id));
            out.close();
            SCMOE_CHECK(out.good(), "rank 0: cannot write the NCCL id to '" << tmp << "'");
        }
        std::error_code ec;
        std::filesystem::rename(tmp, path, ec);
        SCMOE_CHECK(!ec, "rank 0: cannot rename '" << tmp << "' to '" << path << "': " << ec.message());
    } else {
        const auto deadline = deadline_after(timeout_s);
        while (true) {
            std::ifstream in(path, std::ios::binary);
            if (in && in.read(reinterpret_cast<char*>(&id), sizeof(id)) && in.gcount() == sizeof(id)) break;
            SCMOE_CHECK(Clock::now() < deadline,
                        "rank " << rank << ": NCCL init timed out after " << comm_detail::format_seconds(timeout_s)
                                << " s waiting for rank 0 to write '" << path << "' (SCMOE_COMM_TIMEOUT_S)");
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
    }
    auto comm = init(id, rank, size, device, timeout_s);
    // Every rank has read the id once the communicator exists.
    if (rank == 0) {
        std::error_code ec;
        std::filesystem::remove(path, ec);
    }
    return comm;
}

std::unique_ptr<NcclCommunicator> NcclCommunicator::borrow(ncclComm_t comm, int device, double timeout_s) {
    return std::unique_ptr<NcclCommunicator>(new NcclCommunicator(comm, /*owned=*/false, device, timeout_s));
}

std::string NcclCommunicator::name() const {
    return "nccl(rank " + std::to_string(rank_) + " of " + std::to_string(size_) + ", cuda:" + std::to_string(device_) +
           ")";
}

void NcclCommunicator::check_usable(const char* op) const {
    if (broken_)
        SCMOE_COMM_FAIL("rank " << rank_ << ": " << op << ": the NCCL communicator was aborted after an earlier error, "
                                << "first in: " << first_failure_);
}

void* NcclCommunicator::native_stream(Stream& stream, const char* op) const {
    SCMOE_CHECK(stream.backend() == Backend::kCuda, "rank " << rank_ << ": " << op
                                                            << ": NcclCommunicator needs a CUDA stream, got "
                                                            << backend_name(stream.backend()));
    return stream.native_handle();
}

void NcclCommunicator::abort_and_fail(const char* op, const std::string& what) {
    const std::string message = "rank " + std::to_string(rank_) + ": " + op + ": " + what;
    if (!broken_) {
        broken_ = true;
        first_failure_ = message;
        ncclCommAbort(comm_);  // NOTES: a borrowed communicator is aborted too: it is unusable now
    }
    SCMOE_COMM_FAIL(message);
}

void NcclCommunicator::settle(const char* op) {
    const auto deadline = deadline_after(timeout_s_);
    while (true) {
        ncclResult_t state = ncclSuccess;
        const ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
        if (r != ncclSuccess) abort_and_fail(op, std::string("ncclCommGetAsyncError: ") + ncclGetErrorString(r));
        if (state == ncclSuccess) return;
        if (state != ncclInProgress)
            abort_and_fail(
                op, std::string("NCCL error: ") + ncclGetErrorString(state) + " (" + ncclGetLastError(comm_) + ")");
        if (Clock::now() > deadline)
            abort_and_fail(op, "timed out after " + comm_detail::format_seconds(timeout_s_) +
                                   " s waiting for NCCL to accept the call (SCMOE_COMM_TIMEOUT_S)");
        std::this_thread::yield();
    }
}

void NcclCommunicator::check_nccl(ncclResult_t result, const char* op, const char* call) {
    if (result == ncclSuccess) return;
    if (result == ncclInProgress) {  // a non-blocking communicator still working on the call
        settle(op);
        return;
    }
    if (comm_ != nullptr && (result == ncclSystemError || result == ncclInternalError || result == ncclRemoteError))
        abort_and_fail(op,
                       std::string(call) + ": " + ncclGetErrorString(result) + " (" + ncclGetLastError(comm_) + ")");
    SCMOE_FAIL("rank " << rank_ << ": " << op << ": " << call << ": " << ncclGetErrorString(result)
                       << (comm_ != nullptr ? std::string(" (") + ncclGetLastError(comm_) + ")" : std::string()));
}

void NcclCommunicator::wait_native(void* native, const char* op) {
    auto* stream = static_cast<cudaStream_t>(native);
    const auto deadline = deadline_after(timeout_s_);
    while (true) {
        const cudaError_t q = cudaStreamQuery(stream);
        if (q == cudaSuccess) return;
        if (q != cudaErrorNotReady) abort_and_fail(op, std::string("cudaStreamQuery: ") + cudaGetErrorString(q));
        ncclResult_t state = ncclSuccess;
        if (ncclCommGetAsyncError(comm_, &state) == ncclSuccess && state != ncclSuccess && state != ncclInProgress)
            abort_and_fail(
                op, std::string("NCCL error: ") + ncclGetErrorString(state) + " (" + ncclGetLastError(comm_) + ")");
        if (Clock::now() > deadline)
            abort_and_fail(op, "timed out after " + comm_detail::format_seconds(timeout_s_) +
                                   " s waiting for the stream (a peer missing or stuck; SCMOE_COMM_TIMEOUT_S)");
        std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
}

void NcclCommunicator::wait(Stream& stream) {
    check_usable("wait");
    void* native = native_stream(stream, "wait");
    DeviceScope scope(device_);
    wait_native(native, "wait");
    stream.synchronize();  // idle now: returns at once, rethrowing a host task's error
}

void NcclCommunicator::all_to_all_v(const void* send, const std::int64_t* send_counts, void* recv,
                                    std::int64_t* recv_counts, DType dtype, Stream& stream) {
    constexpr const char* kOp = "all_to_all_v";
    check_usable(kOp);
    SCMOE_CHECK(send_counts != nullptr && recv_counts != nullptr,
                "rank " << rank_ << ": all_to_all_v: null send_counts or recv_counts");
    auto* s = static_cast<cudaStream_t>(native_stream(stream, kOp));
    DeviceScope scope(device_);
    const int n = size_;
    const std::size_t counts_bytes = static_cast<std::size_t>(n) * sizeof(std::int64_t);
    std::int64_t* dev_send_counts = staging_->counts_device;
    std::int64_t* dev_recv_counts = staging_->counts_device + n;

    // 1. The counts: one int64 to and from every peer, then both rows back to the host.
    check_cuda(cudaMemcpyAsync(dev_send_counts, send_counts, counts_bytes, cudaMemcpyDefault, s), rank_, kOp,
               "cudaMemcpyAsync(send_counts)");
    check_nccl(ncclGroupStart(), kOp, "ncclGroupStart");
    for (int p = 0; p < n; ++p) {
        check_nccl(ncclSend(dev_send_counts + p, 1, ncclInt64, p, comm_, s), kOp, "ncclSend(counts)");
        check_nccl(ncclRecv(dev_recv_counts + p, 1, ncclInt64, p, comm_, s), kOp, "ncclRecv(counts)");
    }
    check_nccl(ncclGroupEnd(), kOp, "ncclGroupEnd");
    check_cuda(
        cudaMemcpyAsync(staging_->counts_host, staging_->counts_device, 2 * counts_bytes, cudaMemcpyDeviceToHost, s),
        rank_, kOp, "cudaMemcpyAsync(counts to host)");
    wait_native(s, kOp);  // NOTES: the one synchronisation of an all_to_all_v
    const std::int64_t* host_send = staging_->counts_host;
    const std::int64_t* host_recv = staging_->counts_host + n;
    // NOTES: past the counts exchange the peers will post the data exchange: a bad argument found
    // now aborts the communicator, so that they fail instead of waiting for this rank.
    std::int64_t total_send = 0;
    for (int p = 0; p < n; ++p) {
        if (host_send[p] < 0)
            abort_and_fail(kOp,
                           "send_counts[" + std::to_string(p) + "] = " + std::to_string(host_send[p]) + " (negative)");
        if (host_recv[p] < 0)
            abort_and_fail(
                kOp, "rank " + std::to_string(p) + " sends " + std::to_string(host_recv[p]) + " elements (negative)");
        if (host_recv[p] > 0 && recv == nullptr)
            abort_and_fail(kOp,
                           "null recv buffer but rank " + std::to_string(p) + " sends " + std::to_string(host_recv[p]));
        total_send += host_send[p];
    }
    if (total_send > 0 && send == nullptr) abort_and_fail(kOp, "a null send buffer");
    if (is_device_pointer(recv_counts)) {
        check_cuda(cudaMemcpyAsync(recv_counts, host_recv, counts_bytes, cudaMemcpyHostToDevice, s), rank_, kOp,
                   "cudaMemcpyAsync(recv_counts)");
    } else {
        std::memcpy(recv_counts, host_recv, counts_bytes);
    }

    // 2. The data, packed by rank on both sides.
    post_exchange(send, host_send, recv, host_recv, dtype, s, kOp);
}

void NcclCommunicator::post_exchange(const void* send, const std::int64_t* send_counts, void* recv,
                                     const std::int64_t* recv_counts, DType dtype, void* native, const char* op) {
    auto* s = static_cast<cudaStream_t>(native);
    const std::size_t esize = dtype_size(dtype);
    const ncclDataType_t type = nccl_type(dtype);
    check_nccl(ncclGroupStart(), op, "ncclGroupStart");
    std::size_t send_offset = 0, recv_offset = 0;
    for (int p = 0; p < size_; ++p) {
        const auto send_count = static_cast<std::size_t>(send_counts[p]);
        const auto recv_count = static_cast<std::size_t>(recv_counts[p]);
        if (send_count > 0)
            check_nccl(ncclSend(static_cast<const char*>(send) + send_offset * esize, send_count, type, p, comm_, s),
                       op, "ncclSend");
        if (recv_count > 0)
            check_nccl(ncclRecv(static_cast<char*>(recv) + recv_offset * esize, recv_count, type, p, comm_, s), op,
                       "ncclRecv");
        send_offset += send_count;
        recv_offset += recv_count;
    }
    check_nccl(ncclGroupEnd(), op, "ncclGroupEnd");
}

void NcclCommunicator::all_to_all_v_known(const void* send, const std::int64_t* send_counts, void* recv,
                                          const std::int64_t* recv_counts, DType dtype, Stream& stream) {
    constexpr const char* kOp = "all_to_all_v_known";
    check_usable(kOp);
    SCMOE_CHECK(send_counts != nullptr && recv_counts != nullptr,
                "rank " << rank_ << ": all_to_all_v_known: null send_counts or recv_counts");
    auto* s = static_cast<cudaStream_t>(native_stream(stream, kOp));
    DeviceScope scope(device_);
    const int n = size_;
    // NOTES: no count exchange and no synchronisation: the counts are host values now. Arguments
    // are checked before anything is posted, so a bad call fails on this rank alone (its peers then
    // time out in their next wait, naming it).
    std::int64_t total_send = 0, total_recv = 0;
    for (int p = 0; p < n; ++p) {
        SCMOE_CHECK(send_counts[p] >= 0 && recv_counts[p] >= 0,
                    "rank " << rank_ << ": all_to_all_v_known: send_counts[" << p << "] = " << send_counts[p]
                            << ", recv_counts[" << p << "] = " << recv_counts[p] << " (negative)");
        total_send += send_counts[p];
        total_recv += recv_counts[p];
    }
    SCMOE_CHECK(total_send == 0 || send != nullptr, "rank " << rank_ << ": all_to_all_v_known: a null send buffer");
    SCMOE_CHECK(total_recv == 0 || recv != nullptr, "rank " << rank_ << ": all_to_all_v_known: a null recv buffer");
    post_exchange(send, send_counts, recv, recv_counts, dtype, s, kOp);
}

void NcclCommunicator::all_reduce_sum(void* buf, std::int64_t count, DType dtype, Stream& stream) {
    constexpr const char* kOp = "all_reduce_sum";
    check_usable(kOp);
    const std::size_t bytes = comm_detail::checked_bytes(count, dtype, "all_reduce_sum count");
    auto* s = static_cast<cudaStream_t>(native_stream(stream, kOp));
    if (bytes == 0) return;
    DeviceScope scope(device_);
    check_nccl(ncclAllReduce(buf, buf, static_cast<std::size_t>(count), nccl_type(dtype), ncclSum, comm_, s), kOp,
               "ncclAllReduce");
}

void NcclCommunicator::all_gather(const void* send, std::int64_t count_per_rank, void* recv, DType dtype,
                                  Stream& stream) {
    constexpr const char* kOp = "all_gather";
    check_usable(kOp);
    const std::size_t bytes = comm_detail::checked_bytes(count_per_rank, dtype, "all_gather count_per_rank");
    auto* s = static_cast<cudaStream_t>(native_stream(stream, kOp));
    if (bytes == 0) return;
    DeviceScope scope(device_);
    // In place (send == recv + rank * count_per_rank) is NCCL's own in-place form.
    check_nccl(ncclAllGather(send, recv, static_cast<std::size_t>(count_per_rank), nccl_type(dtype), comm_, s), kOp,
               "ncclAllGather");
}

void NcclCommunicator::broadcast(void* buf, std::int64_t count, DType dtype, int root, Stream& stream) {
    constexpr const char* kOp = "broadcast";
    check_usable(kOp);
    const std::size_t bytes = comm_detail::checked_bytes(count, dtype, "broadcast count");
    SCMOE_CHECK(root >= 0 && root < size_,
                "rank " << rank_ << ": broadcast root " << root << " outside [0, " << size_ << ")");
    auto* s = static_cast<cudaStream_t>(native_stream(stream, kOp));
    if (bytes == 0) return;
    DeviceScope scope(device_);
    check_nccl(ncclBroadcast(buf, buf, static_cast<std::size_t>(count), nccl_type(dtype), root, comm_, s), kOp,
               "ncclBroadcast");
}

void NcclCommunicator::barrier(Stream& stream) {
    constexpr const char* kOp = "barrier";
    check_usable(kOp);
    auto* s = static_cast<cudaStream_t>(native_stream(stream, kOp));
    DeviceScope scope(device_);
    // An all-reduce completes on no rank before every rank has contributed.
    check_nccl(ncclAllReduce(staging_->barrier_device, staging_->barrier_device, 1, ncclInt32, ncclSum, comm_, s), kOp,
               "ncclAllReduce");
}

}  // namespace scmoe
