// Minimal leveled logging to stderr. COHORT_LOG=debug|info|warn|error (default info).
#pragma once

#include <sstream>
#include <string>

namespace cohort::log {

enum class Level { debug = 0, info = 1, warn = 2, error = 3 };

bool enabled(Level level);
void write(Level level, const std::string& message);

}  // namespace cohort::log

#define COHORT_LOG(level, ...)                                                    \
  do {                                                                            \
    if (::cohort::log::enabled(::cohort::log::Level::level))                      \
      ::cohort::log::write(::cohort::log::Level::level, COHORT_STR(__VA_ARGS__)); \
  } while (0)
