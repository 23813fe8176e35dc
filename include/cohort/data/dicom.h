// DICOM through GDCM: 8/12/16/32-bit, signed and unsigned, MONOCHROME1/2, RescaleSlope/Intercept
// and RT Dose's Dose Grid Scaling, and the window (center/width, in modality units: after the
// rescale) applied with the linear VOI function of DICOM PS3.3 C.11.2.1.2.1, from the file or
// from the configuration. Native little-endian pixel data is read
// where it lies (GDCM parses the data set up to it); every other transfer syntax GDCM decodes
// (JPEG, JPEG-LS, JPEG 2000, big endian, deflated) goes through GDCM's image reader, in a helper
// process per thread (cohort-gdcm, COHORT_GDCM_HELPER), so that GDCM aborting or looping on a
// damaged file costs that file, named in a DecodeError, and not the process. Either way the
// stored values go to the output through one lookup table per image.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "cohort/data/image.h"

namespace cohort::data {

// A VOI window in modality units (the stored values after Rescale Slope/Intercept and Dose
// Grid Scaling: HU for CT, Gy for an RT Dose grid). Its width must be above 0.
struct Window {
  double center = 0, width = 0;
  bool exact = false;  // LINEAR_EXACT (C.11.2.1.3.2), as a file's VOI LUT Function may say
};

// y in [0, 1] for a modality value x, DICOM's LINEAR VOI function (C.11.2.1.2.1), or
// LINEAR_EXACT (C.11.2.1.3.2) when the window says so or is narrower than 1 (LINEAR needs a
// width of 1 or more; a dose window in Gy is often less).
double voi_linear(double x, Window w);

// Decodes to a 16-bit grayscale image whose values are the windowed intensities scaled to
// [0, 65535], MONOCHROME1 inverted. `window` overrides the file's; with neither, the full range
// of the modality values (of the whole image) is used. Colour images (8-bit RGB, interleaved or
// planar, or YBR_FULL) come back as 8-bit interleaved RGB, with no window.
Image decode_dicom(std::span<const uint8_t> bytes, const std::string& name,
                   std::optional<Window> window = std::nullopt);
// The image's size without decoding its pixels (native pixel data; others decode).
ImageInfo probe_dicom(std::span<const uint8_t> bytes, const std::string& name);

// A file parsed once: its size, then windowed pixels on demand. The pipeline asks for the size,
// chooses its crop and windows only the crop's rows as it resamples them (`rows`), without
// parsing or decoding the file twice.
struct StoredPixels;
class DeviceDicomWindow;
class DicomPixels {
 public:
  DicomPixels(std::span<const uint8_t> bytes, const std::string& name);  // `bytes` must outlive it
  ~DicomPixels();
  DicomPixels(DicomPixels&&) noexcept;
  ImageInfo info() const;
  // As decode_dicom: `window` overrides the file's.
  Image window(std::optional<Window> window) const;
  // The same values a row at a time, for an operator that reads only part of the image (a
  // crop's resampling) without the windowed image in memory. It must not outlive this object.
  RowSource rows(std::optional<Window> window) const;

 private:
  friend class DeviceDicomWindow;  // windows the stored values on the GPU (dicom_device.h)
  std::unique_ptr<StoredPixels> s_;
};

// The helper process's loop (cohort-gdcm's main): decodes what the callers send until they
// close their end.
int serve_gdcm_decoding();

struct DicomWriteOptions {
  int bits_stored = 12;  // 8, 12, 16 or 32 (at most the image's bits)
  bool is_signed = false;
  double slope = 1.0, intercept = 0.0;
  // An RT Dose grid: Dose Grid Scaling (3004,000E) and the RT Dose SOP class, no rescale.
  std::optional<double> dose_grid_scaling;
  std::optional<Window> window;
  bool monochrome1 = false;
  bool planar = false;  // RGB: planar configuration 1 (RRR... GGG... BBB...)
};
// Writes a Secondary Capture image (or an RT Dose grid) from raw stored values (bits allocated:
// the image's bits, 8, 16 or 32), or from 8-bit RGB.
std::vector<uint8_t> encode_dicom(const Image& stored, const DicomWriteOptions& opt);

}  // namespace cohort::data
