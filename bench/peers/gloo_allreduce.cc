// Gloo's allreduce over TCP on the same sizes, at its strongest: every algorithm Gloo offers is
// timed per size (the classic AllreduceRing, AllreduceRingChunked, AllreduceHalvingDoubling, and
// the newer gloo::allreduce with its ring and bcube algorithms) and the fastest is reported, named.
// Ranks come from RANK/WORLD_SIZE (run it under `cohort launch`); they meet through a FileStore
// in $GLOO_STORE_DIR.
// usage: peer_gloo_allreduce [MIN_BYTES MAX_BYTES JSON]
#include <gloo/allreduce.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/barrier_all_to_one.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "sweep.h"

namespace {

// One algorithm, ready to run on a buffer of `count` floats.
struct Candidate {
  std::string name;
  std::function<void()> run;
};

std::vector<Candidate> candidates(const std::shared_ptr<gloo::Context>& ctx, float* buf,
                                  size_t count, uint32_t tag_base) {
  std::vector<Candidate> c;
  const int n = static_cast<int>(count);
  auto ring = std::make_shared<gloo::AllreduceRing<float>>(ctx, std::vector<float*>{buf}, n);
  c.push_back({"ring", [ring] { ring->run(); }});
  auto chunked =
      std::make_shared<gloo::AllreduceRingChunked<float>>(ctx, std::vector<float*>{buf}, n);
  c.push_back({"ring_chunked", [chunked] { chunked->run(); }});
  auto hd =
      std::make_shared<gloo::AllreduceHalvingDoubling<float>>(ctx, std::vector<float*>{buf}, n);
  c.push_back({"halving_doubling", [hd] { hd->run(); }});
  using Algo = gloo::AllreduceOptions::Algorithm;
  const std::pair<const char*, Algo> modern[] = {{"allreduce_ring", Algo::RING},
                                                 {"allreduce_bcube", Algo::BCUBE}};
  uint32_t tag = tag_base;
  for (const auto& [name, algo] : modern) {
    const uint32_t t = tag++;
    c.push_back(
        {name, [ctx, buf, count, algo = algo, t] {
           gloo::AllreduceOptions o(ctx);
           o.setAlgorithm(algo);
           o.setOutput(buf, count);
           o.setReduceFunction(
               static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
           o.setTag(t);
           gloo::allreduce(o);
         }});
  }
  return c;
}

}  // namespace

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
  gloo::BarrierAllToOne barrier(ctx);
  std::vector<PeerRow> rows;
  uint32_t tag = 100;
  for (size_t bytes : peer_sizes(argc, argv)) {
    const size_t count = std::max<size_t>(bytes / 4, 1);
    std::vector<float> buf(count, 1.0f);
    const int iters = peer_iters(bytes);
    PeerRow best;
    best.bytes = bytes;
    for (Candidate& cand : candidates(ctx, buf.data(), count, tag)) {
      for (int i = 0; i < std::min(iters, 100) / 10 + 1; ++i) cand.run();
      barrier.run();
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i) cand.run();
      double us = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() *
                  1e6 / iters;
      std::vector<double> t{us};
      gloo::AllreduceRing<double> avg(ctx, {t.data()}, 1);
      avg.run();
      us = t[0] / n;
      if (best.time_us == 0 || us < best.time_us) {
        best.time_us = us;
        best.algo = cand.name;
      }
      best.all.emplace_back(cand.name, us);
    }
    tag += 16;
    best.busbw = static_cast<double>(bytes) / (best.time_us * 1e3) * 2.0 * (n - 1) / n;
    rows.push_back(best);
  }
  if (rank == 0) peer_report("gloo-best-tcp", n, rows, argc > 3 ? argv[3] : nullptr);
  return 0;
}
