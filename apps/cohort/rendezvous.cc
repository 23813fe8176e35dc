// The launchers' rendezvous across nodes and generations (see rendezvous.h). Keys in the leader's
// agent store:
//   open            the newest generation the leader has opened
//   g<N>/joined     the node ids that asked to join N, comma-separated (appended by compare_set)
//   g<N>/layout     "<rank store port> <torch port> <id>,<id>,... <first generation's nodes>"
//                   once N has formed
//   g<N>/failed     "<unix seconds> <what>": the generation's first failure
//   g<N>/done       how many members' ranks all ended well
//   ended           "ok" or "failed: <why>": the job is over (for launchers still waiting)
//   nodes           every launcher other than the leader's that ever came, comma-separated
//   seen/<id>       node <id>'s launcher knows the job is over and leaves
//   standby/<id>    "<host>:<port>" of node <id>'s standby store
// And in every launcher's own store, agent or standby:
//   leader          "<id> <host>:<port>": the node that leads, as this launcher knows it, and
//                   its agent store (the active one names itself)
//   lost/<id>       "<generation>": this launcher's vote that node <id>'s store is silent, cast
//                   in that generation (an older vote does not count)
#include "rendezvous.h"

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <thread>

#include "cohort/core/clock.h"
#include "cohort/core/error.h"

namespace cohort::cli {

namespace {

using Millis = std::chrono::milliseconds;
constexpr Millis kCall{5000};   // one store call; a longer silence reconnects
constexpr double kLinger = 15;  // seconds the leader waits, at the end, for launchers to read it
constexpr Millis kSignaledWait{1000};  // for another node's report of a rank killed by a signal

std::vector<int> parse_ids(const std::string& s) {
  std::vector<int> ids;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty()) ids.push_back(std::stoi(item));
  }
  return ids;
}

}  // namespace

std::string join_ids(const std::vector<int>& ids) {
  std::string s;
  for (int id : ids) s += (s.empty() ? "" : ",") + std::to_string(id);
  return s;
}

namespace {

bool loopback(const std::string& host) {
  return host.rfind("127.", 0) == 0 || host == "localhost";
}

void nap() {
  std::this_thread::sleep_for(Millis(50));
}

// Adds `id` to the comma-separated list at `key`, once, however many launchers add at once.
void append_id(comm::Store& s, const std::string& key, int id) {
  std::string have = s.get_for(key, Millis(0)).value_or("");
  while (true) {
    const std::vector<int> ids = parse_ids(have);
    if (std::find(ids.begin(), ids.end(), id) != ids.end()) return;
    const std::string want = have.empty() ? std::to_string(id) : have + "," + std::to_string(id);
    const std::string now = s.compare_set(key, have, want);
    if (now == want) return;
    have = now;
  }
}

}  // namespace

Rendezvous::Rendezvous(RendezvousOptions o) : o_(std::move(o)) {
  COHORT_CHECK(o_.min_nodes >= 1 && o_.min_nodes <= o_.max_nodes,
               "--nnodes " << o_.min_nodes << ":" << o_.max_nodes << ": MIN must be 1..MAX");
  if (!multi_node()) return;
  agents_at_ = o_.master;
  leader_ = o_.node_id == 0;
  // Started after a failover: the job is elsewhere now (node 0 itself then joins as another).
  if (auto found = find_leader()) {
    std::fprintf(stderr,
                 "cohort launch: node %d: the job's rendezvous is at node %d (%s) since a "
                 "failover; joining it there\n",
                 o_.node_id, found->first, found->second.str().c_str());
    leader_ = false;
    leader_id_ = found->first;
    agents_at_ = found->second;
  }
  if (leader_) {
    agents_ = std::make_unique<comm::StoreServer>(bind_host(), o_.master.port, o_.token);
    agents_at_.port = agents_->port();
  } else {
    // Node i's standby at its --master entry, where later launchers look; else any port.
    const size_t k = static_cast<size_t>(o_.node_id);
    const comm::Endpoint* mine = k == 0                    ? &o_.master
                                 : k <= o_.standbys.size() ? &o_.standbys[k - 1]
                                                           : nullptr;
    standby_ = std::make_unique<comm::StoreServer>(bind_host(), mine ? mine->port : 0, o_.token);
    standby_at_ = {mine                       ? mine->host
                   : loopback(o_.master.host) ? o_.master.host
                                              : comm::local_address_towards(o_.master.host),
                   standby_->port()};
  }
  publish_leader();
}

