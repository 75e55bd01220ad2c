// One rank of `scmoe-bench layer --ep N`: its communicator (behind an EmulatedLink when asked), CPU
// device and stream, its share of the parameters, its own tokens, and the timed loops and check of
// one case. Used by the in-process driver (one EpLayerRank per thread) and the mpirun driver (one
// per process), in layer_ep_bench.cpp.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "scmoe/comm/communicator.h"
#include "scmoe/comm/emulated_link.h"
#include "common.h"
#include "scmoe/kernels/device.h"
#include "layer_common.h"
#include "scmoe/moe/moe_layer.h"
#include "scmoe/moe/params.h"

namespace scmoe::bench {

// One rank's measurements of one case (dispatch mode x tokens per rank).
struct EpCaseResult {
    double fwd_us = 0.0;                                                  // mean forward, this rank's stream
    double train_us = 0.0;                                                // mean forward+backward
    std::vector<double> stage_us = std::vector<double>(kNumStages, 0.0);  // staged pass, by Stage
    double link_model_us = 0.0;  // modelled all-to-all time per staged pass (EmulatedLink), 0 without
    std::int64_t dropped = 0;    // this rank's dropped assignments
    std::int64_t wrong = 0;      // this rank's wrong elements (0 with the check off)

    double stage_sum_us() const;  // the staged forward+backward
    double a2a_us() const;        // its all-to-all stages: dispatch, collect and their backward
    double a2a_share() const;     // a2a_us / stage_sum_us, in %

    // Flat doubles (integers below 2^53 are exact) to gather results over MPI.
    static constexpr int kPackedSize = 5 + kNumStages;
    void pack(double* out) const;
    static EpCaseResult unpack(const double* in);
};

class EpLayerRank {
  public:
    // An in-process rank: owns `comm`.
    EpLayerRank(std::unique_ptr<Communicator> comm, const LayerBenchArgs& args, bool check);
    // An MPI rank: borrows `comm`, which must outlive this object.
    EpLayerRank(Communicator& comm, const LayerBenchArgs& args, bool check);
    ~EpLayerRank();
    EpLayerRank(const EpLayerRank&) = delete;
    EpLayerRank& operator=(const EpLayerRank&) = delete;

    // The communicator the layer uses: the link when there is one.
    Communicator& comm();
    // The grouped GEMM provider of the layer (after the first case).
    std::string provider_name() const;

    // Runs one case on this rank: forward and forward+backward timed loops (each started after a
    // barrier), the staged pass, then with `common.check` the check. Collective: every rank calls
    // it with the same arguments in the same order. Returns with the stream synchronized.
    EpCaseResult run_case(DispatchMode dispatch, std::int64_t tokens, const CommonArgs& common);

  private:
    void setup(const LayerBenchArgs& args, bool check);
    // Warmup, a barrier on every rank, then `iters` timed iterations: mean us per iteration.
    double timed_us(int warmup, int iters, const std::function<void()>& enqueue);
    // Compares this rank's last forward+backward (y_, dx_, grads_) with a second one and with the
    // single-rank reference on the same inputs; returns the wrong elements.
    std::int64_t check(const MoeConfig& config, std::int64_t tokens);

    LayerBenchArgs args_;
    std::unique_ptr<Device> device_;
    std::unique_ptr<Stream> stream_;
    std::unique_ptr<Communicator> owned_;
    Communicator* inner_ = nullptr;
    std::unique_ptr<EmulatedLink> link_;
    std::int64_t max_tokens_ = 0;
    std::unique_ptr<MoeParamStore> full_params_, ref_grads_;  // all E experts, for the reference
    std::unique_ptr<MoeParamStore> params_, grads_, grads2_;  // this rank's share
    DeviceBuffer x_, dy_, y_, dx_, y2_, dx2_, y_ref_, dx_ref_;
    std::unique_ptr<MoeLayer> layer_;
    DispatchMode layer_dispatch_ = DispatchMode::kCapacity;
};

}  // namespace scmoe::bench
