// `cohort launch`: starts the local ranks of a job (torchrun-compatible environment), prefixes
// their output with the rank, forwards SIGINT/SIGTERM, and tears the job down as soon as one rank
// fails, naming it; with --max-restarts, starts every rank again in a new generation (a new store
// and job token, so that nothing of the old one is accepted), up to N times, on every node that
// joins it (--nnodes MIN:MAX; the rendezvous is rendezvous.cc's).
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
#include <sstream>
#include <string>
#include <vector>

#include "cohort/comm/socket.h"
#include "cohort/comm/store.h"
#include "cohort/core/clock.h"
#include "cohort/core/env.h"
#include "cohort/core/error.h"
#include "rendezvous.h"
#include "verbs.h"

namespace cohort::cli {

namespace {

volatile sig_atomic_t g_signal = 0;
const std::string kInterrupted = "interrupted by signal ";

// A failure as the rendezvous records it, "<unix seconds> <what>", into its two parts.
void split_failure(const std::string& recorded, double& at, std::string& what) {
  const size_t sp = recorded.find(' ');
  at = std::stod(recorded.substr(0, sp));
  what = recorded.substr(sp + 1);
}
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
    std::string nnodes = "1";
    int node_rank = 0;
    double last_call = 5;
    double rdzv_timeout = 300;
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
  app.add_option("--nnodes", o->nnodes,
                 "Nodes in the job: N, or MIN:MAX for a job that carries on with MIN to MAX "
                 "nodes across restarts");
  app.add_option("--node-rank", o->node_rank,
                 "This node's index, 0..MAX-1 (node 0 hosts the rendezvous store, until its "
                 "launcher dies: then the lowest surviving node); under "
                 "MIN:MAX a generation numbers its nodes in this order");
  app.add_option("--rdzv-last-call", o->last_call,
                 "Seconds a generation waits for more nodes once MIN have joined");
  app.add_option("--rdzv-timeout", o->rdzv_timeout,
                 "Seconds to wait for MIN nodes, or for node 0's store to answer");
  app.add_option("--master", o->master,
                 "HOST:PORT of node 0's rendezvous store (default 127.0.0.1 and a free port on "
                 "one node; required with --nnodes > 1), or HOST:PORT,HOST:PORT,..: node i's "
                 "at entry i, where a launcher started after a failover finds the job");
  app.add_option("--job-id", o->job_id,
                 "Shared secret of the job, the same on every node (default: random on one "
                 "node; COHORT_JOB_TOKEN)");
  app.add_option("--grace", o->grace, "Seconds between SIGTERM and SIGKILL when stopping ranks");
  app.add_option("--max-restarts", o->max_restarts,
                 "When a rank fails, stop the others and start every rank again, up to N times "
                 "(COHORT_RESTART_COUNT tells the ranks; cohort train then resumes from its "
                 "--checkpoint-dir)")
      ->check(CLI::Range(0, 1000));
  app.add_option("--bind", o->bind,
                 "Give each local rank its own share of the cores: core, none, or auto (core "
                 "when ranks do not outnumber the cores this launcher may use)")
      ->check(CLI::IsMember({"auto", "core", "none"}));
  app.add_option("cmd", o->cmd, "PROGRAM [ARGS...] (after --)")->required();
  app.prefix_command();

