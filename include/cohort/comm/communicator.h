// The collective-communication API. A Communicator is a group of ranks; every collective
// returns a Work handle at once and runs in issue order, one at a time.
// Two backends implement it: Cohort's own engine (shared memory + TCP) and `mpi`.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cohort/comm/store.h"
#include "cohort/comm/types.h"

namespace cohort::comm {

// Algorithms a collective may run; `automatic` lets the cost model pick per call.
// `shared`: the ranks of one host read each other's buffers where they lie (SharedBuffer).
enum class Algo {
  automatic,
  ring,
  recursive_doubling,
  rabenseifner,
  hierarchical,
  tree,
  direct,
  shared
};
const char* algo_name(Algo a);
Algo parse_algo(const std::string& s);

// A call's options. A forced algorithm runs as asked or the call fails at issue, saying why
// (the collective lacks it, or this group's shape cannot run it). With `automatic`, COHORT_ALGO
// forces its algorithm on the collectives that have it; the cost model picks the rest.
struct CollOptions {
  Algo algo = Algo::automatic;
};

// What the job looks like from this process: read from cohort launch / torchrun, Open MPI or
// Slurm variables (see docs/comm.md).
struct JobEnv {
  int rank = 0;
  int world = 1;
  int local_rank = 0;
  int local_world = 1;
  std::string master_addr = "127.0.0.1";
  uint16_t master_port = 29500;
  std::string token;
  bool store_external = false;  // the launcher hosts the store; rank 0 must not
  std::string launcher;         // cohort | torchrun | mpirun | slurm | single
};
JobEnv detect_job_env();

class WorkState;
class Work {
 public:
  Work() = default;
  explicit Work(std::shared_ptr<WorkState> s) : s_(std::move(s)) {}
  // Blocks until the collective finished; rethrows its error (CommError, TimeoutError, ...).
  void wait();
  bool test();  // true once finished (successfully or not)
  // The algorithm chosen for this call at issue; once finished, the one that ran (a `shared`
  // collective runs the ring where a rank's buffers lie outside shared memory).
  std::string algorithm() const;
  std::string reason() const;  // why: "cost model", "forced by the call", "COHORT_ALGO", ...
  // The rank a finished receive took its message from (Mailbox::irecv from kAnySource); -1
  // for every other call and before it finished.
  int source() const;

 private:
  std::shared_ptr<WorkState> s_;
};

// Memory that the ranks of one host can read from each other (Communicator::alloc_shared).
// Copies share the memory; it is released when the last copy goes, and must outlive the calls
// that use it.
class SharedBuffer {
 public:
  SharedBuffer() = default;
  SharedBuffer(void* data, size_t bytes, std::shared_ptr<const void> owner, bool shared)
      : data_(data), bytes_(bytes), owner_(std::move(owner)), shared_(shared) {}
  void* data() const { return data_; }
  size_t size() const { return bytes_; }  // bytes
  // Whether the host's ranks map it (false: a backend without shared memory gave ordinary
  // memory).
  bool shared() const { return shared_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  std::shared_ptr<const void> owner_;
  bool shared_ = false;
};

// A Mailbox::irecv that takes the first matching message from any rank.
inline constexpr int kAnySource = -1;

// Tagged point-to-point messages, as MPI's and PyTorch's isend/irecv (Communicator::open_mailbox).
// A receive takes the oldest message that matches its source (or any rank) and tag; messages from
// one rank with one tag match in the order sent. Every call completes on its own, whatever order
// the ranks post them in and whatever collectives run meanwhile: the mailbox has links of its own
// and a thread that keeps them moving, and a message that arrives before its receive is held
// (in memory the mailbox allocates) until one is posted. A receive of another size than the
// message fails, naming both sizes, and the message waits for the next receive that matches it.
// Calls fail with TimeoutError ("Timed out ...") after the communicator's timeout, and with
// CommError naming the rank when a peer dies. A receive that times out while its message
// arrives takes that message with it (the rest is read and dropped); a send that times out part
// way closes the mailbox's link to its rank, whose calls then all fail.
class Mailbox {
 public:
  // Runs once when its call has finished, successfully or not: on the mailbox's thread, or on
  // the caller's when the call finishes at once. It must not call back into the mailbox's owner
  // while holding locks that the caller of isend/irecv may hold.
  using Done = std::function<void(const Work&)>;
  virtual ~Mailbox() = default;
  // Sends `bytes` from `data` (left unchanged until the call finishes) to `peer`.
  virtual Work isend(const void* data, size_t bytes, int peer, int tag, Done done = {}) = 0;
  // Receives into `data` a message of exactly `bytes` from `peer` or, with kAnySource, from the
  // first rank whose message with `tag` is there (Work::source() says which).
  virtual Work irecv(void* data, size_t bytes, int peer, int tag, Done done = {}) = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual int local_rank() const = 0;  // among the ranks of this host
  virtual int local_size() const = 0;
  virtual int num_hosts() const = 0;
  virtual const std::string& host() const = 0;
  virtual std::string describe() const = 0;  // backend, transports, algorithm policy
  // What the job looks like: hosts and their ranks, the transport between every pair, the link
  // figures the cost model uses, and the algorithm it picks per collective and size.
  virtual std::string topology_report() const { return describe() + "\n"; }