std::optional<std::pair<int, comm::Endpoint>> Rendezvous::find_leader() const {
  std::vector<std::pair<int, comm::Endpoint>> entries;
  for (size_t i = 0; i < o_.standbys.size(); ++i)
    entries.push_back({static_cast<int>(i) + 1, o_.standbys[i]});
  if (o_.node_id != 0 && !entries.empty()) entries.insert(entries.begin(), {0, o_.master});
  for (const auto& [id, at] : entries) {
    if (id == o_.node_id) continue;
    try {
      if (comm::probe_tcp(at, Millis(500)) != comm::Reach::open) continue;
      comm::Store s(at, o_.token, Millis(2000));
      const auto v = s.get_for("leader", Millis(0));
      if (!v) continue;
      std::stringstream in(*v);
      int leader = -1;
      std::string where;
      in >> leader >> where;
      // Only a store that names itself leads (a standby's word may be out of date); node 0
      // leading is the ordinary case, at --master already.
      if (leader == id && leader != 0) return std::make_pair(leader, at);
    } catch (const Error&) {  // not there yet, another job's token, a name that does not resolve
    }
  }
  return std::nullopt;
}

void Rendezvous::publish_leader() {
  const comm::Endpoint own = leader_ ? agents_at_ : standby_at_;
  try {
    comm::Store s(own, o_.token, kCall);
    s.set("leader", std::to_string(leader_id_) + " " + agents_at_.str());
  } catch (const Error& e) {  // its own store: not expected to fail, and not worth a job
    std::fprintf(stderr, "cohort launch: node %d: cannot write to its own store at %s: %s\n",
                 o_.node_id, own.str().c_str(), e.message().c_str());
  }
}

bool Rendezvous::fail_over() {
  auto reach = [](const comm::Endpoint& ep) {
    try {
      return comm::probe_tcp(ep, Millis(1000));
    } catch (const Error&) {  // a name that does not resolve (for now)
      return comm::Reach::silent;
    }
  };
  if (leader_ || !standby_) return false;
  const comm::Reach leader_reach = reach(agents_at_);
  if (leader_reach == comm::Reach::open) return false;
  std::vector<int> candidates = last_members_;
  std::string why = "its rendezvous store at " + agents_at_.str() + " refuses connections";
  if (leader_reach == comm::Reach::silent) {
    // Silence: a dead host or a cut link, which no node can tell apart alone. The leader is
    // replaced only by a majority of the last generation's nodes that all lose it and reach each
    // other; the leader, cut off, finds itself in the minority and stops (see join). With 2
    // nodes no majority exists without the leader.
    candidates = lost_leader_too();
    if (candidates.size() * 2 <= last_members_.size()) return false;
    why = "its rendezvous store at " + agents_at_.str() + " is silent, and " +
          std::to_string(candidates.size()) + " of the last generation's " +
          std::to_string(last_members_.size()) + " nodes (" + join_ids(candidates) +
          ") cannot reach it: a majority";
  }
  std::sort(candidates.begin(), candidates.end());
  for (int id : candidates) {
    if (id == leader_id_) continue;
    if (id == o_.node_id) {
      std::fprintf(stderr,
                   "cohort launch: node %d: node %d's launcher is gone (%s); this node hosts the "
                   "rendezvous now, at %s\n",
                   o_.node_id, leader_id_, why.c_str(), standby_at_.str().c_str());
      agents_ = std::move(standby_);
      agents_at_ = standby_at_;
    } else {
      auto it = standbys_.find(id);
      if (it == standbys_.end() || reach(it->second) != comm::Reach::open) {
        continue;  // gone too, or never published one
      }
      std::fprintf(stderr,
                   "cohort launch: node %d: node %d's launcher is gone (%s); node %d hosts the "
                   "rendezvous now, at %s\n",
                   o_.node_id, leader_id_, why.c_str(), id, it->second.str().c_str());
      agents_at_ = it->second;
    }
    leader_ = id == o_.node_id;
    leader_id_ = id;
    store_.reset();
    announced_ = false;
    publish_leader();
    return true;
  }
  return false;
}

