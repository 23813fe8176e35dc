// Writes the committed seed corpus of fuzz_image (fuzz/corpus/image): small images made by the
// real encoders, each kind the decoders take apart differently (JPEG gray and colour; PNG 8 and
// 16 bits, gray and colour; DICOM 8, 12 and 16 bits, signed, rescaled, windowed, MONOCHROME1,
// colour interleaved and planar), each prefixed with the byte that selects the decode mode.
// Rerun after a codec change:
//   build-fuzz/bin/image_seeds fuzz/corpus/image
#include <cstdio>
#include <fstream>
#include <string>

#include "cohort/data/dicom.h"
#include "cohort/data/image.h"

using namespace cohort::data;

namespace {

Image gradient(int w, int h, int channels, int bits) {
  Image img;
  img.width = w;
  img.height = h;
  img.channels = channels;
  img.bits = bits;
  img.data.resize(img.row_bytes() * static_cast<size_t>(h));
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < channels; ++c) {
        const size_t i = (static_cast<size_t>(y) * w + x) * channels + c;
        const unsigned v = static_cast<unsigned>((x * 37 + y * 11 + c * 50) % 251);
        if (bits == 8) {
          img.data[i] = static_cast<uint8_t>(v);
        } else {
          const uint16_t s = static_cast<uint16_t>(v * 13);
          __builtin_memcpy(img.data.data() + 2 * i, &s, 2);
        }
      }
  return img;
}

void write(const std::string& dir, const std::string& name, const std::vector<uint8_t>& bytes,
           std::initializer_list<char> modes) {
  for (char m : modes) {
    std::ofstream f(dir + "/" + name + "-m" + std::to_string(static_cast<int>(m)),
                    std::ios::binary);
    f.put(m);
    f.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: image_seeds DIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  // Modes: 0 whole decode, 1 accurate IDCT at scale 1/8 + m/3, 2 cropped JPEG decode.
  write(dir, "jpeg-gray", encode_jpeg(gradient(24, 20, 1, 8), 90), {0, 5, 2});
  write(dir, "jpeg-rgb", encode_jpeg(gradient(40, 24, 3, 8), 75), {0, 4, 2, 11});
  write(dir, "png-gray8", encode_png(gradient(24, 20, 1, 8)), {0});
  write(dir, "png-gray16", encode_png(gradient(24, 20, 1, 16)), {0});
  write(dir, "png-rgb8", encode_png(gradient(16, 12, 3, 8)), {0});
  DicomWriteOptions o;
  o.bits_stored = 8;
  write(dir, "dicom-8", encode_dicom(gradient(16, 12, 1, 8), o), {0});
  o.bits_stored = 12;
  o.slope = 2.0;
  o.intercept = -1024;
  o.window = Window{40, 400};
  write(dir, "dicom-12-rescaled-windowed", encode_dicom(gradient(16, 12, 1, 16), o), {0});
  o = DicomWriteOptions();
  o.bits_stored = 16;
  o.is_signed = true;
  o.monochrome1 = true;
  write(dir, "dicom-16-signed-mono1", encode_dicom(gradient(16, 12, 1, 16), o), {0});
  o = DicomWriteOptions();
  write(dir, "dicom-rgb", encode_dicom(gradient(12, 10, 3, 8), o), {0});
  o.planar = true;
  write(dir, "dicom-rgb-planar", encode_dicom(gradient(12, 10, 3, 8), o), {0});
  return 0;
}
