#include "scmoe/moe/params.h"

#include <memory>

#include "scmoe/kernels/error.h"
#include "scmoe/kernels/host_io.h"
#include "scmoe/moe/keyed_normal.h"

namespace scmoe {

const char* grad_group_name(GradGroup g) {
    return g == GradGroup::kExpertReplicas ? "expert-replicas" : "data-parallel";
}

std::int64_t ParamSpec::numel() const {
    if (shape.empty()) return 0;
    std::int64_t n = 1;
    for (std::int64_t d : shape) n *= d;
    return n;
}

std::vector<ParamSpec> moe_param_specs(const MoeConfig& c, int ep_size) {
    SCMOE_CHECK(ep_size >= 1 && c.num_experts % ep_size == 0,
                "MoeConfig.num_experts = " << c.num_experts << " is not divisible by the expert-parallel size " << ep_size);
    const std::int64_t H = c.hidden, E = c.num_experts / ep_size, I = c.expert_inner_width(), F = c.ffn;
    const std::int64_t Fs = c.shared_ffn_width(), Is = activation_input_width(c.activation, Fs);
    using Shape = std::vector<std::int64_t>;
    return {
        {"gate_w", Shape{H, c.num_experts}},
        {"expert_w1", Shape{E, H, I}, GradGroup::kExpertReplicas},
        {"expert_w2", Shape{E, F, H}, GradGroup::kExpertReplicas},
        {"shared_w1", c.shared_expert ? Shape{H, Is} : Shape{}},
        {"shared_w2", c.shared_expert ? Shape{Fs, H} : Shape{}},
        {"cg_w", c.coefficient_gate ? Shape{H, 1} : Shape{}},
    };
}

void check_moe_params(const MoeConfig& config, const MoeParams& params, DType dtype, const char* what,
                      int ep_size) {
    const auto specs = moe_param_specs(config, ep_size);
    const Tensor* t = params.begin();
    for (const ParamSpec& spec : specs) {
        const std::string name = std::string(what) + "." + spec.name;
        if (spec.shape.empty()) {
            SCMOE_CHECK(!t->defined(), name << " is set but the config does not use it (" << config.to_string() << ")");
        } else {
            bool ok = t->dtype == dtype && t->ndim == static_cast<int>(spec.shape.size()) && t->data != nullptr;
            for (std::size_t i = 0; ok && i < spec.shape.size(); ++i) ok = t->dim(static_cast<int>(i)) == spec.shape[i];
            if (!ok) {
                std::string expected = "[";
                for (std::size_t i = 0; i < spec.shape.size(); ++i)
                    expected += (i ? ", " : "") + std::to_string(spec.shape[i]);
                SCMOE_FAIL(name << ": expected " << expected << "] " << dtype_name(dtype) << ", got " << describe(*t)
                                << (t->data ? "" : " (null data)"));
            }
        }
        ++t;
    }
}

MoeParamStore::MoeParamStore(Device& device, const MoeConfig& config, DType dtype, int ep_size)
    : dtype_(dtype), ep_size_(ep_size) {
    config.validate();
    specs_ = moe_param_specs(config, ep_size);
    for (const ParamSpec& s : specs_) numel_ += s.numel();
    buffer_ = DeviceBuffer(device, static_cast<std::size_t>(numel_) * dtype_size(dtype));
    const std::unique_ptr<Stream> stream = device.create_stream();
    stream->fill_zero(buffer_.data(), buffer_.bytes());
    stream->synchronize();
    auto* base = static_cast<char*>(buffer_.data());
    std::size_t offset = 0;
    Tensor* t = view_.begin();
    for (const ParamSpec& s : specs_) {
        if (!s.shape.empty()) {
            t->data = base + offset;
            t->dtype = dtype;
            t->ndim = static_cast<int>(s.shape.size());
            for (std::size_t i = 0; i < s.shape.size(); ++i) t->dims[i] = s.shape[i];
            offset += static_cast<std::size_t>(s.numel()) * dtype_size(dtype);
        }
        ++t;
    }
}

void MoeParamStore::init(std::uint64_t seed, Stream& stream, int ep_rank) {
    SCMOE_CHECK(ep_rank >= 0 && ep_rank < ep_size_,
                "MoeParamStore.init: ep_rank = " << ep_rank << " outside the store's " << ep_size_ << " rank(s)");
    std::vector<float> host(static_cast<std::size_t>(numel_));
    float* out = host.data();
    for (const ParamSpec& s : specs_) {
        if (s.shape.empty()) continue;
        const bool expert = s.name == "expert_w1" || s.name == "expert_w2";
        const std::int64_t parts = expert ? s.shape[0] : 1, per_part = s.numel() / parts;
        for (std::int64_t e = 0; e < parts; ++e) {
            KeyedNormal rng(seed, s.name, static_cast<std::uint64_t>(expert ? ep_rank * parts + e : 0));
            for (std::int64_t i = 0; i < per_part; ++i) *out++ = kInitStd * rng.next();
        }
    }
    copy_from_host(host, Tensor(buffer_.data(), dtype_, {numel_}), stream);  // converts; synchronizes
}

}  // namespace scmoe
