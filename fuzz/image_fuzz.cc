// Feeds arbitrary bytes to the image decoders the data pipeline runs on every file it reads:
// format sniffing, the header probe, the whole decode (JPEG, PNG and DICOM, the last through
// GDCM) at every JPEG scale, and the cropped JPEG decode. Any input may be refused (cohort::Error,
// naming the file) but none may crash, abort, hang or read out of bounds.
#include <algorithm>
#include <cstdint>
#include <span>

#include "cohort/core/error.h"
#include "cohort/data/image.h"

using namespace cohort;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const uint8_t mode = data[0];
  const std::span<const uint8_t> bytes(data + 1, size - 1);
  try {
    data::sniff(bytes.data(), bytes.size());
    const data::ImageInfo info = data::probe(bytes, "fuzz-input");
    switch (mode % 3) {
      case 0:
        data::decode(bytes, "fuzz-input");
        break;
      case 1:
        data::decode(bytes, "fuzz-input", 1 + (mode / 3) % 8, data::Idct::accurate);
        break;
      case 2:
        if (info.format == data::Format::jpeg && info.width > 0 && info.height > 0) {
          const data::PixelRegion region{info.width / 4, info.height / 4,
                                         std::max(1, info.width / 2), std::max(1, info.height / 2)};
          data::PixelRegion origin;
          data::decode_jpeg_region(bytes, "fuzz-input", 1 + (mode / 3) % 8, data::Idct::fast,
                                   region, &origin);
        }
        break;
    }
  } catch (const Error&) {
  }
  return 0;
}
