// Each transport's Link on its own: two endpoints in one process (threads), a stream of
// messages of many sizes through wrap-around, in-place reads, peeks, and a peer's abort.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "../../src/comm/transport/shm/shm_transport.h"
#include "../../src/comm/transport/tcp/tcp_transport.h"
#include "cohort/comm/store.h"
#include "cohort/core/error.h"
#include "testing/ranks.h"

using namespace cohort::comm;
using std::chrono::milliseconds;

namespace {

// Sends `total` bytes of a known pattern in random chunks while receiving the peer's.
void pump(Link& l, size_t total, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> out(total), in(total);
  for (size_t i = 0; i < total; ++i) out[i] = static_cast<uint8_t>(i * 7 + 3);
  size_t sent = 0, got = 0;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (sent < total || got < total) {
    if (sent < total)
      sent += l.send_some(out.data() + sent, std::min<size_t>(total - sent, 1 + rng() % 70000));
    if (got < total) {
      if (rng() % 2) {
        got += l.recv_into(in.data() + got, std::min<size_t>(total - got, 1 + rng() % 50000));
      } else {
        got += l.recv_with(std::min<size_t>(total - got, 1 + rng() % 50000),
                           [&](const uint8_t* p, size_t n) { std::memcpy(in.data() + got, p, n); });
      }
    }
    l.flush();
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "sent " << sent << " got " << got;
  }
  for (size_t i = 0; i < total; ++i) {
    ASSERT_EQ(in[i], static_cast<uint8_t>(i * 7 + 3)) << "byte " << i;
  }
}

struct Pair {
  std::unique_ptr<Link> a, b;
};

Pair shm_pair(StoreServer& server, size_t ring) {
  Store sa(Endpoint{"127.0.0.1", server.port()}, "t", milliseconds(5000));
  Store sb(Endpoint{"127.0.0.1", server.port()}, "t", milliseconds(5000));
  ShmOptions o;
  o.ring_bytes = ring;
  o.name_prefix = "/cohort-transporttest" + std::to_string(::getpid()) + "-" + std::to_string(ring);
  PeerDesc da{0, "h", ::getpid()}, db{1, "h", ::getpid()};
  Pair p;
  std::thread t([&] { p.b = connect_shm(sb, o, db, da); });
  p.a = connect_shm(sa, o, da, db);
  t.join();
  return p;
}

Pair tcp_pair(StoreServer& server, int streams) {
  Store sa(Endpoint{"127.0.0.1", server.port()}, "t", milliseconds(5000));
  Store sb(Endpoint{"127.0.0.1", server.port()}, "t", milliseconds(5000));
  TcpOptions o;
  o.streams = streams;
  o.token = "tok";
  o.comm_id = 7;
  o.deadline = cohort::Clock::now() + std::chrono::seconds(10);
  PeerDesc da{0, "h", ::getpid()}, db{1, "h", ::getpid()};
  TcpListener la("127.0.0.1"), lb("127.0.0.1");
  sa.set("tcp/0", la.address());
  sb.set("tcp/1", lb.address());
  Pair p;
  std::thread t([&] { p.b = std::move(connect_tcp_peers(sb, lb, o, db, {da})[0][0]); });
  p.a = std::move(connect_tcp_peers(sa, la, o, da, {db})[1][0]);
  t.join();
  return p;
}

void both_ways(Pair& p, size_t bytes) {
  std::thread t([&] { pump(*p.b, bytes, 2); });
  pump(*p.a, bytes, 1);
  t.join();
}

TEST(Transport, SharedMemoryStreamsThroughWrapAround) {
  StoreServer server("127.0.0.1", 0, "t");
  Pair p = shm_pair(server, 64 << 10);  // small ring: many wrap-arounds
  EXPECT_STREQ(p.a->kind(), "shm");
  both_ways(p, 3u << 20);
  EXPECT_TRUE(cohort::testing::shm_segments("cohort-transporttest").empty());
}

TEST(Transport, TcpStreams) {
  StoreServer server("127.0.0.1", 0, "t");
  Pair p = tcp_pair(server, 1);
  EXPECT_STREQ(p.a->kind(), "tcp");
  both_ways(p, 8u << 20);
}

TEST(Transport, PeekDoesNotConsume) {
  StoreServer server("127.0.0.1", 0, "t");
  for (int kind = 0; kind < 2; ++kind) {
    Pair p = kind == 0 ? shm_pair(server, 4096) : tcp_pair(server, 1);
    const char msg[] = "hello";
    ASSERT_EQ(p.a->send_some(msg, 5), 5u);
    char buf[8] = {0};
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (p.b->peek(buf, 5) < 5) ASSERT_LT(std::chrono::steady_clock::now(), deadline);
    EXPECT_EQ(std::string(buf, 5), "hello");
    std::memset(buf, 0, sizeof(buf));
    size_t got = 0;
    while (got < 5) got += p.b->recv_into(buf + got, 5 - got);
    EXPECT_EQ(std::string(buf, 5), "hello");
  }
}

TEST(Transport, AbortIsSeenByThePeer) {
  StoreServer server("127.0.0.1", 0, "t");
  for (int kind = 0; kind < 2; ++kind) {
    Pair p = kind == 0 ? shm_pair(server, 4096) : tcp_pair(server, 1);
    p.a->abort("because");
    bool thrown = false;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (!thrown && std::chrono::steady_clock::now() < deadline) {
      try {
        char c;
        p.b->recv_into(&c, 1);
        p.b->check_peer();
      } catch (const cohort::CommError& e) {
        thrown = true;
        if (kind == 0) {
          EXPECT_NE(std::string(e.what()).find("because"), std::string::npos);
        }
        EXPECT_NE(std::string(e.what()).find("rank 0"), std::string::npos) << e.what();
      }
    }
    EXPECT_TRUE(thrown) << (kind == 0 ? "shm" : "tcp");
  }
}

TEST(Transport, TcpDropsConnectionsWithoutTheToken) {
  StoreServer server("127.0.0.1", 0, "t");
  Store s(Endpoint{"127.0.0.1", server.port()}, "t", milliseconds(3000));
  TcpListener l("127.0.0.1");
  // A stranger connects first and sends garbage; the real peer connects after it.
  std::thread stranger([&] {
    Socket sock = connect_tcp(parse_endpoint(l.address(), 0),
                              cohort::Clock::now() + std::chrono::seconds(5), "x");
    std::string junk = "GET / HTTP/1.0\r\n\r\n";
    sock.write_all(junk.data(), junk.size(), cohort::Clock::now() + std::chrono::seconds(5), "x");
    ::usleep(200000);
  });
  TcpOptions o;
  o.streams = 1;
  o.token = "tok";
  o.comm_id = 1;
  o.deadline = cohort::Clock::now() + std::chrono::seconds(10);
  s.set("tcp/0", l.address());
  std::unique_ptr<Link> b;
  std::thread peer([&] {
    ::usleep(50000);
    TcpListener lb("127.0.0.1");
    b = std::move(connect_tcp_peers(s, lb, o, PeerDesc{1, "h", ::getpid()},
                                    {PeerDesc{0, "h", ::getpid()}})[0][0]);
  });
  auto links =
      connect_tcp_peers(s, l, o, PeerDesc{0, "h", ::getpid()}, {PeerDesc{1, "h", ::getpid()}});
  peer.join();
  stranger.join();
  ASSERT_EQ(links[1].size(), 1u);
  ASSERT_EQ(links[1][0]->send_some("x", 1), 1u);
  char c = 0;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (b->recv_into(&c, 1) == 0) ASSERT_LT(std::chrono::steady_clock::now(), deadline);
  EXPECT_EQ(c, 'x');
}

}  // namespace
