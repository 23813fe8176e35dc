#include "cohort/core/env.h"

#include <strings.h>
#include <cstdlib>

#include "cohort/core/error.h"

namespace cohort::env {

std::optional<std::string> get(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

std::string get_or(const char* name, const std::string& fallback) {
  return get(name).value_or(fallback);
}

int64_t int_or(const char* name, int64_t fallback) {
  auto v = get(name);
  if (!v) return fallback;
  char* end = nullptr;
  long long x = std::strtoll(v->c_str(), &end, 10);
  if (end == v->c_str() || *end != '\0') {
    COHORT_THROW("environment variable " << name << "='" << *v << "' is not an integer");
  }
  return x;
}

double double_or(const char* name, double fallback) {
  auto v = get(name);
  if (!v) return fallback;
  char* end = nullptr;
  double x = std::strtod(v->c_str(), &end);
  if (end == v->c_str() || *end != '\0') {
    COHORT_THROW("environment variable " << name << "='" << *v << "' is not a number");
  }
  return x;
}

bool flag(const char* name) {
  auto v = get(name);
  if (!v) return false;
  const char* s = v->c_str();
  return strcasecmp(s, "1") == 0 || strcasecmp(s, "true") == 0 || strcasecmp(s, "yes") == 0 ||
         strcasecmp(s, "on") == 0;
}

uint64_t parse_bytes(const std::string& text) {
  char* end = nullptr;
  double x = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || x < 0) COHORT_THROW("'" << text << "' is not a byte count");
  std::string unit(end);
  uint64_t mul = 1;
  if (unit.empty() || unit == "B")
    mul = 1;
  else if (unit == "K" || unit == "KiB" || unit == "KB")
    mul = 1ull << 10;
  else if (unit == "M" || unit == "MiB" || unit == "MB")
    mul = 1ull << 20;
  else if (unit == "G" || unit == "GiB" || unit == "GB")
    mul = 1ull << 30;
  else
    COHORT_THROW("'" << text << "': unknown unit '" << unit << "' (use K, M or G)");
  return static_cast<uint64_t>(x * static_cast<double>(mul));
}

std::string format_bytes(uint64_t b) {
  if (b >= (1ull << 30) && b % (1ull << 30) == 0) return std::to_string(b >> 30) + "G";
  if (b >= (1ull << 20) && b % (1ull << 20) == 0) return std::to_string(b >> 20) + "M";
  if (b >= (1ull << 10) && b % (1ull << 10) == 0) return std::to_string(b >> 10) + "K";
  return std::to_string(b);
}

}  // namespace cohort::env
