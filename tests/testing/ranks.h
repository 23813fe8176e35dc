// Starts real rank processes for multi-process tests: each rank is a fork of the test binary
// with the launcher's environment, runs `body`, and reports through its exit status. Every
// run is bounded: ranks still alive at the deadline are killed and the run fails.
#pragma once

#include <functional>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace cohort::testing {

struct RankResult {
  int rank = 0;
  bool exited = false;  // false: killed by a signal or by the deadline
  int code = -1;        // exit status when exited
  int signal = 0;
  std::string output;  // what the rank wrote to stderr
  double seconds = 0;  // from start to exit
};

struct RunOptions {
  double timeout_s = 60;
  int ranks_per_host = 0;  // >0: COHORT_HOST_ID = rank / ranks_per_host (emulated hosts)
  std::map<std::string, std::string> env;
  std::map<int, std::map<std::string, std::string>> env_of_rank;
};

// Runs body(rank) in `n` processes. The body throws to fail.
std::vector<RankResult> run_ranks(int n, const std::function<void(int)>& body,
                                  const RunOptions& opt = {});

// Throws with all ranks' output unless every rank exited 0.
void expect_all_ok(const std::vector<RankResult>& rs);

uint16_t free_port();
std::vector<std::string> shm_segments(const std::string& token_prefix);

}  // namespace cohort::testing

#define REQUIRE(cond, ...)                                                         \
  do {                                                                             \
    if (!(cond)) {                                                                 \
      std::ostringstream os_;                                                      \
      os_ << __FILE__ << ":" << __LINE__ << ": " #cond " failed: " << __VA_ARGS__; \
      throw std::runtime_error(os_.str());                                         \
    }                                                                              \
  } while (0)
