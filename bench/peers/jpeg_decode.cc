// Decode alone, one thread: libjpeg-turbo's own API against Cohort's decoder on the same files
// held in memory, with the fast and the accurate inverse DCT; and the accuracy of what the
// pipeline decodes: the whole image decoded as the pipeline would (DCT-domain downscaling as far
// as it keeps SIZE pixels: 5/8 for 500x375 to 224), resized to SIZE, against an exact decode
// (full size, accurate IDCT) resized the same way, as PSNR (null in JSON where identical).
// usage: jpeg_decode FOLDER [SECONDS] [SIZE] [JSON]
#include <turbojpeg.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "cohort/data/image.h"
#include "cohort/data/ops.h"

namespace {

using namespace cohort::data;

std::vector<float> crop_resized(const std::vector<uint8_t>& f, int size, Idct idct, bool scaled) {
  const ImageInfo info = probe(f, "bench");
  const double cw = info.width, ch = info.height;
  const CropBox box{(info.width - cw) / 2, (info.height - ch) / 2, cw, ch};
  const int eighths = scaled ? jpeg_scale_for(static_cast<int>(cw), static_cast<int>(ch), size) : 8;
  const Image img = decode(f, "bench", eighths, idct);
  const double sx = static_cast<double>(img.width) / info.width;
  const double sy = static_cast<double>(img.height) / info.height;
  std::vector<float> out(static_cast<size_t>(size) * size * img.channels);
  resize_crop(img, CropBox{box.x * sx, box.y * sy, box.w * sx, box.h * sy}, size, size, out.data());
  return out;
}

double psnr(const std::vector<float>& a, const std::vector<float>& b) {
  double mse = 0;
  for (size_t i = 0; i < a.size(); ++i) mse += (a[i] - b[i]) * (a[i] - b[i]);
  mse /= static_cast<double>(a.size());
  return mse == 0 ? INFINITY : 10 * std::log10(255.0 * 255.0 / mse);
}

std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  char b[32];
  std::snprintf(b, sizeof(b), "%.3f", v);
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: jpeg_decode FOLDER [SECONDS] [SIZE] [JSON]\n");
    return 2;
  }
  const double budget = argc > 2 ? std::atof(argv[2]) : 3.0;
  const int size = argc > 3 ? std::atoi(argv[3]) : 224;
  std::vector<std::vector<uint8_t>> files;
  for (const auto& e : std::filesystem::recursive_directory_iterator(argv[1])) {
    if (e.is_regular_file() && e.path().extension() == ".jpg")
      files.push_back(read_file(e.path().string()));
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
  double fast = rate([&](const std::vector<uint8_t>& f) { decode(f, "bench", 8, Idct::fast); });
  double accurate =
      rate([&](const std::vector<uint8_t>& f) { decode(f, "bench", 8, Idct::accurate); });
  tjDestroy(h);
  double psnr_fast = 0, psnr_accurate = 0;
  const size_t n = std::min<size_t>(files.size(), 24);
  for (size_t i = 0; i < n; ++i) {
    const auto exact = crop_resized(files[i], size, Idct::accurate, false);
    psnr_fast += psnr(crop_resized(files[i], size, Idct::fast, true), exact) / n;
    psnr_accurate += psnr(crop_resized(files[i], size, Idct::accurate, true), exact) / n;
  }
  std::printf(
      "jpeg decode, one thread, %zu files: libjpeg-turbo %.1f images/s, cohort fast IDCT %.1f "
      "(ratio %.3f), accurate IDCT %.1f; pipeline decode of a centre crop to %d px against an "
      "exact decode: PSNR %.2f dB (fast), %.2f dB (accurate)\n",
      files.size(), raw, fast, fast / raw, accurate, size, psnr_fast, psnr_accurate);
  if (argc > 4) {
    FILE* j = std::fopen(argv[4], "w");
    if (j) {
      std::fprintf(j,
                   "{\"files\": %zu, \"libjpeg_turbo_per_s\": %.3f, \"cohort_fast_per_s\": %.3f, "
                   "\"cohort_accurate_per_s\": %.3f, \"psnr_fast_db\": %s, "
                   "\"psnr_accurate_db\": %s}\n",
                   files.size(), raw, fast, accurate, json_number(psnr_fast).c_str(),
                   json_number(psnr_accurate).c_str());
      std::fclose(j);
    }
  }
  return 0;
}
