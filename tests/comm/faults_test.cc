// Faults: a dead rank, mismatched collectives, disagreeing world sizes, an unreachable store.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <thread>
#include <vector>

#include "../../src/comm/transport/shm/shm_transport.h"
#include "cohort/comm/communicator.h"
#include "cohort/comm/store.h"
#include "cohort/core/error.h"
#include "testing/ranks.h"

using namespace cohort::comm;
using cohort::testing::run_ranks;
using cohort::testing::RunOptions;

namespace {

// The harness's leak check can fire: a segment named as the shared-memory transport names the
// job's segments, left in /dev/shm by a rank, fails the run and is named (and removed).
TEST(Harness, ReportsSharedMemoryLeftBehind) {
  auto rs = run_ranks(2, [](int rank) {
    const char* token = std::getenv("COHORT_JOB_TOKEN");
    REQUIRE(token, "no job token");
    if (rank != 1) return;
    const std::string n = "/" + shm_job_prefix(token) + "-planted";
    const int fd = ::shm_open(n.c_str(), O_CREAT | O_RDWR, 0600);
    REQUIRE(fd >= 0, "shm_open " << n);
    ::close(fd);
  });
  EXPECT_EQ(rs[0].code, 98) << rs[0].output;
  const size_t at = rs[0].output.find("left behind in /dev/shm: cohort-");
  ASSERT_NE(at, std::string::npos) << rs[0].output;
  const size_t from = at + std::string("left behind in /dev/shm: ").size();
  const std::string left = rs[0].output.substr(from, rs[0].output.find('\n', from) - from);
  EXPECT_NE(left.find("-planted"), std::string::npos) << left;
  EXPECT_NE(::access(("/dev/shm/" + left).c_str(), F_OK), 0) << left << " was not removed";
}

// Over shared memory, over TCP, and with the buffers in alloc_shared memory (the `shared`
// allreduce, whose peers read and write the dead rank's mapped buffers).
TEST(Faults, KilledRankIsNamedBySurvivorsWithinTenSeconds) {
  for (const std::string transport : {"auto", "tcp", "shared"}) {
    RunOptions o;
    o.env["COHORT_TRANSPORT"] = transport == "tcp" ? "tcp" : "auto";
    o.timeout_s = 60;
    auto rs = run_ranks(
        3,
        [transport](int rank) {
          auto c = init();
          const size_t n = 4u << 20;
          std::vector<float> plain;
          SharedBuffer shared;
          float* v = nullptr;
          if (transport == "shared") {
            shared = c->alloc_shared(n * sizeof(float));
            v = shared.as<float>();
          } else {
            plain.resize(n);
            v = plain.data();
          }
          std::fill(v, v + n, 1.0f);
          for (int i = 0;; ++i) {
            if (rank == 2 && i == 3) {
              // Die in the middle of an allreduce: start it, then get killed.
              auto w = c->allreduce(v, v, n, DataType::f32, RedOp::sum);
              if (transport == "shared") REQUIRE(w.algorithm() == "shared", w.algorithm());
              ::usleep(2000);
              ::kill(::getpid(), SIGKILL);
            }
            try {
              c->allreduce(v, v, n, DataType::f32, RedOp::sum).wait();
            } catch (const cohort::CommError& e) {
              std::string m = e.what();
              REQUIRE(m.find("rank 2") != std::string::npos, "error does not name rank 2: " << m);
              // Later calls fail at once too.
              bool failed = false;
              try {
                c->barrier().wait();
              } catch (const cohort::CommError&) {
                failed = true;
              }
              REQUIRE(failed, "a call after the failure succeeded");
              return;
            }
          }
        },
        o);
    EXPECT_EQ(rs[2].signal, SIGKILL) << rs[2].output;
    for (int r : {0, 1}) {
      EXPECT_EQ(rs[static_cast<size_t>(r)].code, 0) << transport << " rank " << r << ":\n"
                                                    << rs[static_cast<size_t>(r)].output;
      EXPECT_LT(rs[static_cast<size_t>(r)].seconds, rs[2].seconds + 10.0) << transport;
    }
  }
}

TEST(Faults, MismatchedCollectivesDescribeBothSides) {
  RunOptions o;
  o.env["COHORT_TIMEOUT"] = "30";
  auto rs = run_ranks(
      2,
      [](int rank) {
        auto c = init();
        std::vector<float> v(100, 1.0f);
        try {
          if (rank == 0) {
            c->allreduce(v.data(), v.data(), 100, DataType::f32, RedOp::sum).wait();
          } else {
            c->broadcast(v.data(), v.data(), 50, DataType::f32, 1).wait();
          }
        } catch (const cohort::CommError& e) {
          std::string m = e.what();
          REQUIRE(m.find("mismatch") != std::string::npos, m);
          REQUIRE(m.find("allreduce(count=100") != std::string::npos, m);
          REQUIRE(m.find("broadcast(count=50") != std::string::npos, m);
          return;
        }
        REQUIRE(false, "mismatched collectives succeeded");
      },
      o);
  // At least the rank that read the other's header must report; the other must not hang.
  int reported = 0;
  for (auto& r : rs) {
    EXPECT_TRUE(r.exited) << r.output;
    reported += r.code == 0;
    EXPECT_LT(r.seconds, 20.0) << r.output;
  }
  EXPECT_GE(reported, 1) << rs[0].output << rs[1].output;
}

TEST(Faults, DisagreeingWorldSizeIsAnError) {
  RunOptions o;
  o.env["COHORT_TIMEOUT"] = "5";
  o.env_of_rank[1]["WORLD_SIZE"] = "3";
  auto rs = run_ranks(
      2,
      [](int) {
        try {
          auto c = init();
          c->barrier().wait();
        } catch (const cohort::Error& e) {
          std::string m = e.what();
          // The rank that registers second names both sizes; the other may only see the store
          // (hosted by rank 0) go away.
          REQUIRE(m.find("world size") != std::string::npos ||
                      m.find("rendezvous store") != std::string::npos,
                  m);
          std::fprintf(stderr, "%s\n", m.c_str());
          return;
        }
        REQUIRE(false, "no error");
      },
      o);
  for (auto& r : rs) EXPECT_EQ(r.code, 0) << r.output;
  std::string all = rs[0].output + rs[1].output;
  EXPECT_NE(all.find("world size 3"), std::string::npos) << all;
  EXPECT_NE(all.find("world size 2"), std::string::npos) << all;
}

TEST(Faults, UnreachableMasterFailsWithinTheTimeout) {
  RunOptions o;
  o.env["COHORT_TIMEOUT"] = "2";
  o.env["COHORT_STORE_EXTERNAL"] = "1";  // nobody hosts the store (a job of one needs none)
  auto rs = run_ranks(
      2,
      [](int) {
        try {
          init();
        } catch (const cohort::Error& e) {
          std::string m = e.what();
          REQUIRE(m.find("rendezvous store") != std::string::npos, m);
          return;
        }
        REQUIRE(false, "init succeeded without a store");
      },
      o);
  for (auto& r : rs) {
    EXPECT_EQ(r.code, 0) << r.output;
    EXPECT_LT(r.seconds, 10.0);
  }
}

TEST(Faults, PortInUseIsNamed) {
  StoreServer a("127.0.0.1", 0, "tok");
  try {
    StoreServer b("127.0.0.1", a.port(), "tok");
    FAIL() << "second bind succeeded";
  } catch (const cohort::CommError& e) {
    EXPECT_NE(std::string(e.what()).find("already in use"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(std::to_string(a.port())), std::string::npos) << e.what();
  }
}

TEST(Faults, AbortMakesPeersFailPromptly) {
  RunOptions o;
  o.env["COHORT_TIMEOUT"] = "60";
  auto rs = run_ranks(
      2,
      [](int rank) {
        auto c = init();
        if (rank == 0) {
          c->abort("test abort");
          bool failed = false;
          try {
            c->barrier().wait();
          } catch (const cohort::CommError&) {
            failed = true;
          }
          REQUIRE(failed, "call after abort succeeded");
          ::sleep(1);
          return;
        }
        try {
          std::vector<float> v(1000);
          c->allreduce(v.data(), v.data(), v.size(), DataType::f32, RedOp::sum).wait();
        } catch (const cohort::CommError& e) {
          REQUIRE(std::string(e.what()).find("test abort") != std::string::npos, e.what());
          return;
        }
        REQUIRE(false, "peer of an aborted rank succeeded");
      },
      o);
  for (auto& r : rs) {
    EXPECT_EQ(r.code, 0) << r.output;
    EXPECT_LT(r.seconds, 15.0);
  }
}

}  // namespace
