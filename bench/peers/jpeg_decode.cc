// Decode alone, one thread: libjpeg-turbo's own API against Cohort's decoder on the same files
// held in memory. usage: jpeg_decode FOLDER [SECONDS]
#include <turbojpeg.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <vector>

#include "cohort/data/image.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: jpeg_decode FOLDER [SECONDS]\n");
    return 2;
  }
  const double budget = argc > 2 ? std::atof(argv[2]) : 3.0;
  std::vector<std::vector<uint8_t>> files;
  for (const auto& e : std::filesystem::recursive_directory_iterator(argv[1])) {
    if (e.is_regular_file() && e.path().extension() == ".jpg") {
      files.push_back(cohort::data::read_file(e.path().string()));
    }
  }
  if (files.empty()) return 2;
  using C = std::chrono::steady_clock;
  auto rate = [&](auto&& one) {
    size_t n = 0;
    auto t0 = C::now();
    while (std::chrono::duration<double>(C::now() - t0).count() < budget)
      one(files[n++ % files.size()]);
    return n / std::chrono::duration<double>(C::now() - t0).count();
  };
  tjhandle h = tjInitDecompress();
  std::vector<uint8_t> out;
  double raw = rate([&](const std::vector<uint8_t>& f) {
    int w, hh, sub, cs;
    tjDecompressHeader3(h, f.data(), f.size(), &w, &hh, &sub, &cs);
    out.resize(static_cast<size_t>(w) * hh * 3);
    tjDecompress2(h, f.data(), f.size(), out.data(), w, 0, hh, TJPF_RGB, TJFLAG_FASTDCT);
  });
  double ours = rate([&](const std::vector<uint8_t>& f) { cohort::data::decode(f, "bench", 8); });
  tjDestroy(h);
  std::printf(
      "jpeg decode, one thread, %zu files: libjpeg-turbo %.1f images/s, cohort %.1f images/s, "
      "ratio %.3f\n",
      files.size(), raw, ours, ours / raw);
  return 0;
}