// This node's vote that the leader is lost, in its own standby store, and the nodes of the last
// generation whose standby stores answer and hold the same vote (this one included).
std::vector<int> Rendezvous::lost_leader_too() {
  const std::string key = "lost/" + std::to_string(leader_id_);
  const std::string vote = std::to_string(last_generation_);
  std::vector<int> agree;
  try {
    comm::Store own(standby_at_, o_.token, kCall);
    own.set(key, vote);
    agree.push_back(o_.node_id);
  } catch (const Error&) {  // its own store: not expected to fail; then it has no vote
    return agree;
  }
  for (int id : last_members_) {
    if (id == o_.node_id || id == leader_id_) continue;
    auto it = standbys_.find(id);
    if (it == standbys_.end()) continue;
    try {
      if (comm::probe_tcp(it->second, Millis(500)) != comm::Reach::open) continue;
      comm::Store peer(it->second, o_.token, Millis(2000));
      if (peer.get_for(key, Millis(0)) == vote) agree.push_back(id);
    } catch (const Error&) {  // unreachable from here: no vote this node can count
    }
  }
  return agree;
}

Rendezvous::~Rendezvous() = default;

// Where stores bind: the loopback address node 0 was given, or every interface.
std::string Rendezvous::bind_host() const {
  return loopback(o_.master.host) ? o_.master.host : "0.0.0.0";
}

// Generation 0 keeps the job's token; each later one has its own, so that stragglers of an older
// generation are refused.
std::string Rendezvous::token_of(int number) const {
  return number == 0 ? o_.token : "g" + std::to_string(number) + "x" + o_.token;
}

// Runs f on the agent store, reconnecting after an error (and moving to another node's after a
// failover), for up to `seconds`.
template <typename F>
auto Rendezvous::with_store(const char* what, double seconds, F&& f)
    -> decltype(f(std::declval<comm::Store&>())) {
  const auto start = Clock::now();
  std::string last;
  while (true) {
    try {
      if (!store_) store_.emplace(agents_at_, o_.token, kCall);
      return f(*store_);
    } catch (const CommError& e) {
      store_.reset();
      last = e.message();
      if (fail_over()) continue;
    }
    if (seconds_since(start) >= seconds) {
      COHORT_THROW_AS(CommError, "cohort launch (node "
                                     << o_.node_id << "): " << what << ": node " << leader_id_
                                     << "'s rendezvous store at " << agents_at_.str()
                                     << " cannot be reached for " << seconds << " s: " << last);
    }
    std::this_thread::sleep_for(Millis(200));
  }
}