  return [o]() -> int {
    int min_nodes = 0, max_nodes = 0;
    {
      const size_t colon = o->nnodes.find(':');
      try {
        size_t used = 0;
        min_nodes = std::stoi(o->nnodes.substr(0, colon), &used);
        COHORT_CHECK(used == (colon == std::string::npos ? o->nnodes.size() : colon), "");
        max_nodes = min_nodes;
        if (colon != std::string::npos) {
          max_nodes = std::stoi(o->nnodes.substr(colon + 1), &used);
          COHORT_CHECK(used == o->nnodes.size() - colon - 1, "");
        }
      } catch (const std::exception&) {
        COHORT_THROW("--nnodes '" << o->nnodes << "': expected N or MIN:MAX");
      }
      COHORT_CHECK(min_nodes >= 1 && min_nodes <= max_nodes && max_nodes <= 65536,
                   "--nnodes '" << o->nnodes << "': expected 1 <= MIN <= MAX");
    }
    if (o->node_rank < 0 || o->node_rank >= max_nodes) {
      COHORT_THROW("--node-rank " << o->node_rank << " is outside 0.." << max_nodes - 1);
    }
    if (max_nodes > 1 && o->master.empty()) {
      COHORT_THROW("--nnodes " << o->nnodes << " needs --master HOST:PORT (node 0's address)");
    }
    std::string token = o->job_id;
    if (token.empty()) token = env::get_or("COHORT_JOB_TOKEN", "");
    if (token.empty()) {
      if (max_nodes > 1)
        COHORT_THROW(
            "--nnodes " << o->nnodes
                        << " needs --job-id (or COHORT_JOB_TOKEN), the same on every node");
      token = random_hex(24);
    }
    for (char& c : token) {
      if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
    }
    RendezvousOptions ro;
    ro.master = comm::Endpoint{"127.0.0.1", 0};
    if (!o->master.empty()) {
      std::stringstream in(o->master);
      std::string entry;
      std::vector<comm::Endpoint> at;
      while (std::getline(in, entry, ',')) at.push_back(comm::parse_endpoint(entry, 29500));
      COHORT_CHECK(!at.empty() && static_cast<int>(at.size()) <= max_nodes,
                   "--master '" << o->master << "': expected 1 to " << max_nodes
                                << " HOST:PORT entries (one per node at most), got " << at.size());
      ro.master = at.front();
      ro.standbys.assign(at.begin() + 1, at.end());
    }
    ro.token = token;
    ro.node_id = o->node_rank;
    ro.min_nodes = min_nodes;
    ro.max_nodes = max_nodes;
    ro.last_call = o->last_call;
    ro.timeout = o->rdzv_timeout;

    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
    signal(SIGPIPE, SIG_IGN);
    Rendezvous rdzv(ro);

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

    // One generation: this node's ranks, their supervision until all have ended. Returns the
    // exit code; `failure` says which ranks failed and how (here or on another node),
    // `interrupted` whether a signal stopped the job (no restart then).
    auto run_generation = [&](const Generation& g, std::string& failure, bool& interrupted,
                              double failed_at, double& detected_at) -> int {
      const int world = static_cast<int>(g.members.size()) * o->nproc;
      std::vector<Child> kids(static_cast<size_t>(o->nproc));
      for (int lr = 0; lr < o->nproc; ++lr) {
        Child& c = kids[static_cast<size_t>(lr)];
        c.rank = g.node_rank * o->nproc + lr;
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
          setenv("GROUP_RANK", std::to_string(g.node_rank).c_str(), 1);
          setenv("MASTER_ADDR", g.store.host.c_str(), 1);
          // Cohort's ranks reach the generation's store on COHORT_STORE_PORT; MASTER_PORT is
          // left to PyTorch's own TCPStore (its rank 0 binds it) for torch scripts.
          setenv("COHORT_STORE_PORT", std::to_string(g.store.port).c_str(), 1);
          setenv("MASTER_PORT", std::to_string(g.torch_port).c_str(), 1);
          setenv("COHORT_JOB_TOKEN", g.token.c_str(), 1);
          setenv("COHORT_STORE_EXTERNAL", "1", 1);
          // The generation, as torchrun tells it, and when the previous one failed (unix
          // seconds), for the time a restart lost.
          setenv("COHORT_RESTART_COUNT", std::to_string(g.number).c_str(), 1);
          setenv("TORCHELASTIC_RESTART_COUNT", std::to_string(g.number).c_str(), 1);
          setenv("TORCHELASTIC_MAX_RESTARTS", std::to_string(o->max_restarts).c_str(), 1);
          if (g.number > 0) {
            setenv("COHORT_RESTART_FAILED_AT", std::to_string(failed_at).c_str(), 1);
            // The first generation's world: a run restarted on fewer ranks before its first
            // checkpoint still keeps that world's global batch.
            setenv("COHORT_RESTART_FIRST_WORLD", std::to_string(g.first_nodes * o->nproc).c_str(),
                   1);
          }
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
      Clock::time_point stop_at{}, polled = Clock::now();
      auto stop_all = [&](int sig) {
        for (auto& c : kids) {
          if (c.exited) continue;
          ::kill(c.pid, sig);
          if (sig == SIGTERM) ::kill(c.pid, SIGCONT);  // a stopped rank, to take its SIGTERM
        }
      };
      // The failure recorded by whichever node saw it first.
      auto take_failure = [&](const std::string& recorded) {
        split_failure(recorded, detected_at, failure);
        // A launcher that was asked to stop (SIGINT, SIGTERM) stops the job: no restart.
        if (failure.find(kInterrupted) != std::string::npos) interrupted = true;
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
          std::string what;
          for (const Child* c : failed) {
            what += std::string(what.empty() ? "" : "; ") + "rank " + std::to_string(c->rank) +
                    " (pid " + std::to_string(c->pid) + ") " + describe_status(c->status);
          }
          if (rdzv.multi_node()) what = "node " + std::to_string(o->node_rank) + ": " + what;
          // Another node may have seen the job's first failure already: that one is the cause.
          take_failure(rdzv.report_failure(g, what, WIFSIGNALED(failed.front()->status)));
          std::fprintf(stderr, "cohort launch: %s; stopping the other ranks\n", failure.c_str());
          exit_code = 1;
          stopping = true;
          stop_at = Clock::now();
          stop_all(SIGTERM);
        }
        if (!stopping && rdzv.multi_node() && seconds_since(polled) > 0.2) {
          polled = Clock::now();
          if (auto f = rdzv.failure(g)) {
            take_failure(*f);
            std::fprintf(stderr, "cohort launch: %s; stopping this node's ranks\n",
                         failure.c_str());
            exit_code = 1;
            stopping = true;
            stop_at = Clock::now();
            stop_all(SIGTERM);
          }
        }
        if (g_signal && !stopping) {
          std::fprintf(stderr, "cohort launch: got signal %d, forwarding to ranks\n",
                       int(g_signal));
          failure = kInterrupted + std::to_string(g_signal);
          rdzv.report_failure(g, "node " + std::to_string(o->node_rank) + ": " + failure, false);
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
      remove_shm_segments(g.token);
      if (exit_code != 0 && !interrupted) {
        if (auto c = rdzv.cause(g)) take_failure(*c);  // the other nodes' reports are in by now
      }
      return exit_code;
    };

    // Generations: the first, then one per restart while a rank fails and restarts are left.
    double failed_at = 0;
    std::vector<int> members;
    for (int gen = 0;; ++gen) {
      std::optional<Generation> g = rdzv.join(gen);
      if (!g) {
        std::fprintf(
            stderr,
            "cohort launch: node %d: the job ended (%s) before a generation took this node\n",
            o->node_rank, rdzv.ended().c_str());
        return rdzv.ended() == "ok" ? 0 : 1;
      }
      gen = g->number;
      if (rdzv.multi_node()) {
        std::vector<int> left_ids, joined_ids;
        for (int id : members) {
          if (std::find(g->members.begin(), g->members.end(), id) == g->members.end())
            left_ids.push_back(id);
        }
        for (int id : g->members) {
          if (!members.empty() && std::find(members.begin(), members.end(), id) == members.end())
            joined_ids.push_back(id);
        }
        const std::string ids = join_ids(g->members), left = join_ids(left_ids),
                          joined = join_ids(joined_ids);
        std::fprintf(stderr,
                     "cohort launch: generation %d: nodes %s (%zu of %d..%d, %zu ranks)%s%s; this "
                     "is node %d, node rank %d\n",
                     gen, ids.c_str(), g->members.size(), min_nodes, max_nodes,
                     g->members.size() * static_cast<size_t>(o->nproc),
                     left.empty() ? "" : ("; node(s) " + left + " left").c_str(),
                     joined.empty() ? "" : ("; node(s) " + joined + " joined").c_str(),
                     o->node_rank, g->node_rank);
        members = g->members;
      }
      std::string failure;
      bool interrupted = false;
      double detected_at = 0;
      int code = run_generation(*g, failure, interrupted, failed_at, detected_at);
      if (code == 0) {
        // Every rank here ended well; the job is done once every node's did.
        if (auto f = rdzv.finish(*g, o->grace + o->rdzv_timeout)) {
          split_failure(*f, detected_at, failure);
          code = 1;
        } else {
          rdzv.close_job(true, "");
          return 0;
        }
      }
      if (interrupted || gen >= o->max_restarts) {
        std::fprintf(stderr, "cohort launch: job failed: %s%s\n", failure.c_str(),
                     o->max_restarts > 0 && !interrupted
                         ? (" (after " + std::to_string(gen) + " restart(s) of " +
                            std::to_string(o->max_restarts) + ")")
                               .c_str()
                         : "");
        rdzv.close_job(false, failure);
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
