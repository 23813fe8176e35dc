// The launchers' rendezvous across nodes, for `cohort launch --nnodes MIN:MAX --max-restarts N`:
// node 0's launcher hosts an agent store for the whole job (the job token opens it), and every
// generation of ranks gets a store of its own with a token of its own, so that a straggler of an
// older generation is refused. A generation forms once MAX launchers have joined, or MIN and no
// other for `last_call` seconds; a launcher that joins late (a host that came back) waits for the
// next one. The first failure of a generation is recorded there, and every launcher stops its
// ranks when it sees it.
//
// Losing node 0: every other launcher keeps a standby store, published in the agent store. When
// the agent store's port refuses connections (its host answers, its launcher is gone, and its
// ranks with it), the launchers move to the lowest surviving node of the last generation, which
// then hosts the rendezvous. A store that does not answer at all (a host down, or a link cut:
// no node alone can tell the two apart) is replaced only by a majority: each launcher that loses
// it votes in its own standby store, and once more than half of the last generation's nodes
// have voted and reach each other, the lowest of them hosts the rendezvous. The old leader, if
// it lives on cut off, finds only a minority joining its next generation and stops at the
// timeout, naming them, so that the job never splits in two. A job of 2 nodes has no majority
// without its leader: its other node waits for the store until the timeout, then ends, naming
// it, while the leader goes on alone.
//
// Finding the job later: with `--master` listing an address per node (node i's at entry i),
// each launcher's standby store listens at its own entry, and every store (agent or standby)
// says which node leads and where. A launcher that starts after a failover (node 0's host back,
// or a new host) asks the others' entries first, and joins the job where it now is instead of
// waiting on node 0's address or opening a job of its own.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cohort/comm/socket.h"
#include "cohort/comm/store.h"

namespace cohort::cli {

struct RendezvousOptions {
  comm::Endpoint master;  // node 0's agent store (port 0 on one node: any free port)
  // --master's further entries: node i's standby store listens at entry i - 1 (an ephemeral
  // port where there is none), where a launcher started later looks for the job.
  std::vector<comm::Endpoint> standbys;
  std::string token;  // the job's
  int node_id = 0;    // --node-rank: this launcher's lasting name; 0 hosts the store
  int min_nodes = 1, max_nodes = 1;
  double last_call = 5;  // seconds to wait for more than MIN
  double timeout = 300;  // seconds to wait for MIN, or to reach node 0's store
};

// What one generation looks like from this launcher.
struct Generation {
  int number = 0;
  int node_rank = 0;         // this launcher's place in the generation
  std::vector<int> members;  // node ids, in node-rank order
  comm::Endpoint store;      // the generation's rank store
  std::string token;         // the generation's rank token
  uint16_t torch_port = 0;   // MASTER_PORT for PyTorch's own TCPStore
  int first_nodes = 1;       // nodes in the job's first generation (its global batch's)
};

// "1,2,5": node ids as the log and the store write them.
std::string join_ids(const std::vector<int>& ids);

class Rendezvous {
 public:
  explicit Rendezvous(RendezvousOptions o);
  ~Rendezvous();

  // Joins generation `number`, or the first later one that still admits this launcher. Node 0
  // starts the generation's rank store (kept until the next join or the end). nullopt when the
  // job finished while this launcher waited to be admitted.
  std::optional<Generation> join(int number);
  // The first failure of the generation wins; returns the one recorded. A rank killed by a
  // signal is also recorded apart: the ranks that fail after it are most likely its peers.
  std::string report_failure(const Generation& g, const std::string& what, bool signaled);
  // Once the generation's ranks have stopped: its cause, the first signaled failure if any,
  // else the first failure ("<unix seconds> <what>"); it waits up to a second for the former.
  std::optional<std::string> cause(const Generation& g);
  // The recorded failure, if any (a short poll of node 0's store; nullopt also when node 0 cannot
  // be reached at the moment).
  std::optional<std::string> failure(const Generation& g);
  // This launcher's ranks all ended well; waits until every member's did, or one failed
  // (returned), or node 0 is gone.
  std::optional<std::string> finish(const Generation& g, double wait_seconds);
  // Node 0, at the end: tells launchers still waiting to be admitted that the job is over.
  void close_job(bool ok, const std::string& why);
  // After join() returned nullopt: "ok", or "failed: <why>".
  const std::string& ended() const { return ended_; }
  bool multi_node() const { return o_.max_nodes > 1; }

 private:
  std::string bind_host() const;
  std::string token_of(int number) const;
  template <typename F>
  auto with_store(const char* what, double seconds, F&& f)
      -> decltype(f(std::declval<comm::Store&>()));
  RendezvousOptions o_;
  // Whether the agent store's launcher is gone and another took over (or this one did).
  bool fail_over();
  // Votes that the leader is lost and returns the last generation's nodes that voted so too.
  std::vector<int> lost_leader_too();
  // A launcher that starts after a failover: the node that leads now and its store, as that
  // store says of itself, asked at the other nodes' --master entries (nullopt: none does).
  std::optional<std::pair<int, comm::Endpoint>> find_leader() const;
  // Writes "leader" = "<id> <host:port>" into this launcher's own store (agent or standby).
  void publish_leader();
  std::unique_ptr<comm::StoreServer> agents_;   // the leader's (node 0 until a failover)
  std::unique_ptr<comm::StoreServer> standby_;  // the others': the agent store after a failover
  std::unique_ptr<comm::StoreServer> ranks_;    // the leader: this generation's
  std::optional<comm::Store> store_;
  comm::Endpoint agents_at_;
  comm::Endpoint standby_at_;
  bool leader_ = false;
  int leader_id_ = 0;
  std::map<int, comm::Endpoint> standbys_;  // node id -> its standby store, from the agent store
  std::vector<int> last_members_;           // the last generation's nodes
  int last_generation_ = -1;                // and its number
  std::string ended_;
  int first_nodes_ = 0;     // the first generation's size
  bool announced_ = false;  // this launcher is in the job's list of nodes
};

}  // namespace cohort::cli
