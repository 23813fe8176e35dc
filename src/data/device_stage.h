// The data pipeline's device stage (--decode gpu, --augment-on gpu; docs/gpu.md): what a worker
// thread prepares per sample on the CPU (the file's coefficients, its DICOM stored values, or an
// image decoded on the CPU, with the sample's augmentation drawn from its random stream as the
// CPU path draws it), and the stage that turns a batch of them into the batch in device memory.
// The pipeline (pipeline.cc) holds one through this interface; make_device_stage is
// device_stage.cc where the GPU parts are built (cohort_data_cuda) and device_stage_absent.cc,
// which refuses, elsewhere.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cohort/data/dicom.h"
#include "cohort/data/image.h"
#include "cohort/data/jpeg_coefficients.h"
#include "cohort/data/ops.h"
#include "cohort/data/pipeline.h"

namespace cohort::data {

// A sample's augmentation, drawn once on the CPU (the same draws, in the same order, as the CPU
// path: a seed gives the same crops on either device).
struct AugmentParams {
  CropBox box;  // in the image's pixels
  bool hflip = false, vflip = false;
  double degrees = 0;  // 0: no rotation
  bool jitter = false;
  float brightness = 0;  // in the image's value range (the CPU pipeline's b)
  float contrast = 1;
};

struct DeviceItem {
  enum class Kind { jpeg, dicom, image } kind = Kind::image;
  JpegCoefficients jpeg;               // jpeg: entropy-decoded on the CPU
  std::vector<uint8_t> file;           // the file's bytes, read here (dicom reads them later)
  std::unique_ptr<DicomPixels> dicom;  // dicom: its stored values, windowed on the device
  Image image;                         // image: decoded on the CPU (PNG; files the device declines)
  AugmentParams params;
};

class DeviceStage {
 public:
  virtual ~DeviceStage() = default;
  // Device memory for a batch of `bytes`, and its release.
  virtual void* alloc_batch(size_t bytes) = 0;
  virtual void free_batch(void* p) = 0;
  // The batch of `items` (the valid samples, in order) into `out`, densely: decoding where it
  // is the device's, then the operators. Runs on the device's copy stream and returns once the
  // batch is complete there, so that the consumer never waits for it. One batch at a time.
  virtual void run(const std::vector<DeviceItem*>& items, void* out) = 0;
  // "decode gpu (JPEG: mixed; DICOM: windowing), augment gpu on cuda:0"
  virtual std::string describe() const = 0;
};

// Throws, naming why, where the options ask for the GPU and there is none (no CUDA device chosen,
// or a build without the GPU parts).
std::unique_ptr<DeviceStage> make_device_stage(const PipelineOptions& o, int channels);

}  // namespace cohort::data