std::optional<Generation> Rendezvous::join(int number) {
  Generation g;
  ranks_.reset();  // the previous generation's rank store: its stragglers are refused
  if (!multi_node()) {
    g.number = number;
    g.members = {0};
    g.token = token_of(number);
    ranks_ = std::make_unique<comm::StoreServer>(bind_host(), o_.master.port, g.token);
    g.store = {o_.master.host, ranks_->port()};
    g.torch_port = comm::local_port(comm::listen_tcp(o_.master.host, 0));
    return g;
  }
  const std::string me = std::to_string(o_.node_id);
  const auto started = Clock::now();
  while (true) {
    // So that the leader waits for this launcher at the end, and knows its standby store.
    if (!leader_ && !announced_) {
      with_store("joining", o_.timeout, [&](comm::Store& s) {
        append_id(s, "nodes", o_.node_id);
        s.set("standby/" + me, standby_at_.str());
        return 0;
      });
      announced_ = !leader_;  // a failover meanwhile may have made this launcher the leader
    }
    const std::string key = "g" + std::to_string(number) + "/";
    if (leader_) {
      with_store("opening a generation", o_.timeout, [&](comm::Store& s) {
        s.set(key + "joined", me);  // before "open": a launcher that sees it may append
        s.set("open", std::to_string(number));
        return 0;
      });
      // Wait for MAX, or for MIN and then `last_call` seconds without reaching MAX.
      std::vector<int> ids;
      Clock::time_point min_at{};
      bool have_min = false;
      while (true) {
        ids = parse_ids(with_store("forming a generation", o_.timeout, [&](comm::Store& s) {
          return s.get_for(key + "joined", Millis(0)).value_or("");
        }));
        const int n = static_cast<int>(ids.size());
        // After a generation of 3 or more nodes, only a majority of them goes on: a leader cut
        // off from the others must not train on beside the new leader they chose (fail_over).
        const bool minority =
            last_members_.size() >= 3 && static_cast<size_t>(n) * 2 <= last_members_.size();
        if (minority && seconds_since(started) > o_.timeout) {
          COHORT_THROW("cohort launch: generation "
                       << number << ": this node (" << o_.node_id << ") leads, but only " << n
                       << " of the last generation's " << last_members_.size() << " nodes ("
                       << join_ids(last_members_) << ") joined within " << o_.timeout
                       << " s (node ids " << join_ids(ids)
                       << "): a minority does not go on, since the others may have chosen "
                          "another leader");
        }
        if (minority) {
          nap();
          continue;
        }
        if (n >= o_.max_nodes) break;
        if (n >= o_.min_nodes && !have_min) have_min = true, min_at = Clock::now();
        if (have_min && seconds_since(min_at) >= o_.last_call) break;
        if (!have_min && seconds_since(started) > o_.timeout) {
          COHORT_THROW("cohort launch: generation "
                       << number << " needs " << o_.min_nodes << " node(s); only " << n
                       << " joined within " << o_.timeout << " s (node ids " << join_ids(ids)
                       << ")");
        }
        nap();
      }
      std::sort(ids.begin(), ids.end());
      if (static_cast<int>(ids.size()) > o_.max_nodes)
        ids.resize(static_cast<size_t>(o_.max_nodes));
      g.number = number;
      g.members = ids;
      last_members_ = ids;
      last_generation_ = number;
      if (first_nodes_ == 0) first_nodes_ = static_cast<int>(ids.size());
      g.first_nodes = first_nodes_;
      g.token = token_of(number);
      ranks_ = std::make_unique<comm::StoreServer>(bind_host(), 0, g.token);
      g.store = {agents_at_.host, ranks_->port()};
      // Torch's TCPStore port: the first node's rank 0 binds it, the others only need to agree on
      // it.
      g.torch_port = comm::local_port(comm::listen_tcp(bind_host(), 0));
      const std::string layout = std::to_string(g.store.port) + " " + std::to_string(g.torch_port) +
                                 " " + join_ids(ids) + " " + std::to_string(g.first_nodes);
      with_store("publishing a generation", o_.timeout, [&](comm::Store& s) {
        s.set(key + "layout", layout);
        return 0;
      });
      g.node_rank = static_cast<int>(std::find(ids.begin(), ids.end(), o_.node_id) - ids.begin());
      return g;
    }

    // Another node: find the generation that is open, ask to join it, read its layout.
    enum class Next { wait, retry, joined };
    std::string layout;
    const Next next = with_store("joining", o_.timeout, [&](comm::Store& s) {
      if (s.get_for("ended", Millis(0))) {  // handled below
        s.set("seen/" + me, "1");
        return Next::wait;
      }
      const int open = std::stoi(s.get_for("open", Millis(0)).value_or("-1"));
      if (open < number) return Next::retry;  // the leader is still ending the previous one
      if (open > number) number = open;
      const std::string k = "g" + std::to_string(number) + "/";
      if (s.get_for(k + "layout", Millis(0))) {  // formed without this node: the next one
        ++number;
        return Next::retry;
      }
      append_id(s, k + "joined", o_.node_id);
      // Wait for the layout; the job may also end meanwhile.
      while (true) {
        if (auto l = s.get_for(k + "layout", Millis(200))) {
          layout = *l;
          return Next::joined;
        }
        if (s.get_for("ended", Millis(0))) {
          s.set("seen/" + me, "1");
          return Next::wait;
        }
      }
    });
    if (next == Next::wait) {
      ended_ = with_store("reading the end", o_.timeout, [&](comm::Store& s) {
        return s.get_for("ended", Millis(0)).value_or("");
      });
      return std::nullopt;
    }
    if (next == Next::retry) {
      std::this_thread::sleep_for(Millis(200));
      continue;
    }
    std::stringstream in(layout);
    int port = 0, torch = 0;
    std::string ids;
    in >> port >> torch >> ids >> g.first_nodes;
    g.members = parse_ids(ids);
    auto at = std::find(g.members.begin(), g.members.end(), o_.node_id);
    if (at == g.members.end()) {  // joined as the generation closed: the next one
      ++number;
      continue;
    }
    g.number = number;
    g.node_rank = static_cast<int>(at - g.members.begin());
    g.token = token_of(number);
    g.store = {agents_at_.host, static_cast<uint16_t>(port)};
    g.torch_port = static_cast<uint16_t>(torch);
    last_members_ = g.members;
    last_generation_ = number;
    first_nodes_ = g.first_nodes;
    // The others' standby stores, for a failover (a failure to read them is not one).
    try {
      with_store("reading the standby stores", 5, [&](comm::Store& s) {
        for (int id : g.members) {
          if (id == o_.node_id || id == leader_id_) continue;
          if (auto v = s.get_for("standby/" + std::to_string(id), Millis(0))) {
            standbys_[id] = comm::parse_endpoint(*v, 0);
          }
        }
        return 0;
      });
    } catch (const CommError&) {
    }
    return g;
  }
}

