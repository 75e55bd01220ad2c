// Decoder: the incremental forward of a LanguageModel for generation, with a KV cache. It reads the
// model's trained parameters in place and runs the training forward's kernels on only the new
// tokens of each pass (scmoe/kernels/attention_decode.h for the attention over the cache):
//
//   h0 = embed[ids] + pos[position]            position = the sequence's cached length + i
//   per block b:  normed = RMSNorm(h_b); qkv = normed . Wqkv; append K/V to the cache;
//                 H_b^MH = h_b + AttnDecode(q, cache) . Wo
//                 dense: h_{b+1} = H^MH + MLP(RMSNorm(H^MH))
//                 MoE:   x = RMSNorm_x(H^MH), s = x or RMSNorm_s(shortcut of the same tokens: Pos-1 h_b,
//                        Pos-2 H_{b-1}^MH, Pos-3 h_{b-1}); h_{b+1} = H^MH + MoeLayer(x, s)
//   logits = RMSNorm(h_L) . embed^T            (tied head)
//
// so the logits of every position equal the full forward's over the sequence so far (to fp32
// rounding on the CPU: the GEMMs see other shapes). The MoE layers decode dropless whatever the
// checkpoint's dispatch mode (a dropped token would make a prompt's text depend on the others in
// its batch) and without gate noise; the full forward agrees when it drops nothing.
//
// Passes: prefill(sequence, prompt) runs one sequence's prompt (any length that fits); step(tokens)
// one new token for every sequence of the batch. Every pass is a collective over `ep` (the MoE
// all-to-alls): every rank runs the same passes with the same token counts. With expert
// parallelism each rank decodes the whole batch (replicated) and holds its share of the experts.
//
// Each MoE block routes ("gate": its shortcut's norm, the router, the permutation) as soon as its
// routing input exists: a ScMoE block's gate runs blocks before its experts (Pos-2: right after the
// previous block's attention), a top-k block's after its own norm_x. The experts then run at the
// block's FFN.
//
// Expert residency (issue 27, item 2; DecoderOptions::experts): kResident runs every local expert
// on the model's device weights. kBlocking and kPrefetch read the routed experts from host memory
// (the model built with its MoE parameters in pinned host memory: LanguageModel's moe_param_device
// = pinned_host_memory(device)), keep the
// rest of each MoE layer (router, shared expert, CG-1 gate) in a device copy the decoder makes when it
// is built (so load the weights first), and run each chosen expert on a device slot of an
// ExpertCache (scmoe/models/expert_cache.h): blocking copies it on the compute stream right before
// its FFN; prefetch issues the copies at the block's gate on a copy stream (a ScMoE block's gate
// runs blocks early, so the copies overlap the backbone in between; a top-k block's gate runs just
// before its experts, so its copies can only start there) and each expert waits on its own copy.
// Single rank only. The tokens are the same bit for bit in every mode (the same GEMM per expert).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "scmoe/kernels/device.h"
#include "scmoe/models/expert_cache.h"
#include "scmoe/models/kv_cache.h"
#include "scmoe/models/lm.h"
#include "scmoe/moe/moe_layer.h"

namespace scmoe {
class Communicator;
}

