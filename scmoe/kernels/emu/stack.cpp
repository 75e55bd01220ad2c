#include "scmoe/kernels/emu/stack.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <sstream>

#include "scmoe/kernels/emu/log2_curve.h"
#include "scmoe/kernels/error.h"

namespace scmoe::emu {
namespace {

Stack scmoe_stack() {
    Stack s;  // the defaults: what the emulator modelled before stacks existed, bit for bit
    s.sources = {"scmoe: its own fused attention kernel (attention.h), C++ host code with no framework between "
                 "it and the launch, NCCL's all-to-all (the topology's efficiency as is)"};
    return s;
}

// fairseq + Tutel on PyTorch, as the ScMoE paper ran its language models ("standard implementations of
// GPT-2, GPT-3 and LLaMA-2 from Fairseq, augmented with Tutel MoE", App. A.8; docs/scmoe-paper-setup.md
// 1.3). The paper gives no versions; Tutel's fairseq example pins fairseq b5e7b250 (2022-05-23,
// tutel/examples/fairseq_moe/README.md) and trains with --fp16. Every number: docs/emu-sources.md,
// "Stacks".
Stack paper_stack() {
    Stack s;
    s.name = "paper";
    s.description = "paper: fairseq b5e7b250 + Tutel on PyTorch 1.x eager (unfused attention with dropout, "
                    "eager per-op host time, Tutel's fp32 encode/decode and NCCL all-to-all, fp16 gradients "
                    "all-reduced after the backward)";
    // fairseq/modules/multihead_attention.py (b5e7b250): in training (no incremental state, not ONNX,
    // not scripted) MultiheadAttention.forward returns F.multi_head_attention_forward(...), whose
    // PyTorch 1.x core (_scaled_dot_product_attention in torch/nn/functional.py) is
    // "q = q / math.sqrt(E)", "attn = torch.baddbmm(attn_mask, q, k.transpose(-2, -1))",
    // "attn = softmax(attn, dim=-1)", "if dropout_p > 0.0: attn = dropout(attn, p=dropout_p)",
    // "output = torch.bmm(attn, v)"; fairseq's transformer_lm_gpt sets attention_dropout 0.1.
    s.attention = AttentionImpl::kUnfused;
    s.attention_dropout = true;
    // PyTorch's operator micro-benchmark, eager mode, an op that launches no kernel (split, M8_N8 ..
    // M512_N512): "Forward Execution Time (us) : 3.333" .. 3.416 on CUDA tensors, 3.340 .. 3.468 on CPU
    // ones (pytorch/pytorch PR #32194, Jan 2020, the timings on master before the PR): the host time of
    // one eager op through Python and the dispatcher, before any launch (GpuSpec::launch_us is the
    // launch itself).
    s.framework_us = 3.34;
    // Tutel's all-to-all within a node is NCCL's: tutel/impls/communicate.py simple_all_to_all ->
    // torch.distributed.all_to_all_single (use_2dh=False by default, moe_layer.py); nothing in Tutel's
    // sources or README measures it slower than NCCL, so the factor on NCCL's efficiency is 1.
    s.all_to_all_efficiency = 1.0;
    // Tutel's moe_layer.py (82af7aa) around the all-to-all: "y = fast_encode(x.to(logits_dtype), crit,
    // self.is_postscore).to(x.dtype)" and "y = fast_decode(y.to(logits_dtype), crit, self.is_postscore)"
    // then ".to(original_dtype)", logits_dtype float32 (the gate runs with autocast off): the encode
    // and decode run in fp32 between casts (stack_kernels.cpp, tutel_encode_forward, gives the kernels).
    s.tutel_dispatch = true;
    // fairseq b5e7b250 fairseq/modules/gelu.py: "def gelu(x: torch.Tensor) -> torch.Tensor: return
    // torch.nn.functional.gelu(x.float()).type_as(x)", which utils.get_activation_fn("gelu") returns
    // and the GPT architectures select ("args.activation_fn = safe_getattr(args, \"activation_fn\",
    // \"gelu\")", transformer_lm.py).
    s.activation_f32 = true;
    // Tutel's fairseq patch (tutel/examples/fairseq_moe/fairseq_patch.diff, 82af7aa) builds the MoE FFN
    // as "experts={..., 'type': 'ffn', ..., 'activation_fn' : lambda x: self.activation_dropout_module(x)
    // if self.ffn_layernorm is None else ...}": no GELU between the experts' fc1 and fc2, and the
    // activation dropout is 0 by default ("activation_dropout: float = field(default=0.0, ...)",
    // transformer_lm.py), which launches nothing (FairseqDropout returns x when p is 0).
    s.expert_activation = false;
    // fairseq b5e7b250 fairseq/criterions/cross_entropy.py: "lprobs = model.get_normalized_probs(
    // net_output, log_probs=True)", "loss = F.nll_loss(lprobs, target, ...)"; utils.log_softmax:
    // "return F.log_softmax(x, dim=dim, dtype=torch.float32)" (on CUDA one half-to-float kernel).
    s.loss_f32 = true;
    // Tutel's fairseq example (tutel/examples/fairseq_moe/README.md): "the current patch only works
    // for `legacy_ddp` backend", and run_fairseq.sh passes "--ddp-backend legacy_ddp" with "--fp16
    // --fp16-init-scale 4 --fp16-no-flatten-grads". fairseq's legacy_distributed_data_parallel.py:
    // "Notably it does not overlap gradient communication with the backward pass"; all_reduce_grads
    // "must be called explicitly after backward": it copies the gradients into a buffer of the
    // parameters' dtype ("next(self.module.parameters()).new(self.buffer_size)"), all-reduces it and
    // copies them back. Under --fp16 (FP16Optimizer) the parameters and their gradients are fp16: two
    // bytes each, costed as bf16, the copies in and out as the two conversions around the sum.
    s.grad_reduce = GradReduce::kAfterBackward;
    s.grad_reduce_dtype = DType::kBF16;
    // The same flags select the optimizer: "--optimizer adam" under "--fp16 --fp16-no-flatten-grads"
    // (run_fairseq.sh) is fairseq's FP16Optimizer with one fp32 copy per parameter tensor
    // (fp16_optimizer.py, build_optimizer: "flatten = not getattr(cfg.common, \"fp16_no_flatten_grads\",
    // False)") around FairseqAdam, which takes apex's FusedAdam only if it imports (adam.py:
    // "fused_adam_cls = get_fused_adam_class()") and else fairseq's own Adam; Tutel's README installs
    // fairseq and omegaconf/hydra-core, not apex. stack_kernels.cpp, fairseq_adam_step, gives the kernels.
    s.fairseq_optimizer = true;
    // No published sweep of achieved GEMM efficiency versus size was read (docs/emu-sources.md,
    // "Stacks"): no fall-off beyond the base model's wave and tile quantization and roofline.
    s.small_gemm = {};
    s.sources = {"fairseq b5e7b250 fairseq/modules/multihead_attention.py, transformer_lm.py",
                 "PyTorch 1.x torch/nn/functional.py _scaled_dot_product_attention",
                 "pytorch/pytorch PR #32194 operator micro-benchmark (eager op host time)",
                 "microsoft/tutel 82af7aa tutel/impls/communicate.py, moe_layer.py, fast_dispatch.py, "
                 "examples/fairseq_moe (README.md, run_fairseq.sh: --ddp-backend legacy_ddp, --fp16)",
                 "fairseq fairseq/distributed/legacy_distributed_data_parallel.py (all-reduce after the backward)",
                 "fairseq b5e7b250 fairseq/optim/fp16_optimizer.py, adam.py, fairseq_optimizer.py, trainer.py "
                 "(FP16Optimizer around fairseq's Adam)"};
    return s;
}

// Swin-Transformer's Swin-MoE with Tutel, as the ScMoE paper ran SwinV2-MoE-S ("built upon the
// Tutel MoE framework", App. A.8; Table 9's shapes are Swin-Transformer's
// configs/swinmoe/swin_moe_small_patch4_window12_192_8expert_32gpu_22k.yaml). microsoft/Swin-Transformer
// f82860b: main_moe.py trains "with torch.cuda.amp.autocast(enabled=config.AMP_ENABLE)" (config.py:
// "_C.AMP_ENABLE = True") under "torch.nn.parallel.DistributedDataParallel(model, ...)";
// models/swin_transformer_moe.py WindowAttention.forward: "q = q * self.scale", "attn = (q @
// k.transpose(-2, -1))", "relative_position_bias_table = self.cpb_mlp(self.relative_coords_table)"
// (nn.Linear(2, 512), ReLU, nn.Linear(512, num_heads)), "relative_position_bias_table[self.
// relative_position_index.view(-1)]", ".permute(2, 0, 1).contiguous()", "attn = attn +
// relative_position_bias.unsqueeze(0)", "attn = self.softmax(attn)", "attn = self.attn_drop(attn)"
// with attn_drop 0 (build.py passes no attn_drop_rate; SwinTransformerMoE's default "attn_drop_rate=0."),
// "x = (attn @ v).transpose(1, 2).reshape(B_, N, C)". Under autocast (PyTorch's
// aten/src/ATen/autocast_mode.cpp): softmax is "fp32_set_opt_dtype" (fp32 output; on CUDA a half input
// with a float dtype runs one half-to-float softmax kernel), matmul "lower_precision_fp" (its fp32
// input cast to fp16 first: cached_cast -> "arg.to(to_type)"). Dropout with p = 0 launches nothing
// (at::native::dropout: the fused kernel only for "p > 0", else "_dropout" returns the input).
Stack paper_swin_stack() {
    Stack s = paper_stack();
    s.name = "paper-swin";
    s.description = "paper-swin: Swin-Transformer's Swin-MoE + Tutel on PyTorch 1.x eager under torch.cuda.amp "
                    "(unfused window attention with its position bias and an fp32 softmax, no attention dropout, "
                    "eager per-op host time, Tutel's fp32 encode/decode and NCCL all-to-all, fp32 gradients "
                    "all-reduced during the backward)";
    s.attention_dropout = false;
    s.attention_bias = true;
    // Swin's MLP is "act_layer=nn.GELU" in the GEMMs' dtype (GELU is on neither autocast list); its
    // experts are Tutel's ffn with "'activation_fn': lambda x: self._dropout(F.gelu(x))"; its loss is not
    // an LM's (and block runs have none).
    s.activation_f32 = false;
    s.expert_activation = true;
    s.loss_f32 = false;
    s.attention_softmax_f32 = true;
    // main_moe.py: PyTorch DDP (buckets all-reduced as the backward makes them) over fp32 parameters
    // (autocast keeps the parameters and their gradients fp32).
    s.grad_reduce = GradReduce::kOverlapped;
    s.grad_reduce_dtype = DType::kF32;
    // main_moe.py's optimizer is PyTorch's (build_optimizer: optim.AdamW over fp32 parameters), not
    // fairseq's; the Swin rows are block runs, which take no optimizer step.
    s.fairseq_optimizer = false;
    s.sources = {"microsoft/Swin-Transformer f82860b main_moe.py (autocast, DDP), config.py (AMP_ENABLE True), "
                 "models/swin_transformer_moe.py WindowAttention, models/build.py",
                 "PyTorch aten/src/ATen/autocast_mode.cpp (softmax fp32_set_opt_dtype, matmul lower_precision_fp), "
                 "aten/src/ATen/native/Dropout.cpp (p = 0 launches nothing)",
                 "pytorch/pytorch PR #32194 operator micro-benchmark (eager op host time)",
                 "microsoft/tutel 82af7aa tutel/impls/moe_layer.py, fast_dispatch.py (no a2a_ffn_overlap_degree: 1)"};
    return s;
}

std::string lower(std::string_view s) {
    std::string out(s);
    for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return out;
}


}  // namespace

const std::vector<Stack>& builtin_stacks() {
    static const std::vector<Stack> stacks = {scmoe_stack(), paper_stack(), paper_swin_stack()};
    return stacks;
}

std::string builtin_stack_names() {
    std::string names;
    for (const Stack& s : builtin_stacks()) names += (names.empty() ? "" : ", ") + s.name;
    return names;
}

const Stack& builtin_stack(std::string_view name) {
    const std::string n = lower(name);
    for (const Stack& s : builtin_stacks())
        if (s.name == n) return s;
    SCMOE_FAIL("--stack " << name << ": no such stack; built in: " << builtin_stack_names()
                          << " (or a stack JSON file, docs/emu.md)");
}

void check_stack(const Stack& s) {
    SCMOE_CHECK(std::isfinite(s.framework_us) && s.framework_us >= 0,
                "stack " << s.name << ": framework_us " << s.framework_us << ": must be >= 0");
    SCMOE_CHECK(s.all_to_all_efficiency > 0 && s.all_to_all_efficiency <= 1,
                "stack " << s.name << ": all_to_all_efficiency " << s.all_to_all_efficiency << ": must be in (0, 1]");
    for (std::size_t i = 0; i < s.small_gemm.size(); ++i) {
        const GemmEfficiencyPoint& p = s.small_gemm[i];
        SCMOE_CHECK(p.size > 0 && std::isfinite(p.size),
                    "stack " << s.name << ": small_gemm[" << i << "].size " << p.size << ": must be > 0");
        SCMOE_CHECK(p.fraction > 0 && p.fraction <= 1,
                    "stack " << s.name << ": small_gemm[" << i << "].fraction " << p.fraction << ": must be in (0, 1]");
        if (i > 0) {
            SCMOE_CHECK(p.size > s.small_gemm[i - 1].size,
                        "stack " << s.name << ": small_gemm[" << i << "].size: sizes must increase");
            SCMOE_CHECK(p.fraction >= s.small_gemm[i - 1].fraction,
                        "stack " << s.name << ": small_gemm[" << i << "].fraction: fractions must not decrease");
        }
    }
    SCMOE_CHECK(s.grad_reduce_dtype == DType::kF32 || s.grad_reduce_dtype == DType::kBF16,
                "stack " << s.name << ": grad_reduce_dtype " << dtype_name(s.grad_reduce_dtype) << ": f32 or bf16");
    SCMOE_CHECK(!s.attention_softmax_cast_in || s.attention_softmax_f32,
                "stack " << s.name << ": attention_softmax_cast_in needs attention_softmax_f32 (an fp32 softmax)");
    SCMOE_CHECK(s.small_gemm.empty() || s.small_gemm.back().fraction == 1.0,
                "stack " << s.name << ": small_gemm: the last point's fraction must be 1 (the ceiling at large sizes)");
}

std::string describe(const Stack& s) {
    std::ostringstream os;
    const bool unfused = s.attention == AttentionImpl::kUnfused;  // the score passes apply to it only
    os << s.name << ": " << (unfused ? "unfused" : "fused") << " attention"
       << (unfused && s.attention_dropout ? " (dropout)" : "")
       << (unfused && s.attention_bias ? " (position bias)" : "")
       << (unfused && s.attention_softmax_f32
               ? (s.attention_softmax_cast_in ? " (fp32 softmax of fp32 scores)" : " (fp32 softmax)")
               : "")
       << (unfused && s.attention_scale_scores ? " (scores scaled)" : "")
       << (unfused && s.attention_mask_add ? " (mask added)" : "") << (s.norm_f32 ? ", fp32 RMSNorm" : "")
       << ", framework " << s.framework_us << " us/op, all-to-all efficiency x" << s.all_to_all_efficiency
       << (s.tutel_dispatch ? ", Tutel fp32 encode/decode" : "") << (s.activation_f32 ? ", fp32 GELU" : "")
       << (s.expert_activation ? "" : ", no expert activation") << (s.loss_f32 ? ", fp32 loss" : "")
       << (s.fairseq_optimizer ? ", fairseq FP16Optimizer + Adam" : "") << ", small-GEMM curve "
       << (s.small_gemm.empty() ? std::string("none") : std::to_string(s.small_gemm.size()) + " points")
       << ", gradient all-reduce " << (s.grad_reduce == GradReduce::kOverlapped ? "overlapped" : "after the backward")
       << " in " << dtype_name(s.grad_reduce_dtype);
    return os.str();
}

double small_gemm_fraction(const Stack& s, double size) {
    if (s.small_gemm.empty()) return 1.0;
    return log2_curve(
        s.small_gemm, size, [](const GemmEfficiencyPoint& p) { return p.size; },
        [](const GemmEfficiencyPoint& p) { return p.fraction; });
}

double small_gemm_fraction(const Stack& s, const OpCost& c) {
    if (s.small_gemm.empty() || c.unit != OpUnit::kTensor || c.gemm_count <= 0) return 1.0;
    const auto side = static_cast<double>(std::min({c.gemm_m, c.gemm_n, c.gemm_k}));
    return side > 0 ? small_gemm_fraction(s, side) : 1.0;
}

ScorePasses score_passes(const Stack& stack, bool training) {
    ScorePasses p;
    p.dropout = training && stack.attention_dropout;
    p.bias = stack.attention_bias;
    p.softmax_f32 = stack.attention_softmax_f32;
    p.scale_scores = stack.attention_scale_scores;
    p.mask_add = stack.attention_mask_add;
    p.softmax_cast_in = stack.attention_softmax_cast_in;
    return p;
}

}  // namespace scmoe::emu
