// Image operators, separate from the executor that runs them (as in DALI). Geometry is computed
// in the original image's pixel coordinates, so that a decoder's downscaling never changes which
// region a sample shows.
#pragma once

#include <cstdint>
#include <vector>

#include "cohort/core/rng.h"
#include "cohort/data/image.h"

namespace cohort::data {

struct CropBox {
  double x = 0, y = 0, w = 0, h = 0;  // left, top, width, height in source pixels
};

// torchvision's RandomResizedCrop.get_params: scale [0.08, 1], ratio [3/4, 4/3], 10 attempts,
// then a center crop clamped to the ratio range.
CropBox random_resized_crop_box(int width, int height, CounterRng& rng, double scale_min = 0.08,
                                double scale_max = 1.0, double ratio_min = 3.0 / 4,
                                double ratio_max = 4.0 / 3);
// torchvision's Resize(shorter side = resize) then CenterCrop(crop), as one box.
CropBox resize_center_crop_box(int width, int height, int resize, int crop);

// Resamples `box` of `src` to out_w x out_h, bilinear with antialiasing when shrinking (the
// triangle filter widened by the scale, as PIL and torchvision antialias=True do). Output is
// planar float, channel after channel, in the source's value range.
void resize_crop(const Image& src, CropBox box, int out_w, int out_h, float* out);
// The same from rows given on demand: only the rows and columns the crop's taps reach are asked
// for, each once.
void resize_crop(const RowSource& src, CropBox box, int out_w, int out_h, float* out);
// The rows of interleaved pixels in memory (which must outlive the source), as floats.
RowSource rows_of(const uint8_t* pixels, int width, int height, int channels);
RowSource rows_of(const uint16_t* pixels, int width, int height, int channels);

void flip_horizontal(float* planes, int channels, int height, int width);
void flip_vertical(float* planes, int channels, int height, int width);
// Turns each plane by `degrees` (counter-clockwise as displayed) about its centre, bilinear;
// corners that come from outside the image are 0 (black), as torchvision's RandomRotation.
void rotate(float* planes, int channels, int height, int width, double degrees,
            std::vector<float>& scratch);
// x = (x - mean) * contrast + mean + brightness, per channel (mean of the channel).
void brightness_contrast(float* planes, int channels, int height, int width, float brightness,
                         float contrast);

}  // namespace cohort::data
