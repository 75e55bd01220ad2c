#include "launch/cli_options.h"

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

}  // namespace scmoe::launch
