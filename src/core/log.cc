#include "cohort/core/log.h"

#include <cstdio>
#include <cstring>

#include "cohort/core/error.h"
#include "cohort/core/settings.h"

namespace cohort::log {

namespace {
Level threshold() {
  static const Level level = [] {
    const std::string v = env::Settings::read().log;
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
