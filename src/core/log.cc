#include "cohort/core/log.h"

#include <cstdio>
#include <cstring>

#include "cohort/core/env.h"
#include "cohort/core/error.h"

namespace cohort::log {

namespace {
Level threshold() {
  static const Level level = [] {
    std::string v = env::get_or("COHORT_LOG", "info");
    if (v == "debug") return Level::debug;
    if (v == "warn") return Level::warn;
    if (v == "error") return Level::error;
    return Level::info;
  }();
  return level;
}
}  // namespace

bool enabled(Level level) {
  return level >= threshold();
}

void write(Level level, const std::string& message) {
  static const char* names[] = {"debug", "info", "warn", "error"};
  std::string line =
      std::string("cohort ") + names[static_cast<int>(level)] + ": " + message + "\n";
  std::fwrite(line.data(), 1, line.size(), stderr);
}

}  // namespace cohort::log
