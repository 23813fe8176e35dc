#include "cohort/comm/store.h"

#include <gtest/gtest.h>
#include <sys/socket.h>

#include <thread>

#include "cohort/core/error.h"
#include "wire.h"

using namespace cohort::comm;
using std::chrono::milliseconds;

TEST(Store, SetGetAddCompareSet) {
  StoreServer server("127.0.0.1", 0, "tok");
  Store s(Endpoint{"127.0.0.1", server.port()}, "tok", milliseconds(2000));
  s.set("a", "1");
  EXPECT_EQ(s.get("a"), "1");
  EXPECT_EQ(s.add("n", 5), 5);
  EXPECT_EQ(s.add("n", -2), 3);
  EXPECT_EQ(s.compare_set("c", "", "x"), "x");   // absent -> set
  EXPECT_EQ(s.compare_set("c", "y", "z"), "x");  // mismatch -> unchanged
  EXPECT_EQ(s.compare_set("c", "x", "z"), "z");
  Store p = s.prefixed("ns/");
  p.set("a", "2");
  EXPECT_EQ(s.get("ns/a"), "2");
  s.erase("a");
  EXPECT_FALSE(s.get_for("a", milliseconds(10)).has_value());
}

TEST(Store, GetWaitsForAnotherClient) {
  StoreServer server("127.0.0.1", 0, "tok");
  Store s(Endpoint{"127.0.0.1", server.port()}, "tok", milliseconds(5000));
  std::thread t([&] {
    Store s2(Endpoint{"127.0.0.1", server.port()}, "tok", milliseconds(5000));
    std::this_thread::sleep_for(milliseconds(100));
    s2.set("late", "v");
  });
  EXPECT_EQ(s.get("late"), "v");
  s.wait({"late"});
  t.join();
}

TEST(Store, TimeoutsAreErrorsNamingTheKey) {
  StoreServer server("127.0.0.1", 0, "tok");
  Store s(Endpoint{"127.0.0.1", server.port()}, "tok", milliseconds(200));
  auto t0 = std::chrono::steady_clock::now();
  try {
    s.get("never");
    FAIL();
  } catch (const cohort::TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("never"), std::string::npos);
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, milliseconds(2000));
  EXPECT_THROW(s.wait({"never"}), cohort::TimeoutError);
  s.set("still", "works");  // the connection survives a timed-out wait
  EXPECT_EQ(s.get("still"), "works");
}

TEST(Store, WrongTokenIsRefused) {
  StoreServer server("127.0.0.1", 0, "right");
  try {
    Store s(Endpoint{"127.0.0.1", server.port()}, "wrong", milliseconds(1000));
    s.set("k", "v");
    FAIL() << "accepted a wrong token";
  } catch (const cohort::CommError& e) {
    EXPECT_NE(std::string(e.what()).find("token"), std::string::npos) << e.what();
  }
}

// A client with a wrong token, and one that sends garbage, are dropped and logged; neither the
// job's token nor the one a client tried appears in the log.
TEST(Store, RefusedClientsAreLoggedWithoutAnyToken) {
  testing::internal::CaptureStderr();
  {
    StoreServer server("127.0.0.1", 0, "job-secret-7f3a");
    EXPECT_THROW(
        {
          Store s(Endpoint{"127.0.0.1", server.port()}, "guess-9c1e", milliseconds(1000));
          s.set("k", "v");
        },
        cohort::CommError);
    auto deadline = cohort::Clock::now() + milliseconds(2000);
    Socket raw = connect_tcp(Endpoint{"127.0.0.1", server.port()}, deadline, "store");
    const uint32_t len = 6;
    std::string junk(reinterpret_cast<const char*>(&len), 4);
    junk += "\xff\xfe\xfd\xfc\xfb\xfa";
    raw.write_all(junk.data(), junk.size(), deadline, "store");
    char c;
    EXPECT_THROW(raw.read_all(&c, 1, deadline, "store"), cohort::CommError);  // closed by server
    Store s(Endpoint{"127.0.0.1", server.port()}, "job-secret-7f3a", milliseconds(1000));
    s.set("alive", "yes");
    EXPECT_EQ(s.get("alive"), "yes");
  }
  const std::string log = testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("dropping a connection without this job's token"), std::string::npos) << log;
  EXPECT_NE(log.find("store: dropping a client"), std::string::npos) << log;
  EXPECT_EQ(log.find("job-secret-7f3a"), std::string::npos) << log;
  EXPECT_EQ(log.find("guess-9c1e"), std::string::npos) << log;
}

TEST(Store, MalformedAndOversizedFramesCloseOnlyThatConnection) {
  StoreServer server("127.0.0.1", 0, "tok");
  auto deadline = cohort::Clock::now() + milliseconds(2000);
  for (uint32_t len : {5u, wire::kMaxFrame + 1}) {
    Socket raw = connect_tcp(Endpoint{"127.0.0.1", server.port()}, deadline, "store");
    std::string junk(reinterpret_cast<const char*>(&len), 4);
    junk += std::string(5, '\x7f');
    raw.write_all(junk.data(), junk.size(), deadline, "store");
    char c;
    EXPECT_THROW(raw.read_all(&c, 1, deadline, "store"), cohort::CommError);  // closed by server
  }
  Store s(Endpoint{"127.0.0.1", server.port()}, "tok", milliseconds(1000));
  s.set("alive", "yes");
  EXPECT_EQ(s.get("alive"), "yes");
}
