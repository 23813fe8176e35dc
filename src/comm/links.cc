// Link set-up: which transport reaches each peer, and connecting them all (see links.h).
#include "links.h"

#include <cstdio>

#include "cohort/comm/socket.h"
#include "cohort/core/clock.h"
#include "transport/shm/shm_transport.h"
#include "transport/tcp/tcp_transport.h"
#ifdef COHORT_HAVE_UCX
#include "transport/ucx/ucx_transport.h"
#endif

namespace cohort::comm::detail {

namespace {
std::string hex(uint64_t v) {
  char buf[17];
  snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}
}  // namespace

LinkSet connect_links(Store& store, const std::string& token, uint64_t comm_id, int rank,
                      const std::vector<PeerDesc>& members, const Settings& s) {
  const int n = static_cast<int>(members.size());
  LinkSet ls;
  ls.lanes.resize(static_cast<size_t>(n));
  ls.eager.resize(static_cast<size_t>(n));
  if (n == 1) return ls;
  const PeerDesc& me = members[static_cast<size_t>(rank)];
  // Reserve the listener before publishing, so peers never dial a closed port.
  std::unique_ptr<TcpListener> listener;
  std::vector<PeerDesc> tcp_peers, ucx_peers;
  for (int p = 0; p < n; ++p) {
    if (p == rank) continue;
    const PeerDesc& peer = members[static_cast<size_t>(p)];
    if (s.ucx || (s.ucx_remote && peer.host != me.host)) {
      ucx_peers.push_back(peer);
    } else if (s.force_tcp || peer.host != me.host) {
      tcp_peers.push_back(peer);
    }
  }
  // The TCP address is published even without TCP peers of our own, so that later
  // communicators and diagnostics can rely on it.
  const std::string bind_host = s.socket_addr.value_or(local_address_towards(store.host()));
  listener = std::make_unique<TcpListener>(bind_host);
  store.set("tcp/" + std::to_string(rank), listener->address());

  ShmOptions so;
  so.ring_bytes = s.shm_ring;
  so.name_prefix = "/" + shm_job_prefix(token) + "-" + hex(comm_id).substr(0, 8);
  for (int p = 0; p < n; ++p) {
    if (p == rank) continue;
    const PeerDesc& peer = members[static_cast<size_t>(p)];
    if (!s.net_everywhere() && peer.host == me.host) {
      ls.lanes[static_cast<size_t>(p)].push_back(connect_shm(store, so, me, peer));
      // Small messages get a ring of their own: a few KiB that stay in cache, where the bulk
      // ring's lines would come from memory.
      ShmOptions eager = so;
      eager.ring_bytes = 64u << 10;
      eager.name_prefix += "e";
      ls.eager[static_cast<size_t>(p)] = connect_shm(store, eager, me, peer);
    }
  }
  if (!tcp_peers.empty()) {
    TcpOptions to;
    to.streams = s.tcp_streams;
    to.token = token;
    to.comm_id = comm_id;
    to.deadline = Clock::now() + s.timeout;
    auto lanes = connect_tcp_peers(store, *listener, to, me, tcp_peers);
    for (auto& [p, l] : lanes) ls.lanes[static_cast<size_t>(p)] = std::move(l);
  }
#ifdef COHORT_HAVE_UCX
  if (!ucx_peers.empty()) {
    UcxOptions uo;
    uo.token = token;
    uo.comm_id = comm_id;
    uo.deadline = Clock::now() + s.timeout;
    uo.chunk_bytes = s.ucx_chunk;
    uo.chunks = s.ucx_chunks;
    auto links = connect_ucx_peers(store, uo, me, ucx_peers);
    for (auto& [p, l] : links) ls.lanes[static_cast<size_t>(p)].push_back(std::move(l));
  }
#endif
  return ls;
}

}  // namespace cohort::comm::detail
