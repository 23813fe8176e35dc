// The flight recorder: the last kCalls calls of one communicator (what, algorithm, state, when
// queued, started and ended, and for the running call the peers it waits on), written as JSON to
// COHORT_FLIGHT_DIR/<communicator>.rank-<r>.json when a call fails (timeout, dead peer,
// mismatch), when the communicator is aborted, and on SIGUSR1. `cohort doctor DIR` reads the
// dumps of every rank and says what happened.
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "call.h"

namespace cohort::comm::detail {

class FlightRecorder {
 public:
  static constexpr size_t kCalls = 512;
  // Dumps go to `dir` when there is one; with a directory, SIGUSR1 dumps every live recorder.
  FlightRecorder(std::string comm, int rank, int world, std::vector<int> global_ranks,
                 std::string host, std::optional<std::string> dir);
  ~FlightRecorder();
  FlightRecorder(const FlightRecorder&) = delete;
  FlightRecorder& operator=(const FlightRecorder&) = delete;

  uint64_t queued(const Call& c);  // returns the entry's id
  void started(uint64_t id);
  void ended(uint64_t id, bool ok);
  void waiting_on(std::vector<int> peers);  // the running call's unfinished peers ({}: none)

  std::string json(const std::string& reason) const;
  // Writes the dump (atomically: a temporary file renamed); the path, or "" without a directory.
  std::string dump(const std::string& reason) const;

 private:
  // Plain values only: the text is made when a record is written, not on every call.
  struct Entry {
    uint64_t id = 0;
    CollDesc desc;
    Algo algo = Algo::direct;
    bool is_send = false;
    int peer = -1;
    char state = 'q';                           // q(ueued), r(unning), d(one), f(ailed)
    double queued = 0, started = 0, ended = 0;  // seconds since the epoch
  };
  std::string comm_, host_;
  int rank_, world_;
  std::vector<int> global_;
  std::optional<std::string> dir_;
  mutable std::mutex mu_;
  std::vector<Entry> ring_;
  uint64_t next_ = 0;
  std::vector<int> waiting_;  // the peers the call `current_` waits (or waited when it failed) on
  uint64_t current_ = UINT64_MAX;
};

}  // namespace cohort::comm::detail
