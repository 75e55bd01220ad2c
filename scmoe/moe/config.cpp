#include "scmoe/moe/config.h"

#include <cmath>
#include <limits>
#include <sstream>

#include "scmoe/kernels/error.h"
#include "scmoe/kernels/router.h"

namespace scmoe {

const char* dispatch_mode_name(DispatchMode m) { return m == DispatchMode::kCapacity ? "capacity" : "dropless"; }

DispatchMode parse_dispatch_mode(const std::string& name) {
    if (name == "capacity") return DispatchMode::kCapacity;
    if (name == "dropless") return DispatchMode::kDropless;
    SCMOE_FAIL("MoeConfig.dispatch: unknown mode '" << name << "': expected capacity or dropless");
}

Activation parse_activation(const std::string& name) {
    if (name == "swiglu") return Activation::kSwiGLU;
    if (name == "gelu") return Activation::kGeLU;
    SCMOE_FAIL("MoeConfig.activation: unknown activation '" << name << "': expected swiglu or gelu");
}

void MoeConfig::validate() const {
    SCMOE_CHECK(version == 1, "MoeConfig.version = " << version << ": this build understands version 1");
    SCMOE_CHECK(hidden > 0, "MoeConfig.hidden = " << hidden << ": must be > 0");
    SCMOE_CHECK(ffn > 0, "MoeConfig.ffn = " << ffn << ": must be > 0");
    SCMOE_CHECK(num_experts > 0, "MoeConfig.num_experts = " << num_experts << ": must be > 0");
    SCMOE_CHECK(top_k >= 1 && top_k <= kMaxTopK,
                "MoeConfig.top_k = " << top_k << ": must be in [1, " << kMaxTopK
                                     << "] (kMaxTopK, the router kernels' per-token limit)");
    SCMOE_CHECK(top_k <= num_experts, "MoeConfig.top_k = " << top_k << ": exceeds num_experts = " << num_experts
                                                           << " (a token's choices are distinct experts)");
    SCMOE_CHECK(std::isfinite(capacity_factor) && capacity_factor > 0.0f,
                "MoeConfig.capacity_factor = " << capacity_factor << ": must be a finite number > 0");
    SCMOE_CHECK(dtype == DType::kF32 || dtype == DType::kBF16,
                "MoeConfig.dtype = " << dtype_name(dtype) << ": must be f32 or bf16");
    SCMOE_CHECK(shared_ffn >= 0, "MoeConfig.shared_ffn = " << shared_ffn << ": must be >= 0 (0 = ffn)");
    // Every weight's element count fits in int64: the experts' W1 [E, H, I] and the shared expert's
    // [H, I_shared], counted with I = 2F (SwiGLU's; GELU's F is smaller), so expert_inner_width() and
    // every size derived from them are exact.
    auto weight_fits = [&](std::int64_t width, std::int64_t copies) {
        std::int64_t n = 0;
        return width <= std::numeric_limits<std::int64_t>::max() / 2 && !__builtin_mul_overflow(hidden, 2 * width, &n) &&
               !__builtin_mul_overflow(n, copies, &n);
    };
    SCMOE_CHECK(weight_fits(ffn, num_experts), "MoeConfig.ffn = " << ffn << " with hidden = " << hidden << " and "
                                                                  << num_experts
                                                                  << " experts: the expert weights' size overflows");
    SCMOE_CHECK(weight_fits(shared_ffn, 1), "MoeConfig.shared_ffn = " << shared_ffn << " with hidden = " << hidden
                                                                      << ": the shared expert's weights' size overflows");
    SCMOE_CHECK(!coefficient_gate || shared_expert,
                "MoeConfig.coefficient_gate = true: CG-1 gates the shared expert, so shared_expert must be true");
    SCMOE_CHECK(std::isfinite(noise_std) && noise_std >= 0.0f, "MoeConfig.noise_std = " << noise_std << ": must be >= 0");
    SCMOE_CHECK(std::isfinite(aux_loss_coef) && aux_loss_coef >= 0.0f,
                "MoeConfig.aux_loss_coef = " << aux_loss_coef << ": must be >= 0");
    SCMOE_CHECK(std::isfinite(z_loss_coef) && z_loss_coef >= 0.0f,
                "MoeConfig.z_loss_coef = " << z_loss_coef << ": must be >= 0");
    SCMOE_CHECK(std::isfinite(recv_limit_factor) && (recv_limit_factor == 0.0f || recv_limit_factor >= 1.0f),
                "MoeConfig.recv_limit_factor = " << recv_limit_factor
                                                 << ": must be 0 (no limit) or >= 1 (times the balanced load)");
}

std::string MoeConfig::to_string() const {
    std::ostringstream os;
    os << "hidden=" << hidden << " ffn=" << ffn << " experts=" << num_experts << " top_k=" << top_k
       << " dispatch=" << dispatch_mode_name(dispatch);
    if (dispatch == DispatchMode::kCapacity)
        os << " capacity_factor=" << capacity_factor;
    else
        os << " recv_limit_factor=" << recv_limit_factor;
    os << " activation=" << activation_name(activation) << " dtype=" << dtype_name(dtype)
       << " shared_expert=" << (shared_expert ? "on" : "off");
    if (shared_expert) os << " shared_ffn=" << shared_ffn_width() << " cg1=" << (coefficient_gate ? "on" : "off");
    os << " noise_std=" << noise_std << " aux_loss_coef=" << aux_loss_coef << " z_loss_coef=" << z_loss_coef;
    return os.str();
}

std::uint64_t MoeConfig::hash() const {
    // FNV-1a over the canonical text plus the fields the text rounds.
    std::ostringstream os;
    os << to_string() << " seed=" << noise_seed << " check_finite=" << check_finite << " version=" << version;
    std::uint64_t h = 1469598103934665603ull;
    for (unsigned char c : os.str()) h = (h ^ c) * 1099511628211ull;
    return h;
}

}  // namespace scmoe
