// `cohort launch`: starts the local ranks of a job (torchrun-compatible environment), hosts the
// rendezvous store on node 0, prefixes their output with the rank, forwards SIGINT/SIGTERM, and
// tears the job down as soon as one rank fails, naming it; with --max-restarts, starts every
// rank again in a new generation (a new store and job token, so that nothing of the old one is
// accepted), up to N times.
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cohort/comm/socket.h"
#include "cohort/comm/store.h"
#include "cohort/core/clock.h"
#include "cohort/core/env.h"
#include "cohort/core/error.h"
#include "verbs.h"

namespace cohort::cli {

namespace {

volatile sig_atomic_t g_signal = 0;
void on_signal(int sig) {
  g_signal = sig;
}

struct Child {
  int rank = 0;
  pid_t pid = -1;
  int out_fd = -1;
  int err_fd = -1;
  std::string out_buf, err_buf;
  bool exited = false;
  int status = 0;
};

std::string random_hex(int n) {
  std::random_device rd;
  const char* hex = "0123456789abcdef";
  std::string t;
  for (int i = 0; i < n; ++i) t += hex[rd() % 16];
  return t;
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    int s = WTERMSIG(status);
    const char* name = sigabbrev_np(s);
    return "was killed by signal " + std::to_string(s) + " (SIG" + (name ? name : "?") + ")";
  }
  return "ended with status " + std::to_string(status);
}

// Writes complete lines of `buf` with the rank prefix; keeps the unfinished tail.
void flush_lines(std::string& buf, int rank, FILE* to, bool all) {
  size_t start = 0;
  while (true) {
    size_t nl = buf.find('\n', start);
    if (nl == std::string::npos) break;
    std::fprintf(to, "[rank %d] %.*s\n", rank, static_cast<int>(nl - start), buf.data() + start);
    start = nl + 1;
  }
  buf.erase(0, start);
  if (all && !buf.empty()) {
    std::fprintf(to, "[rank %d] %s\n", rank, buf.c_str());
    buf.clear();
  }
  std::fflush(to);
}

void remove_shm_segments(const std::string& token) {
  // Segments are unlinked once both sides attach; this catches a rank that died in between.
  std::string prefix = "cohort-" + token.substr(0, 16);
  DIR* d = ::opendir("/dev/shm");
  if (!d) return;
  while (dirent* e = ::readdir(d)) {
    if (std::strncmp(e->d_name, prefix.c_str(), prefix.size()) == 0) {
      std::string p = "/dev/shm/" + std::string(e->d_name);
      ::unlink(p.c_str());
    }
  }
  ::closedir(d);
}

}  // namespace

