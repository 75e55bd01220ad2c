// Integers read from JSON exactly. nlohmann's get<T>() converts any number: a float beyond T's range
// is undefined behaviour and an integer beyond it wraps (a "world" of 4294967298 would read as 2), so
// the checkpoint and config readers take their integers through json_integer<T>().
#pragma once

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

namespace scmoe::models::detail {

// `v` as a T when it is a JSON integer (not a float) within T's range; otherwise throws nlohmann's
// type_error (302), which the readers report as their "corrupted ..." / "not a ... JSON" errors.
template <class T, class Json>
T json_integer(const Json& v) {
    if (v.is_number_unsigned()) {
        const auto u = v.template get<std::uint64_t>();
        if (std::in_range<T>(u)) return static_cast<T>(u);
    } else if (v.is_number_integer()) {
        const auto s = v.template get<std::int64_t>();
        if (std::in_range<T>(s)) return static_cast<T>(s);
    }
    throw Json::type_error::create(302,
                                   "expected an integer in [" + std::to_string(std::numeric_limits<T>::min()) + ", " +
                                       std::to_string(std::numeric_limits<T>::max()) + "], got " + v.dump(),
                                   &v);
}

}  // namespace scmoe::models::detail
