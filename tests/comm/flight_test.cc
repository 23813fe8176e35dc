// The flight recorder and `cohort doctor`: real ranks that hang or disagree write their records
// (on the timeout, on the failure, on SIGUSR1), and the doctor names the rank and the call.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cohort/comm/communicator.h"
#include "cohort/core/error.h"
#include "testing/ranks.h"

using namespace cohort::comm;
using cohort::testing::run_ranks;
using cohort::testing::RunOptions;
namespace fs = std::filesystem;

namespace {

std::string doctor(const std::string& dir) {
  const char* bin = std::getenv("COHORT_BIN");
  std::string cmd = std::string(bin ? bin : "cohort") + " doctor " + dir + " 2>&1";
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  ::pclose(p);
  return out;
}

struct TempDir {
  std::string path =
      (fs::temp_directory_path() / ("cohort-flight-" + std::to_string(::getpid()))).string();
  TempDir() { fs::remove_all(path); }
  ~TempDir() { fs::remove_all(path); }
};

// The calls these tests make: a blocking sum of `v` over the ranks.
void sum(Communicator& c, std::vector<float>& v) {
  c.allreduce(v.data(), v.data(), v.size(), DataType::f32, RedOp::sum).wait();
}

// Stops this process (SIGSTOP: every thread stands still) until a helper, the operator who
// continues it, sends SIGCONT after `usec`; the helper dies with it.
void stop_until_continued(useconds_t usec) {
  if (::fork() == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    ::usleep(usec);
    ::kill(::getppid(), SIGCONT);
    ::_exit(0);
  }
  ::raise(SIGSTOP);
}

// Ranks that write their flight records into `dir` and time out after `timeout_s` seconds.
RunOptions flight_run(const TempDir& dir, int timeout_s) {
  RunOptions o;
  o.env["COHORT_FLIGHT_DIR"] = dir.path;
  o.env["COHORT_TIMEOUT"] = std::to_string(timeout_s);
  o.timeout_s = 60;
  return o;
}

// Rank 2 is stuck in user code and never issues allreduce #3; an operator's SIGUSR1 makes it
// write its record; ranks 0 and 1 time out in #3, naming rank 2, and write theirs.
TEST(Flight, TheDoctorNamesTheRankThatNeverEnteredTheCall) {
  TempDir dir;
  const RunOptions o = flight_run(dir, 2);
  auto rs = run_ranks(
      3,
      [](int rank) {
        auto c = init();
        std::vector<float> v(1000, 1.0f);
        for (int i = 0; i < 3; ++i) sum(*c, v);
        if (rank == 2) {
          ::usleep(500000);
          ::raise(SIGUSR1);   // what `kill -USR1` does from outside
          ::usleep(3500000);  // stuck past the others' timeout
          ::_exit(0);         // gone, as an operator would end it (no shutdown, no second record)
        }
        try {
          sum(*c, v);
        } catch (const cohort::TimeoutError& e) {
          const std::string m = e.what();
          REQUIRE(m.find("waiting on rank ") != std::string::npos, m);  // its ring neighbour
          REQUIRE(m.find("flight recorder: ") != std::string::npos, m);
          return;
        } catch (const cohort::CommError& e) {
          // A rank that sees the other's failure first fails with it: also a record.
          return;
        }
        REQUIRE(false, "allreduce #3 completed without rank 2");
      },
      o);
  cohort::testing::expect_all_ok(rs);
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(fs::exists(dir.path + "/world.rank-" + std::to_string(r) + ".json")) << r;
  }
  const std::string out = doctor(dir.path);
  EXPECT_NE(out.find("rank 2 never entered allreduce #3, which ranks 0-1 wait in (its last call: "
                     "allreduce #2, done)"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("rank 2 wrote its record on: SIGUSR1"), std::string::npos) << out;
  EXPECT_NE(out.find("ranks 0-1 in allreduce #3 wait on rank 2"), std::string::npos) << out;
}

// Rank 1 calls broadcast where the others call allreduce: the engine reports the mismatch, every
// rank writes its record, and the doctor says who is in which collective.
TEST(Flight, TheDoctorNamesTheRankInAnotherCollective) {
  TempDir dir;
  const RunOptions o = flight_run(dir, 5);
  auto rs = run_ranks(
      3,
      [](int rank) {
        auto c = init();
        std::vector<float> v(1000, 1.0f);
        sum(*c, v);
        try {
          if (rank == 1) {
            c->broadcast(v.data(), v.data(), v.size(), DataType::f32, 0).wait();
          } else {
            sum(*c, v);
          }
        } catch (const cohort::CommError&) {
          return;
        }
        REQUIRE(false, "a mismatched call completed");
      },
      o);
  cohort::testing::expect_all_ok(rs);
  const std::string out = doctor(dir.path);
  EXPECT_NE(out.find("rank 1 is in broadcast #1 while the others are in allreduce #1"),
            std::string::npos)
      << out;
}

// Rank 2 is stopped (SIGSTOP) inside allreduce #2: alive, silent. The others' timeout names the
// rank they wait on, their records say so, and rank 2, continued, fails promptly and writes its
// own record.
TEST(Flight, AStoppedRankIsNamedByTheRanksWaitingOnIt) {
  TempDir dir;
  const RunOptions o = flight_run(dir, 2);
  auto rs = run_ranks(
      3,
      [](int rank) {
        auto c = init();
        std::vector<float> v(1000, 1.0f);
        sum(*c, v);
        if (rank == 2) stop_until_continued(4000000);
        try {
          sum(*c, v);
        } catch (const cohort::CommError& e) {
          return;
        }
        REQUIRE(rank == 2, "allreduce #1 completed while rank 2 was stopped");
      },
      o);
  cohort::testing::expect_all_ok(rs);
  const std::string out = doctor(dir.path);
  EXPECT_NE(out.find("rank 2 entered allreduce #1 "), std::string::npos) << out;
  EXPECT_NE(out.find(" s after ranks 0-1: it was stopped, or busy elsewhere"), std::string::npos)
      << out;
  // The first to time out names the rank it waits on (rank 2, or its ring neighbour).
  EXPECT_NE(out.find("no progress for 2 s (COHORT_TIMEOUT) waiting on rank "), std::string::npos)
      << out;
}

// The heartbeat: rank 2 is stopped (SIGSTOP) after allreduce #0, with a 60 s timeout. Every
// thread of a stopped process stands still, its heartbeat too, so the ranks waiting on it fail
// within seconds, naming it; the first failure reaches the rank that waits on another survivor.
TEST(Heartbeat, AStoppedRankIsNamedLongBeforeTheTimeout) {
  RunOptions o;
  o.env["COHORT_TIMEOUT"] = "60";
  o.env["COHORT_HEARTBEAT"] = "0.2";
  o.env["COHORT_HEARTBEAT_TIMEOUT"] = "1.5";
  o.timeout_s = 60;
  auto rs = run_ranks(
      3,
      [](int rank) {
        auto c = init();
        std::vector<float> v(1000, 1.0f);
        sum(*c, v);
        if (rank == 2) stop_until_continued(8000000);  // after the others failed
        const auto t0 = std::chrono::steady_clock::now();
        try {
          sum(*c, v);
        } catch (const cohort::CommError& e) {
          if (rank == 2) return;  // continued after the others gave up on it
          const double s =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          const std::string m = e.what();
          REQUIRE(m.find("rank 2 has sent no heartbeat") != std::string::npos,
                  "rank " << rank << ": " << m);
          REQUIRE(m.find("stopped or frozen") != std::string::npos, m);
          REQUIRE(s < 6, "rank " << rank << " failed only after " << s << " s");
          std::printf("rank %d failed after %.1f s: %s\n", rank, s, m.c_str());
          return;
        }
        REQUIRE(false, "rank " << rank << ": allreduce #1 completed while rank 2 was stopped");
      },
      o);
  cohort::testing::expect_all_ok(rs);
}

// A rank busy in user code for 4 s still beats: the others wait for it, with a heartbeat
// timeout of 1.5 s, and the call completes.
TEST(Heartbeat, ARankBusyInUserCodeIsWaitedFor) {
  RunOptions o;
  o.env["COHORT_TIMEOUT"] = "30";
  o.env["COHORT_HEARTBEAT"] = "0.2";
  o.env["COHORT_HEARTBEAT_TIMEOUT"] = "1.5";
  auto rs = run_ranks(
      3,
      [](int rank) {
        auto c = init();
        std::vector<float> v(1000, 1.0f);
        if (rank == 2) ::usleep(4000000);
        sum(*c, v);
        REQUIRE(v[0] == 3.0f, "rank " << rank << ": " << v[0]);
      },
      o);
  cohort::testing::expect_all_ok(rs);
}

TEST(Flight, TheDoctorRefusesAnEmptyFolder) {
  TempDir dir;
  fs::create_directories(dir.path);
  EXPECT_NE(doctor(dir.path).find("no flight records"), std::string::npos);
}

}  // namespace
