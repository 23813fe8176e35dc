// One core's memcpy bandwidth on large buffers: the yardstick for the shared-memory ideal.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

int main() {
  const size_t n = 256u << 20;
  std::vector<char> a(n, 1), b(n, 2);
  double best = 0;
  for (int i = 0; i < 5; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    std::memcpy(b.data(), a.data(), n);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, n / s / 1e9);
  }
  std::printf("%.3f\n", best);
  return b[12345] == 1 ? 0 : 1;
}
