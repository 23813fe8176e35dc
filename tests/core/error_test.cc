#include "cohort/core/error.h"

#include <gtest/gtest.h>

TEST(Error, CarriesFileLineAndValues) {
  try {
    int x = 3;
    COHORT_CHECK(x == 4, "x is " << x);
    FAIL();
  } catch (const cohort::Error& e) {
    std::string w = e.what();
    EXPECT_NE(w.find("error_test.cc:"), std::string::npos) << w;
    EXPECT_NE(w.find("x is 3"), std::string::npos) << w;
    EXPECT_EQ(e.message().find("error_test"), std::string::npos);
  }
}
