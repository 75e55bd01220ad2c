// Fuzzes configuration validation: MoeConfig (scmoe/moe/config.h), BlockStackConfig and block_variant
// (scmoe/moe/block_stack.h) and LmConfig (scmoe/models/lm_config.h), with every field decoded from the input —
// integers over their whole range, floats from raw bits (NaN, infinities, denormals). validate() must
// throw scmoe::Error for bad values; for a configuration it accepts, what is derived from it (widths,
// to_string, hash, the block stack, the JSON round trip) must work without overflow.
#include <fuzzer/FuzzedDataProvider.h>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string>

#include "scmoe/kernels/error.h"
#include "scmoe/models/lm_config.h"
#include "scmoe/moe/block_stack.h"
#include "scmoe/moe/config.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using scmoe::fuzz::property_failed;

std::int64_t consume_size(FuzzedDataProvider& in) {
    switch (in.ConsumeIntegralInRange<int>(0, 2)) {
        case 0:
            return in.ConsumeIntegralInRange<std::int64_t>(-2, 64);
        case 1:
            return std::int64_t{1} << in.ConsumeIntegralInRange<int>(0, 62);
        default:
            return in.ConsumeIntegral<std::int64_t>();
    }
}
int consume_small_int(FuzzedDataProvider& in) {
    return in.ConsumeBool() ? in.ConsumeIntegralInRange<int>(-2, 16) : in.ConsumeIntegral<int>();
}
float consume_float(FuzzedDataProvider& in) {
    return in.ConsumeBool() ? in.ConsumeFloatingPointInRange<float>(-2.0f, 4.0f)
                            : std::bit_cast<float>(in.ConsumeIntegral<std::uint32_t>());
}
scmoe::DType consume_dtype(FuzzedDataProvider& in) {
    constexpr scmoe::DType kAll[] = {scmoe::DType::kF32, scmoe::DType::kBF16, scmoe::DType::kI32};
    return in.PickValueInArray(kAll);
}
scmoe::Activation consume_activation(FuzzedDataProvider& in) {
    return in.ConsumeBool() ? scmoe::Activation::kSwiGLU : scmoe::Activation::kGeLU;
}

scmoe::MoeConfig consume_moe(FuzzedDataProvider& in) {
    scmoe::MoeConfig c;
    c.version = in.ConsumeBool() ? 1 : in.ConsumeIntegral<int>();
    c.hidden = consume_size(in);
    c.ffn = consume_size(in);
    c.num_experts = consume_small_int(in);
    c.top_k = consume_small_int(in);
    c.capacity_factor = consume_float(in);
    c.dispatch = in.ConsumeBool() ? scmoe::DispatchMode::kCapacity : scmoe::DispatchMode::kDropless;
    c.activation = consume_activation(in);
    c.dtype = consume_dtype(in);
    c.shared_expert = in.ConsumeBool();
    c.shared_ffn = consume_size(in);
    c.coefficient_gate = in.ConsumeBool();
    c.noise_std = consume_float(in);
    c.noise_seed = in.ConsumeIntegral<std::uint64_t>();
    c.aux_loss_coef = consume_float(in);
    c.z_loss_coef = consume_float(in);
    c.check_finite = in.ConsumeBool();
    c.recv_limit_factor = consume_float(in);
    return c;
}

scmoe::BackboneShape consume_backbone(FuzzedDataProvider& in) {
    scmoe::BackboneShape b;
    b.hidden = consume_size(in);
    b.heads = consume_size(in);
    b.seq_len = consume_size(in);
    b.ffn = consume_size(in);
    b.activation = consume_activation(in);
    b.dtype = consume_dtype(in);
    b.norm_eps = consume_float(in);
    return b;
}

void use_moe(const scmoe::MoeConfig& c) {
    if (c.expert_inner_width() <= 0 || c.shared_ffn_width() <= 0) property_failed("a valid MoeConfig has a width <= 0");
    (void)c.to_string();
    (void)c.hash();
}

void fuzz_moe(FuzzedDataProvider& in) {
    const scmoe::MoeConfig c = consume_moe(in);
    c.validate();
    use_moe(c);
}

void fuzz_block_stack(FuzzedDataProvider& in) {
    scmoe::BlockStackConfig c;
    c.backbone = consume_backbone(in);
    c.moe = consume_moe(in);
    if (in.ConsumeBool()) {
        c.moe.hidden = c.backbone.hidden;
        c.moe.dtype = c.backbone.dtype;
    }
    const int num_blocks = in.ConsumeIntegralInRange<int>(0, 8);
    for (int b = 0; b < num_blocks; ++b) {
        constexpr scmoe::ShortcutSource kShortcuts[] = {scmoe::ShortcutSource::kCurrent, scmoe::ShortcutSource::kPos1,
                                                        scmoe::ShortcutSource::kPos2, scmoe::ShortcutSource::kPos3};
        c.blocks.push_back(
            {in.ConsumeBool() ? scmoe::FfnKind::kMoe : scmoe::FfnKind::kDense, in.PickValueInArray(kShortcuts)});
    }
    if (in.ConsumeBool()) {
        const std::string variant = in.ConsumeRandomLengthString(24);
        c = scmoe::block_variant(variant, c.backbone, c.moe, in.ConsumeBool(), consume_small_int(in));
    }
    c.validate();
    (void)c.to_string();
    for (const scmoe::BlockSpec& b : c.blocks)
        if (b.ffn == scmoe::FfnKind::kMoe) use_moe(c.moe);
    (void)scmoe::moe_scratch_groups(c.blocks);
}

void fuzz_lm(FuzzedDataProvider& in) {
    scmoe::models::LmConfig c;
    if (in.ConsumeBool()) {
        const auto names = scmoe::models::lm_preset_names();
        c = scmoe::models::lm_preset(names[in.ConsumeIntegralInRange<std::size_t>(0, names.size() - 1)]);
    }
    switch (in.ConsumeIntegralInRange<int>(0, 3)) {  // which fields to override; 3: all of them
        case 0:
            c.layers = consume_size(in);
            break;
        case 1:
            c.backbone = consume_backbone(in);
            break;
        case 2:
            c.moe = consume_moe(in);
            break;
        default:
            c.vocab = consume_size(in);
            c.layers = consume_size(in);
            c.coefficient_gate = in.ConsumeBool();
            c.backbone = consume_backbone(in);
            c.moe = consume_moe(in);
    }
    const auto variants = scmoe::block_variant_names();
    c.variant = in.ConsumeBool() ? variants[in.ConsumeIntegralInRange<std::size_t>(0, variants.size() - 1)]
                                 : in.ConsumeRandomLengthString(24);
    c.validate();
    const scmoe::BlockStackConfig stack = c.block_stack();
    if (static_cast<std::int64_t>(stack.blocks.size()) != c.layers)
        property_failed("block_stack() has != layers blocks");
    (void)c.describe();
    const std::string json = c.to_json();
    if (scmoe::models::LmConfig::from_json(json).to_json() != json)
        property_failed("a valid LmConfig does not read back from its to_json()");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    FuzzedDataProvider in(data, size);
    try {
        switch (in.ConsumeIntegralInRange<int>(0, 2)) {
            case 0:
                fuzz_moe(in);
                break;
            case 1:
                fuzz_block_stack(in);
                break;
            default:
                fuzz_lm(in);
                break;
        }
    } catch (const scmoe::Error&) {
    }
    return 0;
}
