// Gloo's ring allreduce over TCP on the same sizes. Ranks come from RANK/WORLD_SIZE (run it
// under `cohort launch`); they meet through a FileStore in $GLOO_STORE_DIR.
// usage: peer_gloo_allreduce [MIN_BYTES MAX_BYTES JSON]
#include <gloo/allreduce_ring.h>
#include <gloo/barrier_all_to_one.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "sweep.h"

int main(int argc, char** argv) {
  const int rank = std::atoi(std::getenv("RANK"));
  const int n = std::atoi(std::getenv("WORLD_SIZE"));
  const char* dir = std::getenv("GLOO_STORE_DIR");
  if (!dir) {
    std::fprintf(stderr, "set GLOO_STORE_DIR to a folder shared by the ranks\n");
    return 2;
  }
  gloo::transport::tcp::attr attr;
  const char* host = std::getenv("GLOO_HOST");  // this rank's address (emulated clusters)
  attr.hostname = host ? host : "127.0.0.1";
  auto dev = gloo::transport::tcp::CreateDevice(attr);
  gloo::rendezvous::FileStore store(dir);
  auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, n);
  ctx->connectFullMesh(store, dev);
  std::vector<PeerRow> rows;
  for (size_t bytes : peer_sizes(argc, argv)) {
    size_t count = bytes / 4;
    std::vector<float> buf(count, 1.0f);
    gloo::AllreduceRing<float> ar(ctx, {buf.data()}, static_cast<int>(count));
    gloo::BarrierAllToOne barrier(ctx);
    int iters = peer_iters(bytes);
    for (int i = 0; i < std::min(iters, 100); ++i) ar.run();
    barrier.run();
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) ar.run();
    double us =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() * 1e6 / iters;
    std::vector<double> t{us};
    gloo::AllreduceRing<double> avg(ctx, {t.data()}, 1);
    avg.run();
    us = t[0] / n;
    rows.push_back({bytes, us, static_cast<double>(bytes) / (us * 1e3) * 2.0 * (n - 1) / n});
  }
  if (rank == 0) peer_report("gloo-ring-tcp", n, rows, argc > 3 ? argv[3] : nullptr);
  return 0;
}
