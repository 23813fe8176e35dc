// The Mailbox in real rank processes: isend/irecv posted in any order over shared memory and
// TCP, tags, receives from any rank, a receive of the wrong size, timeouts that say "Timed out",
// and a dead peer named by the survivors.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <vector>

#include "cohort/comm/communicator.h"
#include "cohort/core/error.h"
#include "testing/ranks.h"

using namespace cohort::comm;
using cohort::testing::run_ranks;
using cohort::testing::RunOptions;

namespace {

// Rank `from`'s message `i` to rank `to`: bytes that say where they came from.
std::vector<uint8_t> message(int from, int to, int i, size_t bytes) {
  std::vector<uint8_t> m(bytes);
  for (size_t k = 0; k < bytes; ++k) m[k] = static_cast<uint8_t>(from * 31 + to * 7 + i * 3 + k);
  return m;
}

// Every rank sends two messages (tags 0 and 1, sent in that order) to every other, and posts
// its receives and sends in a shuffled order, receiving tag 1 before tag 0 half the time. The
// large size exceeds the shared-memory ring, so that two ranks whose sends both come first
// would block each other if a send waited for its receive.
TEST(Mailbox, ExchangesPostedInAnyOrderComplete) {
  for (const std::string transport : {"auto", "tcp"}) {
    RunOptions o;
    o.env["COHORT_TRANSPORT"] = transport;
    o.env["COHORT_TIMEOUT"] = "30";
    o.timeout_s = 90;
    auto rs = run_ranks(
        4,
        [](int rank) {
          auto c = init();
          auto box = c->open_mailbox();
          const int n = c->size();
          const std::vector<size_t> sizes = {0, 16, 4096, 5u << 20};
          for (int round = 0; round < 4; ++round) {
            std::vector<std::vector<uint8_t>> outs, ins;
            std::vector<std::function<Work()>> calls;
            std::map<size_t, std::vector<uint8_t>> want;
            for (int peer = 0; peer < n; ++peer) {
              if (peer == rank) continue;
              for (int tag : {0, 1}) {
                const size_t out_bytes = sizes[static_cast<size_t>(rank + peer + tag + round) % 4];
                outs.push_back(message(rank, peer, tag, out_bytes));
                const size_t in_bytes = sizes[static_cast<size_t>(peer + rank + tag + round) % 4];
                ins.emplace_back(in_bytes, 0xEE);
                want[ins.size() - 1] = message(peer, rank, tag, in_bytes);
              }
            }
            outs.shrink_to_fit();
            ins.shrink_to_fit();
            size_t o = 0, i = 0;
            for (int peer = 0; peer < n; ++peer) {
              if (peer == rank) continue;
              for (int tag : {0, 1}) {
                auto* out = &outs[o++];
                auto* in = &ins[i++];
                calls.push_back([&box, out, peer, tag] {
                  return box->isend(out->data(), out->size(), peer, tag);
                });
                calls.push_back([&box, in, peer, tag] {
                  return box->irecv(in->data(), in->size(), peer, tag);
                });
              }
            }
            std::mt19937 rng(static_cast<unsigned>(rank * 100 + round));
            std::shuffle(calls.begin(), calls.end(), rng);
            std::vector<Work> works;
            for (auto& call : calls) works.push_back(call());
            std::shuffle(works.begin(), works.end(), rng);
            for (auto& w : works) w.wait();
            for (auto& [k, v] : want) REQUIRE(ins[k] == v, "round " << round << " message " << k);
          }
          c->barrier().wait();
        },
        o);
    cohort::testing::expect_all_ok(rs);
  }
}

TEST(Mailbox, AnySourceNamesTheSenderAndTagsKeepMessagesApart) {
  auto rs = run_ranks(3, [](int rank) {
    auto c = init();
    auto box = c->open_mailbox();
    if (rank == 0) {
      // Tag 5 first: rank 2 sends it only after its tag 4 message, so a tag 5 receive from any
      // rank must take rank 2's message though rank 1's tag 4 message may be there first.
      int32_t v = -1;
      Work w = box->irecv(&v, sizeof(v), kAnySource, 5);
      w.wait();
      REQUIRE(w.source() == 2 && v == 25, "source " << w.source() << " value " << v);
      std::vector<int> seen;
      for (int k = 0; k < 2; ++k) {
        Work a = box->irecv(&v, sizeof(v), kAnySource, 4);
        a.wait();
        REQUIRE(v == a.source() * 10 + 4, "source " << a.source() << " value " << v);
        seen.push_back(a.source());
      }
      std::sort(seen.begin(), seen.end());
      REQUIRE((seen == std::vector<int>{1, 2}), "sources " << seen[0] << ", " << seen[1]);
    } else {
      const int32_t four = rank * 10 + 4, five = rank * 10 + 5;
      box->isend(&four, sizeof(four), 0, 4).wait();
      if (rank == 2) box->isend(&five, sizeof(five), 0, 5).wait();
    }
    c->barrier().wait();
  });
  cohort::testing::expect_all_ok(rs);
}

TEST(Mailbox, WrongSizeIsNamedAndTheMessageWaitsForTheRightReceive) {
  auto rs = run_ranks(2, [](int rank) {
    auto c = init();
    auto box = c->open_mailbox();
    if (rank == 1) {
      const std::vector<uint8_t> m = message(1, 0, 0, 16);
      box->isend(m.data(), m.size(), 0, 0).wait();
    } else {
      std::vector<uint8_t> small(8), right(16);
      c->barrier().wait();  // the message is there (held) before the first receive
      bool failed = false;
      try {
        box->irecv(small.data(), small.size(), 1, 0).wait();
      } catch (const cohort::CommError& e) {
        const std::string m = e.what();
        REQUIRE(m.find("rank 1 sent 16 bytes") != std::string::npos &&
                    m.find("expects 8") != std::string::npos,
                m);
        failed = true;
      }
      REQUIRE(failed, "a receive of the wrong size succeeded");
      box->irecv(right.data(), right.size(), 1, 0).wait();
      REQUIRE(right == message(1, 0, 0, 16), "the held message changed");
    }
    if (rank == 1) c->barrier().wait();
    c->barrier().wait();
  });
  cohort::testing::expect_all_ok(rs);
}

// A receive that nothing arrives for: "Timed out", naming the rank, at the timeout.
TEST(Mailbox, TimeoutsSayTimedOutAndNameTheRank) {
  RunOptions o;
  o.env["COHORT_TIMEOUT"] = "1";
  auto rs = run_ranks(
      2,
      [](int rank) {
        auto c = init();
        auto box = c->open_mailbox();
        if (rank == 0) {
          int32_t v = 0;
          const auto t0 = std::chrono::steady_clock::now();
          std::string msg;
          try {
            box->irecv(&v, sizeof(v), 1, 9).wait();
          } catch (const cohort::TimeoutError& e) {
            msg = e.what();
          }
          const double took =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          REQUIRE(msg.find("Timed out") != std::string::npos &&
                      msg.find("from rank 1") != std::string::npos,
                  "message: " << msg);
          REQUIRE(took >= 1.0 && took < 1.1, "took " << took << " s");
        }
        if (rank == 1) ::usleep(1500000);  // within the 1 s timeout of rank 0's barrier
        c->barrier().wait();
      },
      o);
  cohort::testing::expect_all_ok(rs);
}

// A send that a stopped rank stops taking part way (64 MiB through a 4 MiB ring) fails at the
// timeout, and the mailbox's link to that rank is closed: the rest of the message cannot follow,
// and a transport that sends in place must stop reading the caller's buffer.
TEST(Mailbox, ASendCutPartWayByItsTimeoutClosesTheLink) {
  RunOptions o;
  o.env["COHORT_TIMEOUT"] = "1";
  o.env["COHORT_HEARTBEAT_TIMEOUT"] = "30";
  const std::string pid_file = "/tmp/cohort-mailbox-test-" + std::to_string(::getpid());
  auto rs = run_ranks(
      2,
      [&](int rank) {
        auto c = init();
        auto box = c->open_mailbox();
        if (rank == 1) {
          FILE* f = std::fopen(pid_file.c_str(), "w");
          REQUIRE(f, "cannot write " << pid_file);
          std::fprintf(f, "%d\n", ::getpid());
          std::fclose(f);
        }
        c->barrier().wait();
        if (rank == 1) {
          ::raise(SIGSTOP);  // rank 0 continues it once its send has failed
        } else {
          int pid = 0;
          FILE* f = std::fopen(pid_file.c_str(), "r");
          REQUIRE(f && std::fscanf(f, "%d", &pid) == 1, "no pid in " << pid_file);
          std::fclose(f);
          ::usleep(100000);  // rank 1 stops
          std::vector<uint8_t> big(64u << 20, 7);
          const auto t0 = std::chrono::steady_clock::now();
          std::string msg;
          try {
            box->isend(big.data(), big.size(), 1, 0).wait();
          } catch (const cohort::TimeoutError& e) {
            msg = e.what();
          }
          const double took =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          ::kill(pid, SIGCONT);
          REQUIRE(msg.find("Timed out") != std::string::npos &&
                      msg.find("stopped taking it part way") != std::string::npos &&
                      msg.find("link to rank 1 is closed") != std::string::npos,
                  "message: " << msg);
          REQUIRE(took >= 1.0 && took < 1.5, "took " << took << " s");
          big.assign(big.size(), 0);  // the buffer is the caller's again
          bool failed = false;
          try {  // and the link stays closed
            box->isend(big.data(), 16, 1, 0).wait();
          } catch (const cohort::CommError&) {
            failed = true;
          }
          REQUIRE(failed, "a send over the closed link succeeded");
        }
        ::usleep(200000);
        c->barrier().wait();
      },
      o);
  std::remove(pid_file.c_str());
  cohort::testing::expect_all_ok(rs);
}

TEST(Mailbox, DeadPeerIsNamedPromptly) {
  RunOptions o;
  o.env["COHORT_TIMEOUT"] = "60";
  auto rs = run_ranks(
      2,
      [](int rank) {
        auto c = init();
        auto box = c->open_mailbox();
        c->barrier().wait();
        if (rank == 1) {
          ::usleep(200000);
          ::kill(::getpid(), SIGKILL);
        }
        std::vector<uint8_t> in(1u << 20);
        const auto t0 = std::chrono::steady_clock::now();
        bool failed = false;
        try {
          box->irecv(in.data(), in.size(), 1, 0).wait();
        } catch (const cohort::CommError& e) {
          const std::string m = e.what();
          REQUIRE(m.find("rank 1") != std::string::npos, m);
          failed = true;
        }
        const double took =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        REQUIRE(failed, "the receive from a dead rank succeeded");
        REQUIRE(took < 5, "named after " << took << " s");
        // A call to the dead rank now fails at once.
        failed = false;
        try {
          box->isend(in.data(), 16, 1, 0).wait();
        } catch (const cohort::CommError&) {
          failed = true;
        }
        REQUIRE(failed, "a send to a dead rank succeeded");
        try {  // the communicator finds the dead rank too, and then closes without waiting on it
          c->barrier().wait();
        } catch (const cohort::CommError&) {
        }
      },
      o);
  EXPECT_EQ(rs[1].signal, SIGKILL) << rs[1].output;
  EXPECT_EQ(rs[0].code, 0) << rs[0].output;
}

}  // namespace
