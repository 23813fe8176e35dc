// The communicator's construction: hosts from the members' host names, links to every peer,
// the engine over them, and the progress thread.
#include "native_comm.h"

#include <map>

#include "cohort/comm/store.h"
#include "cohort/core/hash.h"

namespace cohort::comm::detail {

NativeComm::NativeComm(Store store, std::string token, std::string comm_name, int rank,
                       std::vector<PeerDesc> members, Settings s)
    : store_(std::move(store)),
      token_(std::move(token)),
      name_(std::move(comm_name)),
      comm_id_(fnv1a64(name_)),
      rank_(rank),
      members_(std::move(members)),
      settings_(s) {
  const int n = size();
  Topology topo;
  std::map<std::string, int> host_index;
  topo.world = n;
  for (const auto& m : members_) {
    auto it = host_index.emplace(m.host, static_cast<int>(host_index.size())).first;
    topo.host_of_rank.push_back(it->second);
  }
  topo.num_hosts = static_cast<int>(host_index.size());
  topo.net_everywhere = settings_.net_everywhere();
  LinkSet links = connect_links(store_, token_, comm_id_, rank_, members_, settings_);
  engine_ = std::make_unique<Engine>(rank_, std::move(topo), std::move(links), settings_);
  std::vector<int> global;
  for (const auto& m : members_) global.push_back(m.rank);
  flight_ = std::make_unique<FlightRecorder>(name_, rank_, n, std::move(global), host(),
                                             settings_.flight_dir);
  if (n > 1 && settings_.heartbeat.count() > 0) {
    heartbeat_ = std::make_unique<Heartbeat>(store_, rank_, settings_.heartbeat);
    engine_->set_silence_check([hb = heartbeat_.get(), limit = settings_.heartbeat_timeout](
                                   const std::vector<int>& peers) -> std::string {
      for (int p : peers) {
        const auto silent = hb->silent_for(p);
        if (silent && *silent >= limit) {
          return "rank " + std::to_string(p) + " has sent no heartbeat for " +
                 std::to_string(silent->count() / 1000) +
                 " s while this rank waits on it: it is stopped or frozen (SIGSTOP, a debugger, "
                 "a hung host; COHORT_HEARTBEAT_TIMEOUT)";
        }
      }
      return {};
    });
  }
  engine_->set_wait_observer([f = flight_.get(), hb = heartbeat_.get()](const std::vector<int>& p) {
    f->waiting_on(p);
    if (hb) hb->watch(p);
  });
  // Callers run queued work themselves (no thread hand-off) when every rank of this host can
  // have a core; with more ranks than cores, a thread that spins on behalf of a caller costs
  // the ranks that would make progress, so the progress thread alone runs the queue.
  callers_run_ = local_size() <= static_cast<int>(std::thread::hardware_concurrency()) &&
                 settings_.caller_runs;
  send_seq_.assign(static_cast<size_t>(n), 0);
  recv_seq_.assign(static_cast<size_t>(n), 0);
  thread_ = std::thread([this] { progress_loop(); });
}

void NativeComm::keep_alive(std::unique_ptr<StoreServer> server) {
  server_ = std::move(server);
}

}  // namespace cohort::comm::detail
