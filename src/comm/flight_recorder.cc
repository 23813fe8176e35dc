// FlightRecorder: a ring of the communicator's last calls under one mutex (a few stores per call,
// next to collectives of microseconds and more), its JSON (nlohmann-json), and SIGUSR1: the handler
// only writes a byte to a pipe; a thread started with the first recorder that has a directory dumps
// every live recorder from there.
#include "flight_recorder.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "cohort/core/log.h"

namespace cohort::comm::detail {

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Every recorder with a directory, for SIGUSR1.
std::mutex g_mu;
std::set<const FlightRecorder*>* g_live = nullptr;
int g_pipe[2] = {-1, -1};

void on_sigusr1(int) {
  const char b = 1;
  [[maybe_unused]] ssize_t n = ::write(g_pipe[1], &b, 1);
}

void start_signal_thread() {  // g_mu held
  if (g_pipe[0] >= 0) return;
  if (::pipe2(g_pipe, O_CLOEXEC) != 0) return;
  std::thread([] {
    char b;
    while (::read(g_pipe[0], &b, 1) > 0) {
      std::lock_guard<std::mutex> lock(g_mu);
      for (const FlightRecorder* r : *g_live) r->dump("SIGUSR1");
    }
  }).detach();
  struct sigaction sa {};
  sa.sa_handler = on_sigusr1;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  ::sigaction(SIGUSR1, &sa, nullptr);
}

}  // namespace

FlightRecorder::FlightRecorder(std::string comm, int rank, int world, std::vector<int> global_ranks,
                               std::string host, std::optional<std::string> dir)
    : comm_(std::move(comm)),
      host_(std::move(host)),
      rank_(rank),
      world_(world),
      global_(std::move(global_ranks)),
      dir_(std::move(dir)) {
  ring_.resize(kCalls);
  if (dir_) {
    std::lock_guard<std::mutex> lock(g_mu);
    if (!g_live) g_live = new std::set<const FlightRecorder*>;  // lives as long as the process
    g_live->insert(this);
    start_signal_thread();
  }
}

FlightRecorder::~FlightRecorder() {
  if (dir_) {
    std::lock_guard<std::mutex> lock(g_mu);
    g_live->erase(this);
  }
}

uint64_t FlightRecorder::queued(const Call& c) {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t id = next_++;
  Entry& e = ring_[id % kCalls];
  e = Entry{};
  e.id = id;
  e.desc = c.desc;
  e.algo = c.algo;
  e.is_send = c.is_send;
  e.peer = c.peer;
  e.queued = now_s();
  return id;
}

void FlightRecorder::started(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  Entry& e = ring_[id % kCalls];
  if (e.id != id) return;
  e.state = 'r';
  e.started = now_s();
  current_ = id;
  waiting_.clear();
}

void FlightRecorder::ended(uint64_t id, bool ok) {
  std::lock_guard<std::mutex> lock(mu_);
  if (ok) waiting_.clear();  // a failed call keeps the peers it waited on, for the dump
  Entry& e = ring_[id % kCalls];
  if (e.id != id) return;
  e.state = ok ? 'd' : 'f';
  e.ended = now_s();
}

void FlightRecorder::waiting_on(std::vector<int> peers) {
  std::lock_guard<std::mutex> lock(mu_);
  waiting_ = std::move(peers);
}

std::string FlightRecorder::json(const std::string& reason) const {
  std::lock_guard<std::mutex> lock(mu_);
  nlohmann::json calls = nlohmann::json::array();
  const uint64_t first = next_ > kCalls ? next_ - kCalls : 0;
  for (uint64_t id = first; id < next_; ++id) {
    const Entry& e = ring_[id % kCalls];
    const char* state = e.state == 'q'   ? "queued"
                        : e.state == 'r' ? "running"
                        : e.state == 'd' ? "done"
                                         : "failed";
    const char* kind = e.desc.coll != Coll::sendrecv ? collective_name(e.desc.coll)
                       : e.is_send                   ? "send"
                                                     : "recv";
    nlohmann::json c = {{"id", e.id},
                        {"kind", kind},
                        {"seq", e.desc.seq},
                        {"peer", e.peer},
                        {"dtype", dtype_name(e.desc.dtype)},
                        {"count", e.desc.count},
                        {"algorithm", algo_name(e.algo)},
                        {"state", state},
                        {"queued", e.queued},
                        {"started", e.started},
                        {"ended", e.ended},
                        {"what", e.desc.str()}};
    if (e.id == current_ && (e.state == 'r' || e.state == 'f')) c["waiting_on"] = waiting_;
    calls.push_back(std::move(c));
  }
  const nlohmann::json doc = {{"format", "cohort-flight-1"},
                              {"communicator", comm_},
                              {"rank", rank_},
                              {"world", world_},
                              {"global_ranks", global_},
                              {"host", host_},
                              {"pid", ::getpid()},
                              {"time", now_s()},
                              {"reason", reason},
                              {"calls", std::move(calls)}};
  return doc.dump(1) + "\n";
}

std::string FlightRecorder::dump(const std::string& reason) const {
  if (!dir_) return "";
  std::string name = comm_;
  for (char& ch : name) {
    if (ch == '/') ch = '_';
  }
  const std::string path = *dir_ + "/" + name + ".rank-" + std::to_string(rank_) + ".json";
  try {
    std::filesystem::create_directories(*dir_);
    const std::string tmp = path + ".tmp";
    {
      std::ofstream f(tmp);
      f << json(reason);
      if (!f) throw std::runtime_error("cannot write " + tmp);
    }
    std::filesystem::rename(tmp, path);
  } catch (const std::exception& e) {
    COHORT_LOG(warn, "flight recorder: " << e.what());
    return "";
  }
  return path;
}

}  // namespace cohort::comm::detail
