#include "wire.h"

#include <gtest/gtest.h>

#include <random>

using namespace cohort::comm;

TEST(Wire, StoreRequestRoundTrip) {
  wire::StoreRequest r;
  r.cmd = wire::StoreCmd::compare_set;
  r.key = "k";
  r.expected = "a";
  r.value = std::string("b\0c", 3);
  std::string f = wire::encode(r);
  auto back =
      wire::parse_store_request(reinterpret_cast<const uint8_t*>(f.data()) + 4, f.size() - 4);
  EXPECT_EQ(back.key, "k");
  EXPECT_EQ(back.expected, "a");
  EXPECT_EQ(back.value, r.value);
  wire::StoreRequest w;
  w.cmd = wire::StoreCmd::wait;
  w.keys = {"x", "y"};
  w.timeout_ms = 5;
  f = wire::encode(w);
  back = wire::parse_store_request(reinterpret_cast<const uint8_t*>(f.data()) + 4, f.size() - 4);
  EXPECT_EQ(back.keys.size(), 2u);
  EXPECT_EQ(back.timeout_ms, 5u);
}

TEST(Wire, TruncatedAndGarbageInputIsRejectedNotCrashed) {
  wire::StoreRequest r;
  r.cmd = wire::StoreCmd::set;
  r.key = "key";
  r.value = "value";
  std::string f = wire::encode(r);
  for (size_t cut = 0; cut + 4 < f.size(); ++cut) {
    EXPECT_THROW(wire::parse_store_request(reinterpret_cast<const uint8_t*>(f.data()) + 4, cut),
                 wire::WireError);
  }
  std::mt19937 rng(1);
  int rejected = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string junk(rng() % 64, '\0');
    for (auto& c : junk) c = static_cast<char>(rng());
    try {
      wire::parse_store_request(reinterpret_cast<const uint8_t*>(junk.data()), junk.size());
    } catch (const wire::WireError&) {
      ++rejected;
    }
    try {
      wire::parse_hello(reinterpret_cast<const uint8_t*>(junk.data()), junk.size());
    } catch (const wire::WireError&) {
    }
    try {
      wire::parse_header(reinterpret_cast<const uint8_t*>(junk.data()), junk.size());
    } catch (const wire::WireError&) {
    }
  }
  EXPECT_GT(rejected, 10000);
}

TEST(Wire, HeaderValidation) {
  wire::MsgHeader h;
  h.coll = 1;
  h.bytes = 100;
  auto* p = reinterpret_cast<const uint8_t*>(&h);
  EXPECT_EQ(wire::parse_header(p, sizeof(h)).bytes, 100u);
  h.magic = 0;
  EXPECT_THROW(wire::parse_header(p, sizeof(h)), wire::WireError);
  h.magic = wire::kMsgMagic;
  h.dtype = 99;
  EXPECT_THROW(wire::parse_header(p, sizeof(h)), wire::WireError);
  h.dtype = 0;
  h.bytes = wire::kMaxMessage + 1;
  EXPECT_THROW(wire::parse_header(p, sizeof(h)), wire::WireError);
  EXPECT_THROW(wire::parse_header(p, 10), wire::WireError);
}

TEST(Wire, HelloRoundTripAndLimits) {
  wire::Hello h{"tok", 42, 3, 1};
  std::string f = wire::encode(h);
  auto b = wire::parse_hello(reinterpret_cast<const uint8_t*>(f.data()) + 4, f.size() - 4);
  EXPECT_EQ(b.token, "tok");
  EXPECT_EQ(b.comm_id, 42u);
  EXPECT_EQ(b.rank, 3u);
  EXPECT_EQ(b.stream, 1u);
}
