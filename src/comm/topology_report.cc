// What the communicator tells about itself: describe() (backend, transports, reduction kernels,
// algorithm policy) and the topology report behind `cohort topo`.
#include <map>
#include <set>
#include <sstream>

#include "native_comm.h"
#include "reduce/reduce.h"
#ifdef COHORT_HAVE_UCX
#include "transport/ucx/ucx_transport.h"
#endif

namespace cohort::comm::detail {

std::string NativeComm::topology_report() const {
  const Topology& topo = engine_->topology();
  std::ostringstream o;
  o << describe() << "\n";
  std::map<int, std::vector<int>> by_host;
  for (int r = 0; r < size(); ++r) by_host[topo.host_of_rank[static_cast<size_t>(r)]].push_back(r);
  for (const auto& [h, ranks] : by_host) {
    o << "host " << h << " (" << members_[static_cast<size_t>(ranks.front())].host << "): ranks";
    for (int r : ranks) o << " " << r;
    o << "\n";
  }
  o << "transport from rank " << rank_ << ":";
  for (int p = 0; p < size(); ++p) {
    if (p == rank_) continue;
    const auto& lanes = engine_->lanes(p);
    o << " " << p << "=" << (lanes.empty() ? "none" : lanes[0]->kind());
    if (lanes.size() > 1) o << "x" << lanes.size();
  }
#ifdef COHORT_HAVE_UCX
  const std::vector<std::string> rdma = ucx_rdma_devices();
  o << "\nRDMA devices (UCX):";
  for (const auto& d : rdma) o << " " << d;
  if (rdma.empty()) o << " none";
  if (settings_.ucx_remote) o << " (UCX between hosts)";
#endif
  o << "\nlinks (" << (probed_ ? "measured" : "model defaults") << "): shm " << topo.shm.latency_us
    << " us, " << topo.shm.gbytes_per_s << " GB/s; network " << topo.net.latency_us << " us, "
    << topo.net.gbytes_per_s << " GB/s\n";
  o << "algorithm by size:\n";
  const Collective colls[] = {Collective::allreduce, Collective::broadcast, Collective::reduce,
                              Collective::allgather};
  char line[160];
  std::snprintf(line, sizeof(line), "%12s %14s %14s %14s %14s\n", "bytes", "allreduce", "broadcast",
                "reduce", "allgather");
  o << line;
  for (size_t b = 8; b <= (1ull << 30); b *= 16) {
    std::snprintf(line, sizeof(line), "%12zu", b);
    o << line;
    for (Collective c : colls) {
      auto est = estimate(c, topo, b);
      std::snprintf(line, sizeof(line), " %7s %6.0fus", algo_name(est.front().algo),
                    est.front().us);
      o << line;
    }
    o << "\n";
  }
  return o.str();
}

std::string NativeComm::describe() const {
  std::set<std::string> kinds;
  for (int p = 0; p < size(); ++p) {
    if (!engine_->lanes(p).empty()) kinds.insert(engine_->lanes(p)[0]->kind());
  }
  std::string t;
  for (const auto& k : kinds) t += (t.empty() ? "" : "+") + k;
  if (t.empty()) t = "none";
  return "cohort backend: " + std::to_string(size()) + " ranks on " + std::to_string(num_hosts()) +
         " host(s), transports " + t + ", reduce " + reduce_isa() + ", algorithm " +
         algo_name(settings_.algo);
}

}  // namespace cohort::comm::detail
