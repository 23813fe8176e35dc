#include "cohort/core/error.h"

#include <cstring>

namespace cohort {

namespace {
std::string where(const char* file, int line, const std::string& what) {
  const char* base = std::strstr(file, "src/");
  if (base == nullptr) base = file;
  return std::string(base) + ":" + std::to_string(line) + ": " + what;
}
}  // namespace

Error::Error(const char* file, int line, const std::string& what)
    : std::runtime_error(where(file, line, what)), message_(what) {}

std::string errno_string(int err) {
  char buf[256];
  const char* s = strerror_r(err, buf, sizeof(buf));
  return std::string(s) + " (errno " + std::to_string(err) + ")";
}

}  // namespace cohort
