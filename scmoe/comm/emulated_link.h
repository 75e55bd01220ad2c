// EmulatedLink: a Communicator that wraps another one and makes every collective hold its stream for
// as long as a configured interconnect would take, without using compute. The way to measure
// compute/communication overlap where the real link is absent (idea from GPEmu, VLDB'25).
//
//   auto inner = group->communicator(rank);                        // any Communicator
//   EmulatedLink link(std::move(inner), parse_link_model("pcie4"));
//   link.all_to_all_v(send, send_counts, recv, recv_counts, DType::kF32, stream);
//
// Per operation, on the stream: the start is stamped, the wrapped operation is enqueued unchanged,
// then the stream is held until start + modelled time. The op therefore holds the stream for
// max(actual, modelled) and its data is the wrapped op's, untouched.
//  - CPU streams: host tasks on the stream's worker record the start and sleep out the rest.
//  - CUDA streams: kernels (scmoe/comm/detail/link_timer_cuda.h): one stamps %globaltimer, one CTA of
//    one thread spins on it until the hold ends. No host callback, so the other streams' callbacks
//    never wait behind a link (review L2). The modelled time is computed on the host when the op
//    is enqueued, so the wrapped communicator must have filled recv_counts by the time
//    all_to_all_v returns, as NcclCommunicator and LocalCommunicator on CUDA do (their count
//    exchange waits on the host).
//
// The model, per op on a group of n ranks (n == 1: no link is crossed, 0 us):
//   time_us = latency_us + link_bytes / (gbps * 1e3)          (1 GB/s = 1e3 bytes per us)
//   all_to_all_v    link_bytes = max(bytes this rank sends to other ranks, bytes it receives from
//                   other ranks); self traffic excluded. Send side from send_counts (read when the
//                   op starts), receive side from recv_counts (read after the wrapped op).
//   all_reduce_sum  link_bytes = 2 (n-1)/n * buffer bytes   (ring: reduce-scatter + all-gather)
//   all_gather      link_bytes = (n-1)/n * n * count_per_rank bytes   (ring; the received total)
//   broadcast       link_bytes = buffer bytes   (pipelined ring/tree: the root sends every byte
//                   once; nccl-tests' broadcast bus factor 1)
//   barrier         link_bytes = 0 (latency only)
// One latency per op whatever the algorithm's step count; a deliberate first-order model.
//
// Requirements beyond Communicator's: send_counts and recv_counts must be host memory (they are
// read by host tasks), which they are for every communicator in scmoe.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "scmoe/comm/communicator.h"

namespace scmoe {

// A link: bandwidth per direction and a per-operation latency.
struct LinkModel {
    std::string name;         // "pcie4", or "custom" for a parsed gbps=...,latency_us=...
    double gbps = 0.0;        // GB/s (1e9 bytes/s) per direction, > 0
    double latency_us = 0.0;  // microseconds per operation, >= 0
};

// The presets, all per direction and per GPU:
//   pcie4    25 GB/s, 10 us   PCIe 4.0 x16 (31.5 GB/s raw) at ~80% efficiency, plus a staged
//                             host round trip's latency.
//   nvlink4  450 GB/s, 3 us   H100 SXM NVLink 4: 18 links x 25 GB/s = 450 GB/s per direction
//                             (NVIDIA's 900 GB/s is bidirectional); ~3 us NCCL small-message
//                             latency within an NVSwitch node (assumption from nccl-tests runs).
//   ib-ndr   50 GB/s, 5 us    InfiniBand NDR 400 Gb/s = 50 GB/s per port; ~5 us through a switch
//                             with GPUDirect RDMA (assumption).
//   100gbe   12.5 GB/s, 15 us 100 Gb Ethernet (RoCE/TCP), 15 us (assumption).
std::vector<LinkModel> link_presets();

// "pcie4" | "nvlink4" | "ib-ndr" | "100gbe" | "gbps=X,latency_us=Y" (custom, named "custom"; keys in
// any order, latency_us may be left out for 0, gbps is required). Throws Error on anything else.
LinkModel parse_link_model(std::string_view text);

// "pcie4 (25 GB/s, 10 us)".
std::string describe_link_model(const LinkModel& model);

enum class LinkOp : std::uint8_t { kAllToAllV, kAllReduceSum, kAllGather, kBroadcast, kBarrier };
inline constexpr int kNumLinkOps = 5;
const char* link_op_name(LinkOp op);

// Microseconds `op` takes on `model` for a group of `num_ranks` ranks. `bytes` is the op's payload
// as the caller sees it: all_to_all_v the larger of bytes sent to and received from other ranks;
// all_reduce_sum and broadcast the buffer's bytes; all_gather the total gathered bytes
// (num_ranks * count_per_rank * element size); barrier ignored. Applies the factors above.
double modelled_link_us(const LinkModel& model, LinkOp op, double bytes, int num_ranks);

// What the link has done so far. Written by host tasks (CPU streams) or read from the device's
// stamps (CUDA streams), so read after synchronizing the stream.
struct LinkCounters {
    std::int64_t ops = 0;
    double bytes = 0.0;        // payload bytes as modelled_link_us takes them
    double modelled_us = 0.0;  // sum of modelled times
    double wrapped_us = 0.0;   // sum of the wrapped ops' own times (start task to end task)
    double measured_us = 0.0;  // sum of the times the ops held the stream: max(wrapped, modelled)
                               // plus the sleep's overshoot
};

// The work an EmulatedLink enqueues refers to it: keep it alive until its streams are synchronized.
class EmulatedLink final : public Communicator {
  public:
    // Wraps `inner`, which must outlive this object (non-owning).
    EmulatedLink(Communicator& inner, LinkModel model);
    // Wraps and keeps `inner` alive (a unique_ptr converts).
    EmulatedLink(std::shared_ptr<Communicator> inner, LinkModel model);
    ~EmulatedLink() override;

