#include "cohort/core/env.h"

#include <gtest/gtest.h>

#include <cstdlib>

#include "cohort/core/error.h"

using namespace cohort;

TEST(Env, ParsesByteSizes) {
  EXPECT_EQ(env::parse_bytes("8"), 8u);
  EXPECT_EQ(env::parse_bytes("4K"), 4096u);
  EXPECT_EQ(env::parse_bytes("64M"), 64u << 20);
  EXPECT_EQ(env::parse_bytes("1G"), 1u << 30);
  EXPECT_THROW(env::parse_bytes("12Q"), Error);
  EXPECT_THROW(env::parse_bytes("x"), Error);
  EXPECT_EQ(env::format_bytes(64u << 20), "64M");
  EXPECT_EQ(env::format_bytes(1000), "1000");
}

TEST(Env, MalformedIntegerNamesTheVariable) {
  setenv("COHORT_TEST_INT", "12abc", 1);
  try {
    env::int_or("COHORT_TEST_INT", 0);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("COHORT_TEST_INT"), std::string::npos);
  }
  setenv("COHORT_TEST_INT", "42", 1);
  EXPECT_EQ(env::int_or("COHORT_TEST_INT", 0), 42);
  unsetenv("COHORT_TEST_INT");
  EXPECT_EQ(env::int_or("COHORT_TEST_INT", 7), 7);
}
