#include "cohort/data/scans.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "cohort/core/error.h"
#include "cohort/core/rng.h"
#include "cohort/data/dicom.h"
#include "cohort/data/image.h"

namespace fs = std::filesystem;

namespace cohort::data {

namespace {

struct Ellipse {
  double cx, cy, rx, ry, value;
  bool inside(double x, double y) const {
    double dx = (x - cx) / rx, dy = (y - cy) / ry;
    return dx * dx + dy * dy <= 1.0;
  }
};

}  // namespace

ScanSetSummary make_scans(const ScanSetOptions& o) {
  COHORT_CHECK(o.count >= 1, "--count " << o.count);
  COHORT_CHECK(o.width >= 16 && o.width <= 8192, "--size " << o.width << " (16..8192)");
  COHORT_CHECK(o.format == "png" || o.format == "jpeg" || o.format == "dicom",
               "--format '" << o.format << "': png, jpeg or dicom");
  COHORT_CHECK(o.bits == 8 || (o.bits == 16 && o.format == "png"), "--bits " << o.bits);
  COHORT_CHECK(o.format != "dicom" || o.channels == 1, "DICOM scans are grayscale");
  COHORT_CHECK(o.channels == 1 || o.channels == 3, "--channels " << o.channels);
  const int W = o.width, H = o.height > 0 ? o.height : o.width;
  fs::create_directories(fs::path(o.out) / "normal");
  fs::create_directories(fs::path(o.out) / "lesion");
  std::ofstream csv(fs::path(o.out) / "labels.csv.tmp");
  csv << "path,lesion\n";
  ScanSetSummary sum;
  const bool dicom = o.format == "dicom";
  // DICOM: 12-bit stored values, CT-like rescale (HU = stored - 1024) and a soft-tissue-wide
  // window.
  const double maxv = dicom ? 4095.0 : o.bits == 16 ? 65535.0 : 255.0;
  const char* ext = o.format == "png" ? ".png" : dicom ? ".dcm" : ".jpg";
  for (int n = 0; n < o.count; ++n) {
    CounterRng rng(key3(o.seed, static_cast<uint64_t>(n), 0x5ca115));
    const bool lesion = rng.uniform() < o.lesion_fraction;
    const double m = std::min(W, H);
    Ellipse body{W / 2.0 + rng.uniform(-0.05, 0.05) * W, H / 2.0 + rng.uniform(-0.05, 0.05) * H,
                 m * rng.uniform(0.30, 0.45), m * rng.uniform(0.30, 0.45), rng.uniform(0.35, 0.5)};
    Ellipse organs[3];
    for (auto& e : organs) {
      e = {body.cx + rng.uniform(-0.5, 0.5) * body.rx, body.cy + rng.uniform(-0.5, 0.5) * body.ry,
           body.rx * rng.uniform(0.12, 0.3), body.ry * rng.uniform(0.12, 0.3),
           rng.uniform(0.2, 0.6)};
    }
    double lx = body.cx + rng.uniform(-0.5, 0.5) * body.rx;
    double ly = body.cy + rng.uniform(-0.5, 0.5) * body.ry;
    double lr = m * rng.uniform(0.04, 0.08);
    Image img;
    img.width = W;
    img.height = H;
    img.channels = o.channels;
    img.bits = dicom ? 16 : o.bits;
    img.data.resize(img.row_bytes() * H);
    CounterRng noise(key3(o.seed, static_cast<uint64_t>(n), 0x4015e));
    for (int y = 0; y < H; ++y) {
      for (int x = 0; x < W; ++x) {
        double v = 0.02;
        if (body.inside(x, y)) {
          v = body.value;
          for (const auto& e : organs) {
            if (e.inside(x, y)) v = e.value;
          }
          if (lesion) {
            double d2 = ((x - lx) * (x - lx) + (y - ly) * (y - ly)) / (lr * lr);
            v += 0.45 * std::exp(-d2);
          }
        }
        v += (noise.uniform() - 0.5) * 0.08;
        v = std::clamp(v, 0.0, 1.0) * maxv;
        for (int c = 0; c < o.channels; ++c) {
          size_t i = (static_cast<size_t>(y) * W + x) * o.channels + c;
          if (img.bits == 8) {
            img.data[i] = static_cast<uint8_t>(std::lround(v));
          } else {
            uint16_t s = static_cast<uint16_t>(std::lround(v));
            std::memcpy(&img.data[2 * i], &s, 2);
          }
        }
      }
    }
    std::vector<uint8_t> bytes;
    if (dicom) {
      DicomWriteOptions d;
      d.bits_stored = 12;
      d.intercept = -1024;
      d.window = Window{1000, 3500};
      bytes = encode_dicom(img, d);
    } else {
      bytes = o.format == "png" ? encode_png(img) : encode_jpeg(img, o.quality);
    }
    char name[64];
    std::snprintf(name, sizeof(name), "scan_%06d%s", n, ext);
    const std::string rel = std::string(lesion ? "lesion/" : "normal/") + name;
    write_file((fs::path(o.out) / rel).string(), bytes);
    csv << rel << "," << (lesion ? 1 : 0) << "\n";
    (lesion ? sum.lesion : sum.normal)++;
    sum.bytes += bytes.size();
    if (o.count >= 100 && (n + 1) % (o.count / 10) == 0) {
      std::fprintf(stderr, "make-dataset: %d/%d images\n", n + 1, o.count);
    }
  }
  csv.close();
  if (!csv) COHORT_THROW("cannot write " << (fs::path(o.out) / "labels.csv").string());
  fs::rename(fs::path(o.out) / "labels.csv.tmp", fs::path(o.out) / "labels.csv");
  return sum;
}

}  // namespace cohort::data
