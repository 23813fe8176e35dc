// Whether a number read from a JSON file is a whole number that an integer type holds: the one
// check every reader makes before nlohmann's get<T>(), which converts with a plain cast (a
// fraction is cut, an integer beyond T wraps, and 9.4e105 into int64 is undefined behaviour:
// fuzz_files found it). A template over the JSON type, so core needs no JSON library.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace cohort {

template <typename T, typename Json>
bool holds_whole_number(const Json& v) {
  static_assert(std::is_integral_v<T>);
  constexpr T lo = std::numeric_limits<T>::min(), hi = std::numeric_limits<T>::max();
  if (v.is_number_unsigned()) return v.template get<uint64_t>() <= uint64_t(hi);
  if (v.is_number_integer()) {
    const int64_t x = v.template get<int64_t>();
    return x >= 0 ? uint64_t(x) <= uint64_t(hi) : std::is_signed_v<T> && x >= int64_t(lo);
  }
  if (!v.is_number_float()) return false;
  // 64.0 is whole. The bound hi + 1, computed without rounding hi itself: 2 * (hi / 2 + 1).
  const double d = v.template get<double>();
  return std::trunc(d) == d && d >= double(lo) && d < 2.0 * (double(hi / 2) + 1);
}

}  // namespace cohort
