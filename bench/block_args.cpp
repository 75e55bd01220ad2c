#include "block_args.h"

#include <algorithm>

#include "block_presets.h"
#include "scmoe/kernels/error.h"
#include "launch/cli_options.h"
#include "launch/emu_choice.h"
#include "launch/local_rank.h"
#include "scmoe/moe/block_stack.h"
#include "scmoe/moe/moe_layer.h"
#include "multi_rank.h"

namespace scmoe::bench {

cxxopts::Options block_options() {
    cxxopts::Options o("scmoe-bench block",
                       "ScMoE block configurations side by side: forward and train-step time, exposed comm, slot K, "
                       "speedup vs top-2");
    add_common_options(o);
    add_token_options(o, "block", "512", "Tokens per rank per step, each a multiple of --seq (one set of rows each)");
    std::string presets;
    for (const std::string& n : block_preset_names()) presets += (presets.empty() ? "" : ", ") + n;
    o.add_options("block")
        ("preset", "a block shape the paper measured (" + presets + "): sets --hidden --ffn --heads --kv-heads "
         "--seq --experts --activation --capacity-factor --bidirectional and --tokens, each flag given overriding it; "
         "docs/scmoe-paper-setup.md", cxxopts::value<std::string>())
        ("variants", "comma list of: " + block_variant_list(),
         cxxopts::value<std::string>()->default_value("top2,top1,shared,scmoe-pos1,scmoe-pos2,scmoe-pos3,scmoe2"))
        ("ranks", "in-process expert-parallel ranks (threads); under mpirun the world size is used",
         cxxopts::value<int>()->default_value("1"))
        ("comm-share", "calibrate the emulated link so the a2a takes this fraction of the top-2 MoE layer time "
         "(0.60 ~ 8xA30 PCIe, 0.15 ~ 8xA800 NVLink); 0 = off", cxxopts::value<double>()->default_value("0"))
        ("hidden", "model width", cxxopts::value<std::int64_t>()->default_value("256"))
        ("ffn", "dense MLP and expert FFN width", cxxopts::value<std::int64_t>()->default_value("512"))
        ("experts", "routed experts (a multiple of the ranks)", cxxopts::value<int>()->default_value("8"))
        ("heads", "attention heads", cxxopts::value<int>()->default_value("8"))
        ("kv-heads", "K/V heads (grouped-query attention; must divide --heads; default: --heads)",
         cxxopts::value<int>())
        ("seq", "tokens per sequence", cxxopts::value<std::int64_t>()->default_value("128"))
        ("bidirectional", "bidirectional attention: every token attends its whole sequence, as encoders and SwinV2's "
         "window attention (twice the causal QK^T and PV FLOPs); default causal; --bidirectional=false turns a "
         "preset's off", cxxopts::value<bool>()->default_value("false"))
        ("blocks", "blocks of the every-block-* variants (an MoE in each)", cxxopts::value<int>()->default_value("4"))
        ("mode", "fwd | train", cxxopts::value<std::string>()->default_value("train"))
        ("dispatch", "capacity | dropless", cxxopts::value<std::string>()->default_value("capacity"))
        ("activation", "swiglu | gelu (dense MLP and experts)", cxxopts::value<std::string>()->default_value("swiglu"))
        ("capacity-factor", "capacity mode slots per expert", cxxopts::value<float>()->default_value("1.25"))
        ("gate", "how the shared expert joins: cg1 (coefficient gate) | add", cxxopts::value<std::string>()->default_value("cg1"))
        ("chunks", "pieces of the chunked a2a / expert-FFN pipeline (Tutel-style; a piece is a group of each rank's "
         "local experts, or with one expert per rank a slice of its rows): auto (chosen per branch from the "
         "calibrated times) or N (1 = off, at most experts / ranks, or 4 with one expert per rank)",
         cxxopts::value<std::string>()->default_value("auto"))
        ("comm-sms", "SMs the backbone's kernels leave free while an exchange overlaps them (R; the backbone stream's SM "
         "budget is SMs - R there, so a persistent grouped GEMM leaves the exchange's NCCL blocks room, review 2 #6): "
         "auto (SCMOE_COMM_SMS, else the communicator's own count: the emulated NCCL's channels, 0 in-process, else NCCL's "
         "channel settings, else 32) or N (0 = none)",
         cxxopts::value<std::string>()->default_value("auto"))
        ("issue-order", "how each pass issues its ops from the host: ahead (the backbone's segments before each "
         "exchange that blocks the host) or program (the plan's order: the backbone drains at every exchange on a GPU, "
         "review L1; to measure that drain)", cxxopts::value<std::string>()->default_value("ahead"))
        ("trace", "write a Chrome/Perfetto trace of one step per variant and rank to FILE.<variant>.rank<r>.json "
         "(FILE.tokens<T>.<variant>.rank<r>.json with several token counts)",
         cxxopts::value<std::string>()->default_value(""));
    launch::add_cluster_options(o, "block");
    add_link_options(o, "block");
    add_nccl_tests_guards(o);
    return o;
}

BlockArgs read_block_args(const cxxopts::ParseResult& r) {
    BlockArgs a;
    a.variants = split_list(r["variants"].as<std::string>());
    if (a.variants.empty()) throw UsageError("--variants is empty");
    for (const std::string& v : a.variants)
        if (!is_block_variant(v))
            throw UsageError("--variants: unknown variant '" + v + "' (one of: " + block_variant_list() + ")");
    a.mpi = launch::launched_by_mpirun();
    a.ranks = a.mpi ? launch::launcher_world_size() : r["ranks"].as<int>();
    if (a.ranks < 1) throw UsageError("--ranks must be >= 1");
    a.link = read_link_options(r);
    a.comm_share = r["comm-share"].as<double>();
    if (a.comm_share < 0 || a.comm_share >= 1) throw UsageError("--comm-share must be in [0, 1)");
    if (a.comm_share > 0 && a.link) throw UsageError("--comm-share sets the emulated link itself: drop --link*");
    a.tokens = read_token_options(r);
    a.hidden = r["hidden"].as<std::int64_t>();
    a.ffn = r["ffn"].as<std::int64_t>();
    a.experts = r["experts"].as<int>();
    a.heads = r["heads"].as<int>();
    a.seq = r["seq"].as<std::int64_t>();
    a.capacity_factor = r["capacity-factor"].as<float>();
    if (r.count("preset")) {
        // The preset's values where the flag is not given (a flag's default does not count).
        const BlockPreset* p = nullptr;
        try {
            p = &block_preset(r["preset"].as<std::string>());
        } catch (const Error& e) {
            throw UsageError(e.what());
        }
        a.preset = p->name;
        a.preset_notes = p->notes;
        if (!r.count("tokens") && !r.count("min-tokens")) a.tokens = {p->tokens_per_rank};
        if (!r.count("hidden")) a.hidden = p->hidden;
        if (!r.count("ffn")) a.ffn = p->ffn;
        if (!r.count("heads")) a.heads = p->heads;
        if (!r.count("kv-heads") && !r.count("heads")) a.kv_heads = p->kv_heads;
        if (!r.count("seq")) a.seq = p->seq;
        if (!r.count("experts")) a.experts = block_preset_experts(*p, a.ranks);
        if (!r.count("capacity-factor")) a.capacity_factor = p->capacity_factor;
        a.bidirectional = !p->causal;
    }
    if (r.count("bidirectional")) a.bidirectional = r["bidirectional"].as<bool>();
    if (r.count("kv-heads")) a.kv_heads = r["kv-heads"].as<int>();
    if (a.kv_heads == 0) a.kv_heads = a.heads;
    if (a.heads < 1 || a.kv_heads < 1 || a.heads % a.kv_heads != 0)
        throw UsageError("--kv-heads " + std::to_string(a.kv_heads) + " must divide --heads " + std::to_string(a.heads));
    a.blocks = r["blocks"].as<int>();
    const std::string mode = r["mode"].as<std::string>();
    if (mode != "fwd" && mode != "train") throw UsageError("--mode must be fwd or train");
    a.train = mode == "train";
    a.dispatch = parse_dispatch_mode(r["dispatch"].as<std::string>());
    try {
        a.activation = parse_activation(r["activation"].as<std::string>());
        if (!a.preset.empty() && !r.count("activation")) a.activation = block_preset(a.preset).activation;
    } catch (const Error& e) {
        throw UsageError(e.what());
    }
    const std::string gate = r["gate"].as<std::string>();
    if (gate != "cg1" && gate != "add") throw UsageError("--gate must be cg1 or add");
    a.coefficient_gate = gate == "cg1";
    a.trace = r["trace"].as<std::string>();
    try {
        a.issue_order = parse_issue_order(r["issue-order"].as<std::string>());
    } catch (const Error& e) {
        throw UsageError(std::string("--issue-order: ") + e.what());
    }
    const std::string chunks = r["chunks"].as<std::string>();
    if (chunks != "auto") {
        std::size_t used = 0;
        int n = 0;
        try {
            n = std::stoi(chunks, &used);
        } catch (const std::exception&) {
            used = 0;
        }
        if (used != chunks.size() || n < 1) throw UsageError("--chunks must be auto or a positive integer, got '" + chunks + "'");
        a.chunks = n;
    }
    const std::string comm_sms = r["comm-sms"].as<std::string>();
    if (comm_sms != "auto") {
        std::size_t used = 0;
        int n = -1;
        try {
            n = std::stoi(comm_sms, &used);
        } catch (const std::exception&) {
            used = 0;
        }
        if (used != comm_sms.size() || n < 0)
            throw UsageError("--comm-sms must be auto or an integer >= 0, got '" + comm_sms + "'");
        a.comm_sms = n;
    }
    if (a.ranks > 0 && a.experts % a.ranks == 0) {
        const int most = max_pipeline_pieces(a.experts, a.ranks);
        if (a.chunks > most)
            throw UsageError("--chunks " + std::to_string(a.chunks) + ": at most " +
                             (pipelines_row_slices(a.experts, a.ranks)
                                  ? std::to_string(most) + " slices of the one local expert's rows (--experts = ranks)"
                                  : "the " + std::to_string(most) + " local experts per rank (--experts / ranks)"));
    }
    if (a.seq <= 0) throw UsageError("--seq must be positive");
    for (const std::int64_t t : a.tokens)
        if (t % a.seq)
            throw UsageError("tokens " + std::to_string(t) + ": every token count (--tokens or -b/-e/-f) must be a "
                             "multiple of --seq " + std::to_string(a.seq));
    if (a.experts % a.ranks) throw UsageError("--experts must be a multiple of the number of ranks");
    try {
        a.cluster_flags = launch::read_cluster_options(r);
    } catch (const Error& e) {
        throw UsageError(e.what());
    }
    if (launch::any_cluster_option(r) && !r.count("cluster") && !a.cluster_flags.any_override())
        throw UsageError("--cluster is empty");
    return a;
}

void resolve_emu_cluster(const CommonArgs& common, BlockArgs& a) {
    if (common.backend != "emu") {
        if (!a.cluster_flags.cluster.empty() || a.cluster_flags.any_override())
            throw UsageError("--cluster and its overrides describe emulated GPUs: they need --backend emu");
        return;
    }
    if (a.mpi) throw UsageError("--backend emu runs its ranks in-process (--ranks N), not under mpirun");
    if (a.link || a.comm_share > 0)
        throw UsageError("--backend emu models the interconnect itself (--cluster): drop --link* and --comm-share");
    try {
        const launch::EmuChoice c = launch::resolve_emu_choice(common.gpu, common.routing, a.cluster_flags, a.ranks);
        a.topology = c.topology;
        a.cluster = c.topology.name;
        a.cluster_notes = launch::cluster_notes(c);
    } catch (const Error& e) {
        throw UsageError(e.what());
    }
}

nlohmann::ordered_json block_args_json(const CommonArgs& common, const BlockArgs& a) {
    nlohmann::ordered_json j = common_args_json(common);
    j["variants"] = a.variants;
    j["ranks"] = a.ranks;
    j["mpi"] = a.mpi;
    j["link"] = link_json(a.link);
    j["comm_share"] = a.comm_share;
    j["tokens_per_rank"] = a.tokens;
    j["hidden"] = a.hidden;
    j["ffn"] = a.ffn;
    j["experts"] = a.experts;
    j["heads"] = a.heads;
    j["kv_heads"] = a.kv_heads;
    j["seq"] = a.seq;
    j["bidirectional"] = a.bidirectional;
    j["mode"] = a.train ? "train" : "fwd";
    j["dispatch"] = dispatch_mode_name(a.dispatch);
    j["activation"] = activation_name(a.activation);
    j["capacity_factor"] = a.capacity_factor;
    j["gate"] = a.coefficient_gate ? "cg1" : "add";
    j["issue_order"] = issue_order_name(a.issue_order);
    j["chunks"] = a.chunks == 0 ? nlohmann::ordered_json("auto") : nlohmann::ordered_json(a.chunks);
    j["comm_sms"] = a.comm_sms < 0 ? nlohmann::ordered_json("auto") : nlohmann::ordered_json(a.comm_sms);
    if (!a.cluster.empty()) j["cluster"] = a.cluster;
    if (!a.preset.empty()) j["preset"] = a.preset;
    return j;
}

}  // namespace scmoe::bench