    int rank() const override { return inner_->rank(); }
    int size() const override { return inner_->size(); }
    // "link(pcie4 (25 GB/s, 10 us)) over local(rank 0 of 2)".
    std::string name() const override;

    void all_to_all_v(const void* send, const std::int64_t* send_counts, void* recv, std::int64_t* recv_counts,
                      DType dtype, Stream& stream) override;
    void all_to_all_v_known(const void* send, const std::int64_t* send_counts, void* recv,
                            const std::int64_t* recv_counts, DType dtype, Stream& stream) override;
    void all_reduce_sum(void* buf, std::int64_t count, DType dtype, Stream& stream) override;
    void all_gather(const void* send, std::int64_t count_per_rank, void* recv, DType dtype, Stream& stream) override;
    void broadcast(void* buf, std::int64_t count, DType dtype, int root, Stream& stream) override;
    void barrier(Stream& stream) override;
    // The inner communicator's, and at least the one SM the link's start and hold kernels (one block
    // of one thread each) need on CUDA streams; -1 when the inner one's is not known.
    int kernel_sms() const override {
        const int inner = inner_->kernel_sms();
        return inner < 0 ? -1 : std::max(1, inner);
    }

    LinkModel model() const;
    // Replaces the model for the ops that finish from now on (an op in flight may use either);
    // benchmarks switch the link off and on to measure a step's time without its communication.
    void set_model(LinkModel model);
    Communicator& inner() const { return *inner_; }
    // modelled_link_us(model(), op, bytes, size()).
    double modelled_us(LinkOp op, double bytes) const;

    // Counters of one kind of op, or of all ops together.
    LinkCounters counters(LinkOp op) const;
    LinkCounters counters() const;
    void reset_counters();

  private:
    struct Pending;      // one op between its start and end host tasks
    struct DeviceHolds;  // CUDA streams: the ops' stamps, read into the counters once finished

    // Enqueues the start task: records the time and the payload `sent_bytes()` (run in the task).
    std::shared_ptr<Pending> start(Stream& stream, std::function<double()> sent_bytes);
    // Enqueues the end task: payload = max(sent, `received_bytes()`), sleeps until start +
    // modelled time, updates the counters.
    void finish(Stream& stream, LinkOp op, std::shared_ptr<Pending> pending, std::function<double()> received_bytes);
    // Adds one op to the counters of `op` (under mu_).
    void count(LinkOp op, double bytes, double model_us, double wrapped_us, double measured_us) const;
    // Holds `stream` for op around `wrapped` (which enqueues the wrapped communicator's op): host
    // tasks on CPU streams, hold_on_device on CUDA streams. `sent`/`received` give the payload.
    void hold(Stream& stream, LinkOp op, const std::function<void()>& wrapped, std::function<double()> sent,
              std::function<double()> received);
    // CUDA streams: runs `wrapped` between the start and hold kernels; `sent` and `received` are
    // read on the host once `wrapped` has returned.
    void hold_on_device(Stream& stream, LinkOp op, const std::function<void()>& wrapped,
                        const std::function<double()>& sent, const std::function<double()>& received);
    // Adds the finished device holds to the counters (under mu_).
    void collect_device_holds() const;

    std::shared_ptr<Communicator> owned_;
    Communicator* inner_;
    LinkModel model_;
    mutable std::mutex mu_;
    mutable std::array<LinkCounters, kNumLinkOps> counters_{};
    std::unique_ptr<DeviceHolds> device_holds_;  // created by the first op on a CUDA stream
};

}  // namespace scmoe
