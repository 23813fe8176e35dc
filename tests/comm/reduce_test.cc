#include "reduce/reduce.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

using namespace cohort::comm;

namespace {

double apply(RedOp op, double a, double b) {
  switch (op) {
    case RedOp::sum:
    case RedOp::avg:
      return a + b;
    case RedOp::prod:
      return a * b;
    case RedOp::min:
      return std::min(a, b);
    case RedOp::max:
      return std::max(a, b);
  }
  return 0;
}

template <typename T>
void check_typed(DataType t, RedOp op, size_t n) {
  std::mt19937 rng(static_cast<unsigned>(n * 31 + static_cast<int>(op)));
  std::vector<T> a(n), b(n), d(n);
  for (size_t i = 0; i < n; ++i) {
    a[i] = static_cast<T>(static_cast<int>(rng() % 19) - (std::is_signed_v<T> ? 9 : 0));
    b[i] = static_cast<T>(static_cast<int>(rng() % 19) - (std::is_signed_v<T> ? 9 : 0));
  }
  reduce(d.data(), a.data(), b.data(), n, t, op);
  for (size_t i = 0; i < n; ++i) {
    T want = static_cast<T>(apply(op, static_cast<double>(a[i]), static_cast<double>(b[i])));
    if (t == DataType::u8) want = static_cast<T>(static_cast<int>(apply(op, a[i], b[i])) & 0xff);
    ASSERT_EQ(d[i], want) << dtype_name(t) << " " << redop_name(op) << " n=" << n << " i=" << i;
  }
}

void check_half(DataType t, RedOp op, size_t n) {
  auto to = t == DataType::f16 ? f32_to_f16 : f32_to_bf16;
  auto from = t == DataType::f16 ? f16_to_f32 : bf16_to_f32;
  std::vector<uint16_t> a(n), b(n), d(n);
  for (size_t i = 0; i < n; ++i) {
    a[i] = to(static_cast<float>(i % 13) * 0.37f - 2.0f);
    b[i] = to(static_cast<float>(i % 7) * 1.13f - 3.0f);
  }
  reduce(d.data(), a.data(), b.data(), n, t, op);
  for (size_t i = 0; i < n; ++i) {
    // One rounding of the f32 result, the same as the kernel promises.
    uint16_t want = to(static_cast<float>(apply(op, from(a[i]), from(b[i]))));
    ASSERT_EQ(d[i], want) << dtype_name(t) << " " << redop_name(op) << " i=" << i;
  }
}

}  // namespace

TEST(Reduce, EveryTypeAndOpMatchesTheReference) {
  std::printf("reduction kernels: %s\n", reduce_isa());
  for (size_t n : {0, 1, 7, 8, 9, 31, 33, 1000, 4097}) {
    for (RedOp op : kAllRedOps) {
      check_typed<float>(DataType::f32, op, n);
      check_typed<double>(DataType::f64, op, n);
      check_typed<int32_t>(DataType::i32, op, n);
      check_typed<int64_t>(DataType::i64, op, n);
      check_typed<uint8_t>(DataType::u8, op, n);
      check_half(DataType::f16, op, n);
      check_half(DataType::bf16, op, n);
    }
  }
}

TEST(Reduce, InPlaceAndUnaligned) {
  std::vector<uint8_t> buf(4 * 1000 + 3);
  float* a = reinterpret_cast<float*>(buf.data() + 1);  // deliberately misaligned
  std::vector<float> b(1000, 2.0f);
  for (int i = 0; i < 1000; ++i) std::memcpy(buf.data() + 1 + 4 * i, &b[0], 4);
  reduce(a, a, b.data(), 1000, DataType::f32, RedOp::sum);
  float x;
  std::memcpy(&x, buf.data() + 1 + 4 * 999, 4);
  EXPECT_EQ(x, 4.0f);
}

TEST(Reduce, DivideForAvg) {
  std::vector<int32_t> v{7, -7, 9};
  divide(v.data(), v.size(), DataType::i32, 2);
  EXPECT_EQ(v, (std::vector<int32_t>{3, -3, 4}));
  std::vector<uint8_t> u{255, 10};
  divide(u.data(), u.size(), DataType::u8, 300);
  EXPECT_EQ(u[0], 0);
  std::vector<uint16_t> h{f32_to_f16(3.0f)};
  divide(h.data(), 1, DataType::f16, 4);
  EXPECT_EQ(f16_to_f32(h[0]), 0.75f);
}
