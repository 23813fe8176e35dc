#include "testing/ranks.h"

#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>

#include "../../src/comm/transport/shm/shm_transport.h"

namespace cohort::testing {

uint16_t free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

std::vector<std::string> shm_segments(const std::string& prefix) {
  std::vector<std::string> out;
  DIR* d = ::opendir("/dev/shm");
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    if (std::strncmp(e->d_name, prefix.c_str(), prefix.size()) == 0) out.push_back(e->d_name);
  }
  ::closedir(d);
  return out;
}

std::vector<RankResult> run_ranks(int n, const std::function<void(int)>& body,
                                  const RunOptions& opt) {
  std::fflush(stdout);
  std::fflush(stderr);
  const uint16_t port = free_port();
  std::random_device rd;
  char token[32];
  std::snprintf(token, sizeof(token), "test%08x%08x", rd(), rd());
  std::vector<RankResult> rs(static_cast<size_t>(n));
  std::vector<pid_t> pids(static_cast<size_t>(n));
  std::vector<int> fds(static_cast<size_t>(n));
  auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < n; ++r) {
    int p[2];
    if (::pipe(p) != 0) throw std::runtime_error("pipe failed");
    pid_t parent = ::getpid();
    pid_t pid = ::fork();
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) _exit(99);
      ::close(p[0]);
      ::dup2(p[1], 2);
      setenv("RANK", std::to_string(r).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(n).c_str(), 1);
      setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      setenv("LOCAL_WORLD_SIZE", std::to_string(n).c_str(), 1);
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      setenv("COHORT_JOB_TOKEN", token, 1);
      unsetenv("COHORT_STORE_EXTERNAL");
      if (opt.ranks_per_host > 0) {
        setenv("COHORT_HOST_ID", ("host" + std::to_string(r / opt.ranks_per_host)).c_str(), 1);
      }
      for (auto& [k, v] : opt.env) setenv(k.c_str(), v.c_str(), 1);
      auto it = opt.env_of_rank.find(r);
      if (it != opt.env_of_rank.end()) {
        for (auto& [k, v] : it->second) setenv(k.c_str(), v.c_str(), 1);
      }
      int code = 0;
      try {
        body(r);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d failed: %s\n", r, e.what());
        code = 1;
      }
      std::fflush(stderr);
      _exit(code);
    }
    ::close(p[1]);
    ::fcntl(p[0], F_SETFL, O_NONBLOCK);
    pids[static_cast<size_t>(r)] = pid;
    fds[static_cast<size_t>(r)] = p[0];
    rs[static_cast<size_t>(r)].rank = r;
  }
  int alive = n;
  std::vector<bool> done(static_cast<size_t>(n), false);
  while (alive > 0) {
    double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (int r = 0; r < n; ++r) {
      char buf[4096];
      ssize_t k;
      while ((k = ::read(fds[static_cast<size_t>(r)], buf, sizeof(buf))) > 0) {
        rs[static_cast<size_t>(r)].output.append(buf, static_cast<size_t>(k));
      }
      if (done[static_cast<size_t>(r)]) continue;
      int st = 0;
      if (::waitpid(pids[static_cast<size_t>(r)], &st, WNOHANG) == pids[static_cast<size_t>(r)]) {
        auto& res = rs[static_cast<size_t>(r)];
        res.exited = WIFEXITED(st);
        res.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        res.signal = WIFSIGNALED(st) ? WTERMSIG(st) : 0;
        res.seconds = el;
        done[static_cast<size_t>(r)] = true;
        --alive;
      }
    }
    if (el > opt.timeout_s) {
      for (int r = 0; r < n; ++r) {
        if (!done[static_cast<size_t>(r)]) {
          ::kill(pids[static_cast<size_t>(r)], SIGKILL);
          ::waitpid(pids[static_cast<size_t>(r)], nullptr, 0);
          rs[static_cast<size_t>(r)].output += "\n[killed by the test deadline]";
          rs[static_cast<size_t>(r)].seconds = el;
          done[static_cast<size_t>(r)] = true;
        }
      }
      alive = 0;
    }
    ::usleep(2000);
  }
  for (int r = 0; r < n; ++r) {
    char buf[4096];
    ssize_t k;
    while ((k = ::read(fds[static_cast<size_t>(r)], buf, sizeof(buf))) > 0) {
      rs[static_cast<size_t>(r)].output.append(buf, static_cast<size_t>(k));
    }
    ::close(fds[static_cast<size_t>(r)]);
  }
  // Nothing may be left in /dev/shm by a finished job: the job's segments are named from its
  // token, as the shared-memory transport names them.
  auto left = shm_segments(comm::shm_job_prefix(token));
  for (auto& s : left) {
    ::unlink(("/dev/shm/" + s).c_str());
    rs[0].output += "\nleft behind in /dev/shm: " + s;
    rs[0].code = rs[0].code == 0 ? 98 : rs[0].code;
  }
  return rs;
}

void expect_all_ok(const std::vector<RankResult>& rs) {
  for (const auto& r : rs) {
    EXPECT_TRUE(r.exited && r.code == 0) << "rank " << r.rank << " exited=" << r.exited
                                         << " code=" << r.code << " signal=" << r.signal << "\n"
                                         << r.output;
  }
}

}  // namespace cohort::testing
