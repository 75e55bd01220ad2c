// The language model through the installed package (component scmoe::models): the tiny preset,
// seeded, scores a text — the mean cross-entropy in nats per predicted byte. At initialisation the
// model predicts bytes near uniformly, so the loss must lie near ln(256) = 5.545.
#include <scmoe/scmoe.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "scmoe/models/lm.h"

int main() {
    auto device = scmoe::make_device("auto");
    scmoe::models::LmConfig config = scmoe::models::lm_preset("tiny");
    config.backbone.dtype = device->compute_dtype();
    config.moe.dtype = device->compute_dtype();
    const std::int64_t seq = config.backbone.seq_len, tokens = 2 * seq;
    scmoe::models::LanguageModel model(config, *device, tokens);
    model.init_params(/*seed=*/7);

    const std::string text =
        "Shortcut-connected expert parallelism overlaps the all-to-all of each mixture-of-experts layer "
        "with the dense compute of the block before it, so tokens reach their experts while the backbone "
        "works. This text is long enough for two windows of the tiny model's sequence length.";
    std::vector<std::int32_t> inputs(static_cast<std::size_t>(tokens)), targets(inputs.size());
    for (std::size_t i = 0; i < inputs.size(); ++i) {
        inputs[i] = static_cast<unsigned char>(text[i]);
        targets[i] = static_cast<unsigned char>(text[i + 1]);
    }
    model.forward(inputs.data(), targets.data(), tokens);
    const double loss = model.loss_sum() / static_cast<double>(tokens);
    if (!(std::fabs(loss - std::log(256.0)) < 0.5)) {
        std::printf("scmoe lm consumer FAILED: loss %.4f, expected near ln(256) = 5.545\n", loss);
        return 1;
    }
    std::printf("scmoe lm consumer ok: %s, %lld parameters, loss %.4f nats/byte, perplexity %.2f\n",
                config.describe().c_str(), static_cast<long long>(model.num_params()), loss, std::exp(loss));
    return 0;
}
