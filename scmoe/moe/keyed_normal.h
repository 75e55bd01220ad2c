// KeyedNormal: deterministic N(0, 1) draws keyed by (seed, name, index), for parameter
// initialisation. splitmix64 + Box-Muller in double, no std:: distributions, so every platform,
// build and expert-parallel sharding gets the same values for the same key (index: e.g. the global
// expert a slice belongs to).
#pragma once

#include <cmath>
#include <cstdint>
#include <numbers>
#include <string>

namespace scmoe {

class KeyedNormal {
  public:
    KeyedNormal(std::uint64_t seed, const std::string& name, std::uint64_t index) {
        std::uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a of the name
        for (unsigned char c : name) h = (h ^ c) * 0x100000001b3ull;
        state_ = seed ^ h ^ (index + 1) * 0x9e3779b97f4a7c15ull;
    }
    // The next draw of this key's sequence.
    float next() {
        if (has_spare_) {
            has_spare_ = false;
            return spare_;
        }
        const double u1 = (static_cast<double>(bits() >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
        const double u2 = static_cast<double>(bits() >> 11) * 0x1.0p-53;          // [0, 1)
        const double r = std::sqrt(-2.0 * std::log(u1));
        spare_ = static_cast<float>(r * std::sin(2.0 * std::numbers::pi * u2));
        has_spare_ = true;
        return static_cast<float>(r * std::cos(2.0 * std::numbers::pi * u2));
    }

  private:
    std::uint64_t bits() {
        std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
    }
    std::uint64_t state_;
    float spare_ = 0;
    bool has_spare_ = false;
};

}  // namespace scmoe
