#include "launch/emu_stack.h"

#include <algorithm>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "scmoe/kernels/error.h"
#include "scmoe/models/data.h"

namespace scmoe::launch {

namespace {

bool ends_with(const std::string& s, const std::string& tail) {
    return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

const char* type_name(const nlohmann::json& v) { return v.type_name(); }

}  // namespace

emu::Stack load_stack(const std::string& name) {
    if (!ends_with(name, ".json")) return emu::builtin_stack(name);
    const std::string where = "--stack " + name;
    if (const std::string why = models::data_file_problem(name); !why.empty())
        SCMOE_FAIL(where << ": the stack file " << why << "; expected a JSON file (docs/emu.md)");
    std::ifstream in(name);
    SCMOE_CHECK(in, where << ": cannot open the stack file");
    nlohmann::json j;
    try {
        in >> j;
    } catch (const std::exception& e) {
        SCMOE_FAIL(where << ": not JSON: " << e.what());
    }
    SCMOE_CHECK(j.is_object(), where << ": a stack is a JSON object");
    // The boolean fields, each the Stack member of its name; with the others, every field a file may hold.
    static const std::pair<const char*, bool emu::Stack::*> flags[] = {
        {"attention_dropout", &emu::Stack::attention_dropout},
        {"attention_bias", &emu::Stack::attention_bias},
        {"attention_softmax_f32", &emu::Stack::attention_softmax_f32},
        {"attention_scale_scores", &emu::Stack::attention_scale_scores},
        {"attention_mask_add", &emu::Stack::attention_mask_add},
        {"attention_softmax_cast_in", &emu::Stack::attention_softmax_cast_in},
        {"norm_f32", &emu::Stack::norm_f32},
        {"tutel_dispatch", &emu::Stack::tutel_dispatch},
        {"activation_f32", &emu::Stack::activation_f32},
        {"expert_activation", &emu::Stack::expert_activation},
        {"loss_f32", &emu::Stack::loss_f32},
        {"fairseq_optimizer", &emu::Stack::fairseq_optimizer}};
    static const char* const others[] = {"base", "name", "description", "attention", "framework_us",
                                         "all_to_all_efficiency", "small_gemm", "grad_reduce", "grad_reduce_dtype",
                                         "sources"};
    std::vector<std::string> known(std::begin(others), std::end(others));
    for (const auto& [key, member] : flags) known.emplace_back(key);
    for (const auto& [key, value] : j.items())
        if (std::find(known.begin(), known.end(), key) == known.end()) {
            std::string fields;
            for (const std::string& k : known) fields += (fields.empty() ? "" : ", ") + k;
            SCMOE_FAIL(where << ": unknown field '" << key << "' (fields: " << fields << ")");
        }
    auto str = [&](const char* key) {
        const auto& v = j.at(key);
        SCMOE_CHECK(v.is_string(), where << ": field '" << key << "' must be a string, got " << type_name(v));
        return v.get<std::string>();
    };
    auto num = [&](const char* key, const nlohmann::json& v) {
        SCMOE_CHECK(v.is_number(), where << ": field '" << key << "' must be a number, got " << type_name(v));
        return v.get<double>();
    };
    emu::Stack s = emu::builtin_stack("scmoe");
    if (j.contains("base")) {
        const std::string base = str("base");
        try {
            s = emu::builtin_stack(base);
        } catch (const Error&) {
            SCMOE_FAIL(where << ": field 'base' is '" << base << "': one of " << emu::builtin_stack_names());
        }
    }
    s.name = j.contains("name") ? str("name") : name;
    s.description = j.contains("description") ? str("description") : "stack file " + name;
    // A field of two spellings: true for `first`, false for `second`; anything else names the field.
    auto either = [&](const char* key, const char* first, const char* second) {
        const std::string v = str(key);
        SCMOE_CHECK(v == first || v == second,
                    where << ": field '" << key << "' is '" << v << "': " << first << " or " << second);
        return v == first;
    };
    auto boolean = [&](const char* key) {
        const auto& v = j.at(key);
        SCMOE_CHECK(v.is_boolean(), where << ": field '" << key << "' must be a boolean, got " << type_name(v));
        return v.get<bool>();
    };
    if (j.contains("attention"))
        s.attention = either("attention", "fused", "unfused") ? emu::AttentionImpl::kFused : emu::AttentionImpl::kUnfused;
    for (const auto& [key, member] : flags)
        if (j.contains(key)) s.*member = boolean(key);
    if (j.contains("grad_reduce"))
        s.grad_reduce = either("grad_reduce", "overlapped", "after_backward") ? emu::GradReduce::kOverlapped
                                                                                : emu::GradReduce::kAfterBackward;
    if (j.contains("grad_reduce_dtype"))
        s.grad_reduce_dtype = either("grad_reduce_dtype", "f32", "bf16") ? DType::kF32 : DType::kBF16;
    if (j.contains("framework_us")) s.framework_us = num("framework_us", j.at("framework_us"));
    if (j.contains("all_to_all_efficiency"))
        s.all_to_all_efficiency = num("all_to_all_efficiency", j.at("all_to_all_efficiency"));
    if (j.contains("small_gemm")) {
        const auto& v = j.at("small_gemm");
        SCMOE_CHECK(v.is_array(), where << ": field 'small_gemm' must be an array of [size, fraction] pairs, got "
                                        << type_name(v));
        s.small_gemm.clear();
        for (std::size_t i = 0; i < v.size(); ++i) {
            const auto& p = v[i];
            const std::string field = "small_gemm[" + std::to_string(i) + "]";
            SCMOE_CHECK(p.is_array() && p.size() == 2,
                        where << ": field '" << field << "' must be a [size, fraction] pair, got " << p.dump());
            s.small_gemm.push_back({num((field + "[0]").c_str(), p[0]), num((field + "[1]").c_str(), p[1])});
        }
    }
    if (j.contains("sources")) {
        const auto& v = j.at("sources");
        SCMOE_CHECK(v.is_array(), where << ": field 'sources' must be an array of strings, got " << type_name(v));
        s.sources.clear();
        for (std::size_t i = 0; i < v.size(); ++i) {
            SCMOE_CHECK(v[i].is_string(), where << ": field 'sources[" << i << "]' must be a string, got "
                                                << type_name(v[i]));
            s.sources.push_back(v[i].get<std::string>());
        }
    }
    try {
        emu::check_stack(s);
    } catch (const Error& e) {
        SCMOE_FAIL(where << ": " << e.what());
    }
    s.sources.push_back("stack file " + name);
    return s;
}

void apply_grad_reduce(const emu::Stack& stack, models::TrainConfig& config) {
    config.overlap_grad_reduce = stack.grad_reduce == emu::GradReduce::kOverlapped;
    config.grad_reduce_dtype = stack.grad_reduce_dtype;
}

Topology stack_topology(Topology cluster, const emu::Stack& stack) {
    cluster.all_to_all_efficiency = stack.all_to_all_efficiency;
    return cluster;
}
Topology stack_topology(const std::string& cluster, const emu::Stack& stack) {
    return stack_topology(cluster_topology(cluster), stack);
}
Topology emulated_topology(Topology cluster, const std::string& stack_name_or_file) {
    return stack_topology(std::move(cluster), load_stack(stack_name_or_file));
}

}  // namespace scmoe::launch