std::string Rendezvous::report_failure(const Generation& g, const std::string& what,
                                       bool signaled) {
  const std::string value = std::to_string(unix_seconds()) + " " + what;
  if (!multi_node()) return value;
  const std::string key = "g" + std::to_string(g.number) + "/";
  try {
    return with_store("reporting a failure", 10, [&](comm::Store& s) {
      if (signaled) s.compare_set(key + "signaled", "", value);
      return s.compare_set(key + "failed", "", value);
    });
  } catch (const CommError&) {
    return value;  // the leader is out of reach: the other nodes' ranks fail by themselves
  }
}

std::optional<std::string> Rendezvous::failure(const Generation& g) {
  if (!multi_node()) return std::nullopt;
  try {
    if (!store_) store_.emplace(agents_at_, o_.token, kCall);
    return store_->get_for("g" + std::to_string(g.number) + "/failed", Millis(0));
  } catch (const CommError&) {
    store_.reset();
    return std::nullopt;
  }
}

std::optional<std::string> Rendezvous::cause(const Generation& g) {
  if (!multi_node()) return std::nullopt;
  const std::string key = "g" + std::to_string(g.number) + "/";
  try {
    // A rank killed on another node makes this node's ranks fail first, often before that
    // node's launcher has seen it (a 50 ms poll away): give its report up to a second.
    return with_store("reading the failure", 10, [&](comm::Store& s) {
      auto v = s.get_for(key + "signaled", kSignaledWait);
      return v ? v : s.get_for(key + "failed", Millis(0));
    });
  } catch (const CommError&) {
    return std::nullopt;
  }
}

std::optional<std::string> Rendezvous::finish(const Generation& g, double wait_seconds) {
  if (!multi_node()) return std::nullopt;
  const std::string key = "g" + std::to_string(g.number) + "/";
  const int64_t n = static_cast<int64_t>(g.members.size());
  with_store("reporting the end", o_.timeout,
             [&](comm::Store& s) { return s.add(key + "done", 1); });
  const auto start = Clock::now();
  while (true) {
    const int64_t done = with_store("waiting for the end", o_.timeout,
                                    [&](comm::Store& s) { return s.add(key + "done", 0); });
    if (done >= n) break;
    if (auto f = failure(g)) return f;
    if (seconds_since(start) > wait_seconds) {
      return std::to_string(unix_seconds()) + " only " + std::to_string(done) + " of " +
             std::to_string(n) + " nodes' ranks ended within " +
             std::to_string(static_cast<int>(wait_seconds)) + " s of this node's";
    }
    nap();
  }
  return std::nullopt;
}

void Rendezvous::close_job(bool ok, const std::string& why) {
  if (!multi_node()) return;
  try {
    if (!leader_) {
      with_store("leaving", 5, [&](comm::Store& s) {
        s.set("seen/" + std::to_string(o_.node_id), "1");
        return 0;
      });
      return;
    }
    with_store("ending the job", 5, [&](comm::Store& s) {
      s.set("ended", ok ? "ok" : "failed: " + why);
      return 0;
    });
    // The leader keeps the store up, for up to kLinger, until every launcher the job has known has
    // read the end: one cut off for a while retries its store calls and still learns it.
    const auto t0 = Clock::now();
    const std::vector<int> known = parse_ids(with_store("ending the job", 5, [&](comm::Store& s) {
      return s.get_for("nodes", Millis(0)).value_or("");
    }));
    for (int id : known) {
      if (id == o_.node_id) continue;  // (a leader since a failover was once one of them)
      while (seconds_since(t0) < kLinger &&
             !with_store("waiting for the others to leave", 5, [&](comm::Store& s) {
               return s.get_for("seen/" + std::to_string(id), Millis(0)).has_value();
             })) {
        nap();
      }
    }
  } catch (const CommError&) {
  }
}

}  // namespace cohort::cli
