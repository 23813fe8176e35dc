// The link probe (COHORT_PROBE=1): a short, bounded measurement of latency and bandwidth over
// shared memory and the network, shared by rank 0 so that every rank's cost model agrees.
#include "native_comm.h"

namespace cohort::comm::detail {

void NativeComm::probe_links() {
  // A short, bounded probe on the world's first pairs: ping-pong for latency, a few 4 MiB
  // transfers for bandwidth. Rank 0 then shares the figures so every rank models the same.
  const Topology& topo = engine_->topology();
  double fig[4] = {topo.shm.latency_us, topo.shm.gbytes_per_s, topo.net.latency_us,
                   topo.net.gbytes_per_s};
  auto measure = [&](int a, int b, double* lat_us, double* gbps) {
    if (rank_ != a && rank_ != b) return;
    const int peer = rank_ == a ? b : a;
    std::vector<uint8_t> small(8), big(4u << 20);
    auto t0 = Clock::now();
    const int pings = 200;
    for (int i = 0; i < pings; ++i) {
      if (rank_ == a) {
        send(small.data(), 8, DataType::u8, peer).wait();
        recv(small.data(), 8, DataType::u8, peer).wait();
      } else {
        recv(small.data(), 8, DataType::u8, peer).wait();
        send(small.data(), 8, DataType::u8, peer).wait();
      }
    }
    *lat_us = seconds_since(t0) * 1e6 / (2 * pings);
    t0 = Clock::now();
    const int reps = 4;
    for (int i = 0; i < reps; ++i) {
      if (rank_ == a) {
        send(big.data(), big.size(), DataType::u8, peer).wait();
      } else {
        recv(big.data(), big.size(), DataType::u8, peer).wait();
      }
    }
    if (rank_ == a) recv(small.data(), 1, DataType::u8, peer).wait();
    if (rank_ == b) send(small.data(), 1, DataType::u8, peer).wait();
    *gbps = static_cast<double>(big.size()) * reps / seconds_since(t0) / 1e9;
  };
  // Shared memory: the first two ranks of rank 0's host. Network: rank 0 and the first rank
  // elsewhere (or rank 1 when TCP is forced). Rank 0 measures both, then shares them.
  const Group& lg = engine_->local();
  const bool on_first_host = topo.host_of_rank[static_cast<size_t>(rank_)] == topo.host_of_rank[0];
  if (on_first_host && lg.size() > 1 && !settings_.net_everywhere())
    measure(lg.at(0), lg.at(1), &fig[0], &fig[1]);
  int other = -1;
  for (int r = 1; r < size() && other < 0; ++r) {
    if (settings_.net_everywhere() ||
        topo.host_of_rank[static_cast<size_t>(r)] != topo.host_of_rank[0])
      other = r;
  }
  if (other > 0) measure(0, other, &fig[2], &fig[3]);
  broadcast(fig, fig, 4, DataType::f64, 0, CollOptions{}).wait();
  engine_->set_link_figures(LinkModel{fig[0], fig[1]}, LinkModel{fig[2], fig[3]});
  choices_.clear();  // the cost model's choices change with the figures
  probed_ = true;
}

}  // namespace cohort::comm::detail
