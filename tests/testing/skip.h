// Skipping a test whose prerequisite is missing, except under CI=true: there a test of something
// the README promises must run, so a missing prerequisite (which scripts/test installs) fails it.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

namespace cohort::testing {

inline bool in_ci() {
  const char* ci = std::getenv("CI");
  return ci != nullptr && std::strcmp(ci, "true") == 0;
}

}  // namespace cohort::testing

#define COHORT_SKIP_UNLESS_CI(why)                                                           \
  do {                                                                                       \
    if (::cohort::testing::in_ci()) FAIL() << (why) << " (CI=true: this test may not skip)"; \
    GTEST_SKIP() << (why);                                                                   \
  } while (0)
