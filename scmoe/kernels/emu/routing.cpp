#include "scmoe/kernels/emu/routing.h"

#include <cmath>
#include <cstdlib>
#include <sstream>

#include "scmoe/kernels/error.h"
#include "scmoe/kernels/math.h"

namespace scmoe::emu {

RoutingModel parse_routing_model(const std::string& text) {
    RoutingModel m;
    if (text == "balanced") return m;
    if (text.rfind("zipf:", 0) == 0) {
        m.kind = RoutingModel::Kind::kZipf;
        char* end = nullptr;
        const char* begin = text.c_str() + 5;
        m.zipf_s = std::strtod(begin, &end);
        SCMOE_CHECK(end != begin && *end == 0 && m.zipf_s >= 0, "routing '" << text << "': expected zipf:S with S >= 0");
        return m;
    }
    if (text.rfind("counts:", 0) == 0) {
        m.kind = RoutingModel::Kind::kCounts;
        std::stringstream in(text.substr(7));
        std::string item;
        double total = 0;
        while (std::getline(in, item, ',')) {
            char* end = nullptr;
            const double c = std::strtod(item.c_str(), &end);
            SCMOE_CHECK(!item.empty() && end && *end == 0 && c >= 0,
                        "routing '" << text << "': '" << item << "' is not a count >= 0");
            m.counts.push_back(c);
            total += c;
        }
        SCMOE_CHECK(!m.counts.empty() && total > 0, "routing '" << text << "': expected counts:c0,c1,... with a c > 0");
        return m;
    }
    SCMOE_FAIL("routing '" << text << "': expected balanced, zipf:S or counts:c0,c1,...");
}

std::string describe(const RoutingModel& m) {
    std::ostringstream os;
    switch (m.kind) {
        case RoutingModel::Kind::kBalanced: os << "balanced"; break;
        case RoutingModel::Kind::kZipf: os << "zipf:" << m.zipf_s; break;
        case RoutingModel::Kind::kCounts:
            os << "counts:";
            for (std::size_t i = 0; i < m.counts.size(); ++i) os << (i ? "," : "") << m.counts[i];
            break;
    }
    return os.str();
}

void draw_choices(const RoutingModel& model, std::uint64_t key, std::int64_t tokens, int num_experts, int top_k,
                  std::int32_t* expert_index, float* expert_fraction) {
    SCMOE_CHECK(num_experts >= 1 && top_k >= 1 && top_k <= num_experts && tokens >= 0,
                "emu router: " << tokens << " tokens, " << num_experts << " experts, top-" << top_k);
    std::vector<double> weight(static_cast<std::size_t>(num_experts), 1.0);
    for (int e = 0; e < num_experts; ++e) {
        const auto i = static_cast<std::size_t>(e);
        if (model.kind == RoutingModel::Kind::kZipf) weight[i] = 1.0 / std::pow(static_cast<double>(e + 1), model.zipf_s);
        if (model.kind == RoutingModel::Kind::kCounts) weight[i] = model.counts[i % model.counts.size()];
    }
    std::vector<std::int64_t> count(static_cast<std::size_t>(num_experts), 0);
    std::vector<double> w(weight.size());
    const std::uint64_t base = math::noise_key(model.seed, key, 0);
    for (std::int64_t t = 0; t < tokens; ++t) {
        w = weight;
        for (int j = 0; j < top_k; ++j) {
            double total = 0;
            for (double x : w)
                if (x > 0) total += x;
            const std::uint64_t r = math::splitmix64(base ^ math::splitmix64(static_cast<std::uint64_t>(t * top_k + j)));
            const double u = static_cast<double>(r >> 11) * (1.0 / 9007199254740992.0) * total;
            int chosen = -1;
            double acc = 0;
            for (int e = 0; e < num_experts; ++e) {
                if (w[static_cast<std::size_t>(e)] <= 0) continue;
                chosen = e;  // the last expert with weight catches rounding at the top end
                acc += w[static_cast<std::size_t>(e)];
                if (u < acc) break;
            }
            if (chosen < 0) {  // every remaining weight is zero: take the first expert not chosen yet
                for (int e = 0; e < num_experts && chosen < 0; ++e)
                    if (w[static_cast<std::size_t>(e)] == 0) chosen = e;
            }
            expert_index[t * top_k + j] = chosen;
            w[static_cast<std::size_t>(chosen)] = -1;  // not again for this token
            ++count[static_cast<std::size_t>(chosen)];
        }
    }
    if (expert_fraction) {
        const double total = static_cast<double>(tokens * top_k);
        for (int e = 0; e < num_experts; ++e)
            expert_fraction[e] = total > 0 ? static_cast<float>(static_cast<double>(count[static_cast<std::size_t>(e)]) / total) : 0.0f;
    }
}

}  // namespace scmoe::emu
