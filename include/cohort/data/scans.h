// A deterministic synthetic data set of scan-like images: a body-like ellipse with organ-like
// inner structures and noise; a known fraction also carries a lesion-like bright blob, which is
// the label. Written in ImageFolder layout (normal/, lesion/) plus labels.csv.
#pragma once

#include <cstdint>
#include <string>

namespace cohort::data {

struct ScanSetOptions {
  std::string out;
  int count = 100;
  std::string format = "png";   // png | jpeg
  int width = 128, height = 0;  // height 0: square
  int channels = 1;             // 3: the gray scan in RGB (for RGB pipelines and peers)
  int bits = 8;                 // png: 8 or 16
  int quality = 90;             // jpeg
  double lesion_fraction = 0.3;
  uint64_t seed = 0;
};

struct ScanSetSummary {
  int normal = 0, lesion = 0;
  uint64_t bytes = 0;
};

// Writes the set; progress goes to stderr every 10%.
ScanSetSummary make_scans(const ScanSetOptions& opt);

}  // namespace cohort::data
