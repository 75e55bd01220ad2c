#include "launch/cli_options.h"

#include <cmath>
#include <map>
#include <sstream>

#include "scmoe/kernels/error.h"

namespace scmoe::launch {

std::vector<std::string> split_comma_list(const std::string& text) {
    std::vector<std::string> out;
    std::stringstream in(text);
    for (std::string item; std::getline(in, item, ',');)
        if (!item.empty()) out.push_back(item);
    return out;
}

void add_model_shape_options(cxxopts::Options& o, const std::string& default_preset, const std::string& default_vocab) {
    std::string presets;
    for (const std::string& n : models::lm_preset_names()) {
        if (!presets.empty()) presets += ", ";
        presets += n;
    }
    // clang-format off
    o.add_options("model")
        ("preset", "Model preset: " + presets, cxxopts::value<std::string>()->default_value(default_preset))
        ("layers", "Transformer blocks (even for pair variants)", cxxopts::value<std::int64_t>())
        ("hidden", "Model width", cxxopts::value<std::int64_t>())
        ("heads", "Attention heads", cxxopts::value<std::int64_t>())
        ("kv-heads", "K/V heads (grouped-query attention; must divide --heads; default: the preset's, = heads "
                     "except llama2-moe's 4)", cxxopts::value<std::int64_t>())
        ("seq", "Sequence length", cxxopts::value<std::int64_t>())
        ("ffn", "Dense MLP width", cxxopts::value<std::int64_t>())
        ("activation", "swiglu or gelu, for the dense MLP and the experts (default: the preset's: gelu; swiglu "
                       "for llama2-moe)", cxxopts::value<std::string>())
        ("experts", "Routed experts per MoE layer", cxxopts::value<int>())
        ("expert-ffn", "Expert FFN width", cxxopts::value<std::int64_t>())
        ("vocab", "Vocabulary size (256: the byte tokens the data has; larger sizes only cost, e.g. GPT-2's 50257 "
                  "to plan with emulated GPUs). Default " + default_vocab + ", or the preset's where it states one "
                  "(gpt3-moe-xl 50257, llama2-moe 32000)", cxxopts::value<std::int64_t>()->default_value(default_vocab));
    // clang-format on
}

models::LmConfig read_model_shape_options(const cxxopts::ParseResult& r, bool* custom) {
    models::LmConfig m = models::lm_preset(r["preset"].as<std::string>());
    // Each shape flag by name (the config's own check names its field, e.g. BlockStackConfig.backbone).
    for (const char* flag : {"layers", "hidden", "heads", "kv-heads", "seq", "ffn", "expert-ffn"})
        if (r.count(flag) && r[flag].as<std::int64_t>() <= 0)
            SCMOE_FAIL("--" << flag << " " << r[flag].as<std::int64_t>() << ": expected a positive count");
    if (r.count("experts") && r["experts"].as<int>() <= 0)
        SCMOE_FAIL("--experts " << r["experts"].as<int>() << ": expected a positive count");
    if (r.count("layers")) m.layers = r["layers"].as<std::int64_t>();
    if (r.count("hidden")) m.backbone.hidden = r["hidden"].as<std::int64_t>();
    if (r.count("heads")) m.backbone.heads = r["heads"].as<std::int64_t>();
    if (r.count("kv-heads")) m.backbone.kv_heads = r["kv-heads"].as<std::int64_t>();
    if (r.count("activation")) {
        const std::string name = r["activation"].as<std::string>();
        SCMOE_CHECK(name == "swiglu" || name == "gelu", "--activation '" << name << "': expected swiglu or gelu");
        m.backbone.activation = m.moe.activation = parse_activation(name);
    }
    if (m.backbone.kv_heads > 0)
        SCMOE_CHECK(m.backbone.heads % m.backbone.kv_heads == 0,
                    "--kv-heads " << m.backbone.kv_heads << " (" << (r.count("kv-heads") ? "given" : "the preset's")
                                  << ") must divide --heads " << m.backbone.heads);
    if (r.count("seq")) m.backbone.seq_len = r["seq"].as<std::int64_t>();
    if (r.count("ffn")) m.backbone.ffn = r["ffn"].as<std::int64_t>();
    if (r.count("experts")) m.moe.num_experts = r["experts"].as<int>();
    if (r.count("expert-ffn")) m.moe.ffn = r["expert-ffn"].as<std::int64_t>();
    // A preset keeps its own vocabulary (LmConfig's default is the 256 bytes) unless --vocab is given.
    if (r.count("vocab"))
        m.vocab = r["vocab"].as<std::int64_t>();
    else if (m.vocab == models::LmConfig{}.vocab)
        m.vocab = r["vocab"].as<std::int64_t>();
    SCMOE_CHECK(m.vocab >= 256, "--vocab " << m.vocab << ": the data has 256 byte tokens");
    if (custom)
        *custom = r.count("layers") || r.count("hidden") || r.count("heads") || r.count("kv-heads") || r.count("seq") ||
                  r.count("ffn") || r.count("activation") || r.count("experts") || r.count("expert-ffn");
    return m;
}

namespace {

// Every renamed flag: its new name and why.
const std::map<std::string, std::string>& renamed_flags() {
    static const std::map<std::string, std::string> m = {
        {"nic-gbps", "--nic-gbps is renamed --nic-gbit-s, and its unit changed: it took GB/s (gigabytes per second) "
                     "while its name read Gb/s; --nic-gbit-s takes the NICs' line rate in Gb/s as NICs are sold "
                     "(100 for one 100 GbE NIC = 12.5 GB/s; an old --nic-gbps X is --nic-gbit-s 8X)"},
        {"link-gbps", "--link-gbps is renamed --link-gbyte-s (the same value: GB/s, gigabytes per second, per "
                      "direction); the old name read as Gb/s"},
    };
    return m;
}

double positive_number(const std::string& flag, const std::string& text) {
    char* end = nullptr;
    const double v = std::strtod(text.c_str(), &end);
    SCMOE_CHECK(!text.empty() && end && *end == 0 && std::isfinite(v) && v > 0,
                "--" << flag << " '" << text << "': expected a number > 0");
    return v;
}

}  // namespace

void add_renamed_option(cxxopts::Options& o, const std::string& old_name) {
    o.add_options("renamed")(old_name, "renamed", cxxopts::value<std::string>());
}

void refuse_renamed_options(const cxxopts::ParseResult& r) {
    for (const auto& [old_name, why] : renamed_flags())
        if (r.count(old_name)) SCMOE_FAIL(why);  // 0 where the tool has no such flag
}

std::vector<std::string> help_groups(const cxxopts::Options& o) {
    std::vector<std::string> out;
    for (const std::string& g : o.groups())
        if (g != "renamed") out.push_back(g);
    return out;
}

void add_cluster_options(cxxopts::Options& o, const std::string& group, bool nic_list) {
    std::string presets;
    for (const Topology& t : topology_presets()) presets += (presets.empty() ? "" : ", ") + t.name;
    // clang-format off
    o.add_options(group)
        ("cluster", "emu: the emulated cluster: a preset (" + presets + "; scmoe/comm/topology.cpp) or "
                    "link:gbyte_s=X[,latency_us=Y][,gpus=N] (X in GB/s); the flags below override the preset's "
                    "parameters (default: a built-in --gpu's 8-GPU node; a profile --gpu needs --cluster)",
         cxxopts::value<std::string>())
        ("nodes", "emu: nodes (overrides the preset's; more than one needs --nic-gbit-s)", cxxopts::value<int>())
        ("gpus-per-node", "emu: GPUs per node (overrides the preset's)", cxxopts::value<int>())
        ("fabric", "emu: within a node, nvlink or pcie (overrides the preset's; pcie: each GPU on its own PCIe link "
                   "(the --gpu's host link, GB/s), 4 GPUs per switch, assumed; nvlink from a PCIe preset needs "
                   "--gpu-link-gbyte-s)", cxxopts::value<std::string>())
        ("gpu-link-gbyte-s", "emu: each GPU's link within a node (NVLink, or PCIe with --fabric pcie), in GB/s "
                             "(gigabytes per second) per direction, e.g. 300 for an A100's 600 GB/s NVLink",
         cxxopts::value<double>())
        ("nic-gbit-s", std::string("emu: the NICs between nodes: line rate per node, all its NICs together, in Gb/s "
                               "(gigabits per second, as NICs are sold: 100 = one 100 GbE NIC = 12.5 GB/s; "
                               "3200 = 8x 400 Gb/s NDR)") +
                           (nic_list ? "; a comma list sweeps the speeds (one search each)" : ""),
         cxxopts::value<std::string>());
    // clang-format on
    add_renamed_option(o, "nic-gbps");
}

bool any_cluster_option(const cxxopts::ParseResult& r) {
    for (const char* f : {"cluster", "nodes", "gpus-per-node", "fabric", "gpu-link-gbyte-s", "nic-gbit-s"})
        if (r.count(f)) return true;
    return false;
}

ClusterFlags read_cluster_options(const cxxopts::ParseResult& r, std::vector<double>* nic_sweep) {
    refuse_renamed_options(r);
    ClusterFlags f;
    if (r.count("cluster")) f.cluster = r["cluster"].as<std::string>();
    if (r.count("nodes")) f.nodes = r["nodes"].as<int>();
    if (r.count("gpus-per-node")) f.gpus_per_node = r["gpus-per-node"].as<int>();
    if (r.count("fabric")) f.fabric = r["fabric"].as<std::string>();
    if (r.count("gpu-link-gbyte-s")) f.gpu_link_gbyte_s = r["gpu-link-gbyte-s"].as<double>();
    if (r.count("nic-gbit-s")) {
        const std::string text = r["nic-gbit-s"].as<std::string>();
        std::vector<double> speeds;
        for (const std::string& item : split_comma_list(text)) speeds.push_back(positive_number("nic-gbit-s", item));
        SCMOE_CHECK(!speeds.empty(), "--nic-gbit-s is empty");
        SCMOE_CHECK(speeds.size() == 1 || nic_sweep,
                    "--nic-gbit-s " << text << ": one line rate in Gb/s here (a list is scmoe-plan's sweep)");
        f.nic_gbit_s = speeds.front();
        if (nic_sweep && speeds.size() > 1) *nic_sweep = speeds;
    }
    return f;
}

}  // namespace scmoe::launch
