// Running the `cohort` binary as a user runs it: a shell command, its exit status and output
// (stdout and stderr together). COHORT_BIN names the binary (set by CTest).
#pragma once

#include <sys/wait.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace cohort::testing {

struct ShellResult {
  int code = -1;  // exit status; -1 when killed by a signal
  std::string out;
  double seconds = 0;
};

inline ShellResult sh(const std::string& cmd) {
  auto t0 = std::chrono::steady_clock::now();
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  ShellResult r;
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t k;
  while ((k = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), k);
  const int st = pclose(p);
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

inline std::string cohort_bin() {
  const char* b = std::getenv("COHORT_BIN");
  return b ? b : "build/bin/cohort";
}

}  // namespace cohort::testing