Run add_launch(CLI::App& app) {
  struct Opts {
    int nproc = 1;
    int nnodes = 1;
    int node_rank = 0;
    std::string master;
    std::string job_id;
    double grace = 5.0;
    int max_restarts = 0;
    std::string bind = "auto";
    std::vector<std::string> cmd;
  };
  auto o = std::make_shared<Opts>();
  app.add_option("--nproc-per-node", o->nproc, "Ranks to start on this node")
      ->required()
      ->check(CLI::Range(1, 1024));
  app.add_option("--nnodes", o->nnodes, "Nodes in the job")->check(CLI::Range(1, 65536));
  app.add_option("--node-rank", o->node_rank, "This node's index, 0..nnodes-1");
  app.add_option("--master", o->master,
                 "HOST:PORT of node 0's rendezvous store (default 127.0.0.1 and a free port on "
                 "one node; required with --nnodes > 1)");
  app.add_option("--job-id", o->job_id,
                 "Shared secret of the job, the same on every node (default: random on one "
                 "node; COHORT_JOB_TOKEN)");
  app.add_option("--grace", o->grace, "Seconds between SIGTERM and SIGKILL when stopping ranks");
  app.add_option("--max-restarts", o->max_restarts,
                 "When a rank fails, stop the others and start every rank again, up to N times "
                 "(COHORT_RESTART_COUNT tells the ranks; cohort train then resumes from its "
                 "--checkpoint-dir); one node")
      ->check(CLI::Range(0, 1000));
  app.add_option("--bind", o->bind,
                 "Give each local rank its own share of the cores: core, none, or auto (core "
                 "when ranks do not outnumber the cores this launcher may use)")
      ->check(CLI::IsMember({"auto", "core", "none"}));
  app.add_option("cmd", o->cmd, "PROGRAM [ARGS...] (after --)")->required();
  app.prefix_command();

  return [o]() -> int {
    if (o->node_rank < 0 || o->node_rank >= o->nnodes) {
      COHORT_THROW("--node-rank " << o->node_rank << " is outside 0.." << o->nnodes - 1);
    }
    if (o->nnodes > 1 && o->master.empty()) {
      COHORT_THROW("--nnodes " << o->nnodes << " needs --master HOST:PORT (node 0's address)");
    }
    std::string token = o->job_id;
    if (token.empty()) token = env::get_or("COHORT_JOB_TOKEN", "");
    if (token.empty()) {
      if (o->nnodes > 1)
        COHORT_THROW("--nnodes > 1 needs --job-id (or COHORT_JOB_TOKEN), the same on every node");
      token = random_hex(24);
    }
    for (char& c : token) {
      if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
    }
    COHORT_CHECK(o->max_restarts == 0 || o->nnodes == 1,
                 "--max-restarts with --nnodes " << o->nnodes
                                                 << ": restarts across nodes are not built yet "
                                                    "(one node restarts its ranks alone)");
    const comm::Endpoint asked =
        o->master.empty() ? comm::Endpoint{"127.0.0.1", 0} : comm::parse_endpoint(o->master, 29500);
    const int world = o->nnodes * o->nproc;

    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
    signal(SIGPIPE, SIG_IGN);

    // Spinning ranks that share a core slow each other down by orders of magnitude, and the
    // scheduler does not reliably keep them apart: pin them, as mpirun does.
    std::vector<int> cpus;
    {
      cpu_set_t allowed;
      if (sched_getaffinity(0, sizeof(allowed), &allowed) == 0) {
        for (int c = 0; c < CPU_SETSIZE; ++c) {
          if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
        }
      }
    }
    const bool bind = o->bind == "core" || (o->bind == "auto" && !cpus.empty() &&
                                            o->nproc <= static_cast<int>(cpus.size()));

    // One generation: a store, the ranks, their supervision until all have ended. Returns the
    // exit code; `failure` says which ranks failed and how, `interrupted` whether a signal
    // stopped the job (no restart then).
    auto run_generation = [&](int gen, const std::string& token, std::string& failure,
                              bool& interrupted, double failed_at, double& detected_at) -> int {
      comm::Endpoint master = asked;
      std::unique_ptr<comm::StoreServer> server;
      if (o->node_rank == 0) {
        bool loop = master.host.rfind("127.", 0) == 0 || master.host == "localhost";
        server =
            std::make_unique<comm::StoreServer>(loop ? master.host : "0.0.0.0", master.port, token);
        master.port = server->port();
      }
      // The port for PyTorch's own TCPStore (MASTER_PORT): on one node a free one; across nodes,
      // which must agree without asking, the store's port + 1.
      uint16_t torch_port = static_cast<uint16_t>(master.port + 1);
      if (o->nnodes == 1) torch_port = comm::local_port(comm::listen_tcp(master.host, 0));
      std::vector<Child> kids(static_cast<size_t>(o->nproc));
      for (int lr = 0; lr < o->nproc; ++lr) {
        Child& c = kids[static_cast<size_t>(lr)];
        c.rank = o->node_rank * o->nproc + lr;
        int out[2], err[2];
        if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) {
          COHORT_THROW("pipe: " << errno_string(errno));
        }
        pid_t parent = ::getpid();
        pid_t pid = ::fork();
        if (pid < 0) COHORT_THROW("fork: " << errno_string(errno));
        if (pid == 0) {
          ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the launcher
          if (::getppid() != parent) _exit(127);
          ::dup2(out[1], 1);
          ::dup2(err[1], 2);
          setenv("RANK", std::to_string(c.rank).c_str(), 1);
          setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
          setenv("LOCAL_RANK", std::to_string(lr).c_str(), 1);
          setenv("LOCAL_WORLD_SIZE", std::to_string(o->nproc).c_str(), 1);
          setenv("GROUP_RANK", std::to_string(o->node_rank).c_str(), 1);
          setenv("MASTER_ADDR", master.host.c_str(), 1);
          // Cohort's ranks reach the launcher's store on COHORT_STORE_PORT; MASTER_PORT is left
          // to PyTorch's own TCPStore (its rank 0 binds it) for torch scripts.
          setenv("COHORT_STORE_PORT", std::to_string(master.port).c_str(), 1);
          setenv("MASTER_PORT", std::to_string(torch_port).c_str(), 1);
          setenv("COHORT_JOB_TOKEN", token.c_str(), 1);
          setenv("COHORT_STORE_EXTERNAL", "1", 1);
          // The generation, as torchrun tells it, and when the previous one failed (unix
          // seconds), for the time a restart lost.
          setenv("COHORT_RESTART_COUNT", std::to_string(gen).c_str(), 1);
          setenv("TORCHELASTIC_RESTART_COUNT", std::to_string(gen).c_str(), 1);
          setenv("TORCHELASTIC_MAX_RESTARTS", std::to_string(o->max_restarts).c_str(), 1);
          if (gen > 0) setenv("COHORT_RESTART_FAILED_AT", std::to_string(failed_at).c_str(), 1);
          if (o->nproc > 1) setenv("OMP_NUM_THREADS", "1", 0);
          if (bind && !cpus.empty()) {  // an equal, disjoint share of the cores per rank
            const size_t share = std::max<size_t>(1, cpus.size() / static_cast<size_t>(o->nproc));
            cpu_set_t set;
            CPU_ZERO(&set);
            for (size_t k = 0; k < share; ++k) {
              CPU_SET(cpus[(static_cast<size_t>(lr) * share + k) % cpus.size()], &set);
            }
            sched_setaffinity(0, sizeof(set), &set);
          }
          std::vector<char*> argv;
          for (auto& a : o->cmd) argv.push_back(const_cast<char*>(a.c_str()));
          argv.push_back(nullptr);
          ::execvp(argv[0], argv.data());
          std::fprintf(stderr, "cohort launch: cannot run '%s': %s\n", argv[0],
                       std::strerror(errno));
          _exit(127);
        }
        ::close(out[1]);
        ::close(err[1]);
        c.pid = pid;
        c.out_fd = out[0];
        c.err_fd = err[0];
      }

      int exit_code = 0;
      bool stopping = false;
      Clock::time_point stop_at{};
      auto stop_all = [&](int sig) {
        for (auto& c : kids) {
          if (!c.exited) ::kill(c.pid, sig);
        }
      };
      while (true) {
        std::vector<pollfd> fds;
        std::vector<std::pair<Child*, bool>> who;
        for (auto& c : kids) {
          if (c.out_fd >= 0) fds.push_back({c.out_fd, POLLIN, 0}), who.emplace_back(&c, false);
          if (c.err_fd >= 0) fds.push_back({c.err_fd, POLLIN, 0}), who.emplace_back(&c, true);
        }
        ::poll(fds.data(), fds.size(), 50);
        for (size_t i = 0; i < fds.size(); ++i) {
          if (!fds[i].revents) continue;
          Child& c = *who[i].first;
          bool is_err = who[i].second;
          char buf[65536];
          ssize_t r = ::read(fds[i].fd, buf, sizeof(buf));
          std::string& b = is_err ? c.err_buf : c.out_buf;
          if (r > 0) {
            b.append(buf, static_cast<size_t>(r));
            flush_lines(b, c.rank, is_err ? stderr : stdout, false);
          } else {
            flush_lines(b, c.rank, is_err ? stderr : stdout, true);
            ::close(fds[i].fd);
            (is_err ? c.err_fd : c.out_fd) = -1;
          }
        }
        bool all_done = true;
        // Ranks that failed since the last look. A rank killed by a signal is named first: the
        // others that failed with it were most likely its peers, failing because it died.
        std::vector<const Child*> failed;
        for (auto& c : kids) {
          if (!c.exited) {
            int st = 0;
            if (::waitpid(c.pid, &st, WNOHANG) == c.pid) {
              c.exited = true;
              c.status = st;
              if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0)) failed.push_back(&c);
            }
          }
          all_done = all_done && c.exited && c.out_fd < 0 && c.err_fd < 0;
        }
        if (!failed.empty() && !stopping) {
          std::stable_partition(failed.begin(), failed.end(),
                                [](const Child* c) { return WIFSIGNALED(c->status); });
          for (const Child* c : failed) {
            failure += std::string(failure.empty() ? "" : "; ") + "rank " +
                       std::to_string(c->rank) + " (pid " + std::to_string(c->pid) + ") " +
                       describe_status(c->status);
          }
          std::fprintf(stderr, "cohort launch: %s; stopping the other ranks\n", failure.c_str());
          detected_at = unix_seconds();
          exit_code = 1;
          stopping = true;
          stop_at = Clock::now();
          stop_all(SIGTERM);
        }
        if (g_signal && !stopping) {
          std::fprintf(stderr, "cohort launch: got signal %d, forwarding to ranks\n",
                       int(g_signal));
          failure = "interrupted by signal " + std::to_string(g_signal);
          interrupted = true;
          exit_code = 128 + g_signal;
          stopping = true;
          stop_at = Clock::now();
          stop_all(g_signal);
        }
        if (stopping && seconds_since(stop_at) > o->grace) {
          stop_all(SIGKILL);
          for (auto& c : kids) {  // a killed rank's descendants may hold the pipe open
            if (c.exited) {
              if (c.out_fd >= 0) ::close(c.out_fd), c.out_fd = -1;
              if (c.err_fd >= 0) ::close(c.err_fd), c.err_fd = -1;
            }
          }
        }
        if (all_done) break;
      }
      remove_shm_segments(token);
      return exit_code;
    };

    // Generations: the first, then one per restart while a rank fails and restarts are left.
    // Each has a token of its own (a straggler of the previous one is refused by the new
    // store); the first keeps the job's.
    double failed_at = 0;
    for (int gen = 0;; ++gen) {
      const std::string gen_token = gen == 0 ? token : "g" + std::to_string(gen) + "x" + token;
      std::string failure;
      bool interrupted = false;
      double detected_at = 0;
      const int code = run_generation(gen, gen_token, failure, interrupted, failed_at, detected_at);
      if (code == 0) return 0;
      if (interrupted || gen >= o->max_restarts) {
        std::fprintf(stderr, "cohort launch: job failed: %s%s\n", failure.c_str(),
                     o->max_restarts > 0 && !interrupted
                         ? (" (after " + std::to_string(gen) + " restart(s) of " +
                            std::to_string(o->max_restarts) + ")")
                               .c_str()
                         : "");
        return code;
      }
      failed_at = detected_at;
      std::fprintf(stderr,
                   "cohort launch: restart %d of %d (generation %d): %s; starting all %d "
                   "rank(s) again\n",
                   gen + 1, o->max_restarts, gen + 1, failure.c_str(), o->nproc);
    }
  };
}

}  // namespace cohort::cli