namespace scmoe::models {

// Where a decoding MoE layer's routed experts live (issue 27, item 2): on the device (as in
// training), or in pinned host memory, copied in per pass (blocking, or prefetched from the gate).
enum class ExpertResidency { kResident, kBlocking, kPrefetch };
const char* expert_residency_name(ExpertResidency mode);  // "resident", "blocking", "prefetch"
// "resident" | "blocking" | "prefetch"; throws scmoe::Error naming the value otherwise.
ExpertResidency parse_expert_residency(const std::string& name);

struct DecoderOptions {
    std::int64_t batch = 1;       // sequences decoded together
    std::int64_t max_length = 0;  // positions per sequence (prompt + new tokens); <= the model's seq_len
    ExpertResidency experts = ExpertResidency::kResident;
    // kPrefetch: device slots of the expert cache (0: default_prefetch_slots). kBlocking uses one
    // slot (nothing is reused) and refuses another count; kResident refuses any.
    std::int64_t expert_cache_slots = 0;
};

// The default prefetch cache: the chosen experts of two gated layers (a ScMoE gate runs a block
// ahead of the previous layer's experts) of one step, plus one slot to rotate:
// 2 x min(local experts, batch x top_k) + 1.
std::int64_t default_prefetch_slots(const MoeConfig& moe, std::int64_t batch);

// Latencies of the MoE blocks over the decode steps (Decoder::set_moe_block_timing): each from an
// event before the block's first op (its attention's norm) to one after its residual add, on the
// compute stream (device time on CUDA, modeled on emu, wall time on CPU).
struct BlockTimes {
    double total_ms = 0;
    std::int64_t count = 0;
    double mean_ms() const { return count > 0 ? total_ms / static_cast<double>(count) : 0.0; }
};

// Tests: hooks at points of a pass.
struct DecoderProbes {
    std::function<void(std::size_t block, Stream& compute)> block_start;  // before block b's first op
    std::function<void(Stream& stream)> expert_copy;  // before an expert's copy is enqueued on `stream`
};

class Decoder {
  public:
    // `model` (its parameters, device and stream) must outlive the decoder. ep: the model's
    // expert-parallel group (nullptr: single rank); a collective over it. Throws for a max_length
    // beyond the model's seq_len, a residency mode that is not built, or a cache that does not fit.
    Decoder(LanguageModel& model, const DecoderOptions& options, Communicator* ep = nullptr);
    ~Decoder();
    Decoder(const Decoder&) = delete;
    Decoder& operator=(const Decoder&) = delete;

    const DecoderOptions& options() const { return options_; }
    KvCache& cache() { return *cache_; }
    std::int64_t vocab() const { return model_.config().vocab; }
    Device& device() { return model_.device(); }
    Communicator* ep() const { return ep_; }  // the expert-parallel group (nullptr: single rank)

    // Appends `n` tokens to sequence `sequence` (its prompt, or any continuation) and returns their
    // logits, [n, vocab] on the host (valid until the next pass). Synchronizes.
    const std::vector<float>& prefill(std::int64_t sequence, const std::int32_t* tokens, std::int64_t n);
    // Appends tokens[b] to every sequence b of the batch and returns the logits [batch, vocab].
    const std::vector<float>& step(const std::int32_t* tokens);
    // Every sequence empty again (the cache is overwritten by the next passes).
    void reset() { cache_->reset(); }

    // Device memory the decoder itself holds besides the model and the KV cache: its pass buffers,
    // its MoE layers' workspaces, and with offloaded experts the device copies of the MoE layers'
    // other weights and the expert cache.
    std::uint64_t device_bytes() const;
    // The expert cache (nullptr for kResident).
    ExpertCache* expert_cache() { return experts_.get(); }
    // One line: where the routed experts live and when their copies start.
    std::string describe_experts() const;
    void set_probes(DecoderProbes probes);
    // Off by default: records two events per MoE block and step, read after the step's sync.
    void set_moe_block_timing(bool on) { timing_ = on; }
    const BlockTimes& moe_block_times() const { return block_times_; }

  private:
    struct MoeBlock;
    void run(std::int64_t first_sequence, std::int64_t sequences, std::int64_t new_tokens, const std::int32_t* tokens);
    void gate(MoeBlock& m, std::int64_t rows, Stream& s);
    void run_experts(MoeBlock& m, Stream& s);
    const Tensor& backbone_param(const std::string& name) const;

    LanguageModel& model_;
    DecoderOptions options_;
    Communicator* ep_ = nullptr;
    std::int64_t max_rows_ = 0;  // tokens of the largest pass: max(batch, max_length)
    std::unique_ptr<KvCache> cache_;
    std::vector<std::unique_ptr<MoeBlock>> moe_;  // per MoE block, in block order
    std::vector<int> moe_of_block_;               // block -> index into moe_, -1 for dense blocks
    DeviceBuffer workspace_;
    std::int32_t* ids_ = nullptr;
    std::vector<void*> h_, hmh_;  // [blocks + 1], [blocks]: the pass's residual stream, [max_rows, hidden]
    void *normed_ = nullptr, *qkv_ = nullptr, *attn_ = nullptr, *mlp_hidden_ = nullptr, *mlp_act_ = nullptr,
         *logits_ = nullptr;
    std::unique_ptr<ExpertCache> experts_;  // offloaded experts' device slots
    std::uint64_t moe_workspace_bytes_ = 0;
    DecoderProbes probes_;
    bool timing_ = false;
    BlockTimes block_times_;
    std::vector<std::int32_t> host_ids_;
    std::vector<float> host_logits_;
};

}  // namespace scmoe::models