  // count: elements per rank buffer. recv may equal send (in place) unless stated otherwise.
  virtual Work allreduce(const void* send, void* recv, size_t count, DataType t, RedOp op,
                         CollOptions o = {}) = 0;
  // send holds size()*count elements; recv receives this rank's count-element block.
  virtual Work reduce_scatter(const void* send, void* recv, size_t count, DataType t, RedOp op,
                              CollOptions o = {}) = 0;
  // send holds count elements; recv receives size()*count, ordered by rank.
  virtual Work allgather(const void* send, void* recv, size_t count, DataType t,
                         CollOptions o = {}) = 0;
  // root's send is copied to every rank's recv.
  virtual Work broadcast(const void* send, void* recv, size_t count, DataType t, int root,
                         CollOptions o = {}) = 0;
  // the reduction lands in root's recv (others' recv is untouched and may be null).
  virtual Work reduce(const void* send, void* recv, size_t count, DataType t, RedOp op, int root,
                      CollOptions o = {}) = 0;
  // block j of send (count elements) goes to rank j; block i of recv came from rank i.
  virtual Work alltoall(const void* send, void* recv, size_t count, DataType t,
                        CollOptions o = {}) = 0;
  // root's recv receives size()*count, ordered by rank.
  virtual Work gather(const void* send, void* recv, size_t count, DataType t, int root,
                      CollOptions o = {}) = 0;
  // block i of root's send goes to rank i's recv.
  virtual Work scatter(const void* send, void* recv, size_t count, DataType t, int root,
                       CollOptions o = {}) = 0;
  // Point-to-point in the communicator's issue order: each runs in its turn, like a collective,
  // so a receive holds back the calls issued after it until its message came (pipeline stages
  // issue them in matching orders). For messages that complete in any order, with tags and from
  // any source, use a Mailbox.
  virtual Work send(const void* data, size_t count, DataType t, int peer) = 0;
  virtual Work recv(void* data, size_t count, DataType t, int peer) = 0;
  virtual Work barrier() = 0;

  // A mailbox over links of its own to every rank of this communicator. Collective over the
  // communicator. Backends without one (mpi) throw, naming themselves.
  virtual std::shared_ptr<Mailbox> open_mailbox();

  // `bytes` of memory that this host's ranks map from each other, zeroed. An allreduce whose
  // buffers lie in such memory on every rank of a one-host group reads the peers' data where it
  // lies: one copy per byte, where a ring through shared memory makes three (docs/comm.md);
  // reduce_scatter and allgather likewise, with their inputs there.
  // Collective over the communicator, with the same `bytes` on every rank. Backends without
  // shared memory (mpi) return ordinary memory.
  virtual SharedBuffer alloc_shared(size_t bytes);

  // Ranks with the same color form a new communicator, ordered by (key, rank); color < 0 gets
  // nullptr. Collective over this communicator.
  virtual std::shared_ptr<Communicator> split(int color, int key) = 0;

  // Tears the communicator down without waiting for peers: pending and later calls fail, and
  // the peers' waits fail promptly too.
  virtual void abort(const std::string& reason) = 0;
};

struct InitOptions {
  std::chrono::milliseconds timeout{0};  // 0: COHORT_TIMEOUT seconds, default 300
  std::string backend;                   // "" : COHORT_BACKEND, default "cohort"
};

// Creates the world communicator from the environment (see JobEnv).
std::shared_ptr<Communicator> init(const InitOptions& opt = {});

// Joins a world through a store another framework set up (the PyTorch backend hands in torch's):
// rank and world come from the caller, and the token that guards the links is agreed through the
// store. Collective over the `world` ranks; always Cohort's own engine.
std::shared_ptr<Communicator> join(Store store, int rank, int world, const InitOptions& opt = {});

}  // namespace cohort::comm
