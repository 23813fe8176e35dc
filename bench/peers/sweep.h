// The size sweep and report shared by the peer benchmarks, so that their rows line up with
// `cohort bench comm --json` (size in bytes, time_us, busbw in GB/s).
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

struct PeerRow {
  size_t bytes = 0;
  double time_us = 0;
  double busbw = 0;
  std::string algo;                                 // the peer's algorithm that gave time_us
  std::vector<std::pair<std::string, double>> all;  // every algorithm tried: (name, time_us)
};

inline std::vector<size_t> peer_sizes(int argc, char** argv) {
  size_t lo = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 8;
  size_t hi = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : (64u << 20);
  std::vector<size_t> out;
  for (size_t s = lo; s <= hi; s *= 4) out.push_back(s);
  return out;
}

inline void peer_report(const char* name, int world, const std::vector<PeerRow>& rows,
                        const char* json_path) {
  std::printf("# %s allreduce f32 sum, %d ranks\n#%12s %12s %12s %s\n", name, world, "size",
              "time(us)", "busbw(GB/s)", "algo");
  for (auto& r : rows) {
    std::printf("%13zu %12.2f %12.3f %s", r.bytes, r.time_us, r.busbw, r.algo.c_str());
    for (auto& [a, us] : r.all) std::printf("  %s %.2f", a.c_str(), us);
    std::printf("\n");
  }
  if (json_path && *json_path) {
    FILE* f = std::fopen(json_path, "w");
    if (!f) return;
    std::fprintf(f, "{\"peer\": \"%s\", \"world\": %d, \"rows\": [", name, world);
    for (size_t i = 0; i < rows.size(); ++i) {
      std::fprintf(f, "%s{\"size\": %zu, \"time_us\": %.3f, \"busbw\": %.4f, \"algo\": \"%s\"",
                   i ? ", " : "", rows[i].bytes, rows[i].time_us, rows[i].busbw,
                   rows[i].algo.c_str());
      std::fprintf(f, ", \"all\": {");
      for (size_t k = 0; k < rows[i].all.size(); ++k) {
        std::fprintf(f, "%s\"%s\": %.3f", k ? ", " : "", rows[i].all[k].first.c_str(),
                     rows[i].all[k].second);
      }
      std::fprintf(f, "}}");
    }
    std::fprintf(f, "]}\n");
    std::fclose(f);
  }
}

// Enough iterations that small sizes are not dominated by timer and scheduling noise;
// PEER_ITERS overrides (slow peers' latency sweeps).
inline int peer_iters(size_t bytes) {
  if (const char* e = std::getenv("PEER_ITERS")) return std::max(1, std::atoi(e));
  if (bytes < (64u << 10)) return 20000;
  if (bytes < (1u << 20)) return 2000;
  return bytes >= (16u << 20) ? 10 : 30;
}
