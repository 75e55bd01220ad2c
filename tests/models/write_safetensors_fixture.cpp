// Writes the checkpoint that check_safetensors.py reads with the Python `safetensors` package:
//   scmoe_safetensors_fixture <dir>
// creates <dir>/single.safetensors and a sharded pair model-0000{1,2}-of-00002.safetensors with
// model.safetensors.index.json. Element i of the k-th tensor in kTensors holds v = i * 0.25 - 3 + k:
// floats exactly v (bf16: the top 16 bits of the f32, exact for these values), integers
// 3 * i - 7 + k, U8 (37 * i + k) mod 256. check_safetensors.py computes the same values.
#include <cstdint>
#include <cstring>
#include <exception>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "scmoe/models/safetensors.h"

namespace {

using scmoe::SafetensorsDType;

struct Spec {
    const char* name;
    SafetensorsDType dtype;
    std::vector<std::int64_t> shape;
    int shard;  // 0 or 1 in the sharded checkpoint
};

const std::vector<Spec> kTensors{
    {"embed", SafetensorsDType::kF32, {3, 4}, 0},
    {"layers.0.gate_w", SafetensorsDType::kBF16, {2, 5}, 0},
    {"layers.0.expert_w1.rank0", SafetensorsDType::kBF16, {2, 3, 4}, 0},
    {"layers.0.expert_w1.rank1", SafetensorsDType::kBF16, {2, 3, 4}, 1},
    {"tokens", SafetensorsDType::kI32, {7}, 1},
    {"counts", SafetensorsDType::kI64, {2, 2}, 1},
    {"mask", SafetensorsDType::kU8, {5}, 1},
    {"scale", SafetensorsDType::kF64, {}, 0},
    {"empty", SafetensorsDType::kF32, {0, 3}, 1},
};

const std::map<std::string, std::string> kMetadata{
    {"config", R"({"hidden": 64, "num_experts": 8, "ep_size": 2})"}, {"step", "100"}, {"world_size", "2"}};

std::vector<std::uint8_t> values(const Spec& spec, int k) {
    std::int64_t numel = 1;
    for (std::int64_t d : spec.shape) numel *= d;
    const std::size_t size = scmoe::safetensors_dtype_size(spec.dtype);
    std::vector<std::uint8_t> bytes(static_cast<std::size_t>(numel) * size);
    for (std::int64_t i = 0; i < numel; ++i) {
        std::uint8_t* out = bytes.data() + static_cast<std::size_t>(i) * size;
        const double v = static_cast<double>(i) * 0.25 - 3.0 + k;
        const std::int64_t n = 3 * i - 7 + k;
        switch (spec.dtype) {
            case SafetensorsDType::kF32: {
                const auto f = static_cast<float>(v);
                std::memcpy(out, &f, 4);
                break;
            }
            case SafetensorsDType::kBF16: {
                const auto f = static_cast<float>(v);
                std::uint32_t bits = 0;
                std::memcpy(&bits, &f, 4);
                const auto top = static_cast<std::uint16_t>(bits >> 16);
                std::memcpy(out, &top, 2);
                break;
            }
            case SafetensorsDType::kF64:
                std::memcpy(out, &v, 8);
                break;
            case SafetensorsDType::kI32: {
                const auto x = static_cast<std::int32_t>(n);
                std::memcpy(out, &x, 4);
                break;
            }
            case SafetensorsDType::kI64:
                std::memcpy(out, &n, 8);
                break;
            case SafetensorsDType::kU8:
                *out = static_cast<std::uint8_t>((37 * i + k) % 256);
                break;
            default:
                throw std::runtime_error("fixture: no values for this dtype");
        }
    }
    return bytes;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 2) {
        std::cerr << "usage: " << argv[0] << " <dir>\n";
        return 2;
    }
    const std::string dir = argv[1];
    try {
        std::vector<std::vector<std::uint8_t>> data;
        for (std::size_t k = 0; k < kTensors.size(); ++k) data.push_back(values(kTensors[k], static_cast<int>(k)));
        std::vector<scmoe::SafetensorsTensor> all, shards[2];
        scmoe::SafetensorsIndex index;
        index.metadata = kMetadata;
        const char* shard_names[2] = {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"};
        for (std::size_t k = 0; k < kTensors.size(); ++k) {
            const Spec& s = kTensors[k];
            const scmoe::SafetensorsTensor t{s.name, s.dtype, s.shape, data[k].empty() ? nullptr : data[k].data()};
            all.push_back(t);
            shards[s.shard].push_back(t);
            index.weight_map[s.name] = shard_names[s.shard];
        }
        scmoe::write_safetensors(dir + "/single.safetensors", all, kMetadata);
        for (int r = 0; r < 2; ++r) {
            std::map<std::string, std::string> meta = kMetadata;
            meta["rank"] = std::to_string(r);
            scmoe::write_safetensors(dir + "/" + shard_names[r], shards[r], meta);
        }
        scmoe::write_safetensors_index(dir + "/model.safetensors.index.json", index);
        // Our own reader accepts what we wrote, too.
        if (scmoe::read_safetensors(dir + "/single.safetensors").tensors.size() != kTensors.size()) {
            std::cerr << "fixture: read back a different number of tensors\n";
            return 1;
        }
    } catch (const std::exception& e) {
        std::cerr << "fixture: " << e.what() << "\n";
        return 1;
    }
    std::cout << "wrote " << dir << "/single.safetensors and a 2-shard checkpoint\n";
    return 0;
}
