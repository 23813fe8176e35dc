// FNV-1a, 64 bit: a stable hash of names (communicator ids, module seeds) that is the same in
// every process and build.
#pragma once

#include <cstdint>
#include <string_view>

namespace cohort {

// h: where to continue from (hashing several strings in a row).
constexpr uint64_t fnv1a64(std::string_view s, uint64_t h = 1469598103934665603ull) {
  for (char c : s) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return h;
}

}  // namespace cohort
