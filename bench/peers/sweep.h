// The size sweep and report shared by the peer benchmarks, so that their rows line up with
// `cohort bench comm --json` (size in bytes, time_us, busbw in GB/s).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

struct PeerRow {
  size_t bytes;
  double time_us;
  double busbw;
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
  std::printf("# %s allreduce f32 sum, %d ranks\n#%12s %12s %12s\n", name, world, "size",
              "time(us)", "busbw(GB/s)");
  for (auto& r : rows) std::printf("%13zu %12.2f %12.3f\n", r.bytes, r.time_us, r.busbw);
  if (json_path && *json_path) {
    FILE* f = std::fopen(json_path, "w");
    if (!f) return;
    std::fprintf(f, "{\"peer\": \"%s\", \"world\": %d, \"rows\": [", name, world);
    for (size_t i = 0; i < rows.size(); ++i) {
      std::fprintf(f, "%s{\"size\": %zu, \"time_us\": %.3f, \"busbw\": %.4f}", i ? ", " : "",
                   rows[i].bytes, rows[i].time_us, rows[i].busbw);
    }
    std::fprintf(f, "]}\n");
    std::fclose(f);
  }
}

// Enough iterations that small sizes are not dominated by timer and scheduling noise.
inline int peer_iters(size_t bytes) {
  if (bytes < (64u << 10)) return 20000;
  if (bytes < (1u << 20)) return 2000;
  return bytes >= (16u << 20) ? 10 : 30;
}
