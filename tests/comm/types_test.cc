#include "cohort/comm/types.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "cohort/core/error.h"

using namespace cohort::comm;

TEST(Types, SizesAndNames) {
  EXPECT_EQ(dtype_size(DataType::bf16), 2u);
  EXPECT_EQ(dtype_size(DataType::i64), 8u);
  for (DataType t : kAllDataTypes) EXPECT_EQ(parse_dtype(dtype_name(t)), t);
  for (RedOp o : kAllRedOps) EXPECT_EQ(parse_redop(redop_name(o)), o);
  EXPECT_THROW(parse_dtype("f24"), cohort::Error);
}

TEST(Types, HalfConversionIsExactForEveryHalf) {
  for (uint32_t h = 0; h < 65536; ++h) {
    float f = f16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    EXPECT_EQ(f32_to_f16(f), h) << "half 0x" << std::hex << h;
  }
}

TEST(Types, HalfRoundsToNearestEven) {
  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);  // rounds to infinity
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to even (1.0).
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  EXPECT_EQ(f32_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);  // tie to even: zero
  EXPECT_EQ(f32_to_f16(-2.0f), 0xc000);
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(NAN))));
}

TEST(Types, Bfloat16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  float halfway;
  uint32_t bits = 0x3f808000;  // exactly between 0x3f80 and 0x3f81
  std::memcpy(&halfway, &bits, 4);
  EXPECT_EQ(f32_to_bf16(halfway), 0x3f80);
  bits = 0x3f818000;
  std::memcpy(&halfway, &bits, 4);
  EXPECT_EQ(f32_to_bf16(halfway), 0x3f82);
  EXPECT_EQ(bf16_to_f32(0x4049), 3.140625f);
}
