// The CPU side of the JPEG transforms: from a decoded RGB region to the output image in one pass per
// output row (the antialiased resize, vertical taps then horizontal ones, the flip, the normalisation
// and the dtype/layout of the batch), vectorised: the vertical taps over the row's values, the
// horizontal ones a whole pixel at a time, the stores per channel. Bicubic as PIL sums it goes through
// two fixed-point passes instead (resample_fixed.cpp). The geometry and the taps are image_transform.h's, which the
// CUDA kernel also uses.
#pragma once

#include <cstdint>
#include <vector>

#include "core/augment.h"
#include "kernels/image_transform.h"

namespace fastpipe {

// A reader thread's buffers, kept from image to image.
struct ResampleScratch {
  std::vector<int> y_first, x_first;
  std::vector<float> y_weights, x_weights;
  std::vector<float> region;  // the decoded region as floats
  std::vector<float> row;     // one output row after its vertical taps, then its three channel planes
  // The fixed-point (bicubic) resample's: its weights, a padded source row, the horizontal pass's rows,
  // a row of sums and the rows an output's vertical taps read.
  std::vector<int32_t> y_fixed, x_fixed, fixed_acc;
  std::vector<uint8_t> fixed_row, fixed_rows;
  std::vector<const uint8_t*> fixed_taps;
  AugmentScratch augment;     // the resized uint8 image the augmentations work on
};

// Writes one output image (p.out_height x p.out_width x 3 in p's layout and dtype) to `out`. `src` is
// decoded pixel (region.y0, region.x0), RGB, rows `stride` bytes apart; the region is
// images::taps_region(g) (nothing is read when it is empty: every output is padding). With augmentations
// (p.augment) the resized image is rounded to uint8, as torchvision's is, the sample's ops (g.ops) run on
// it, and then it is normalised and erased into `out`.
void resample_image(const images::ImageTransformParams& p, const images::Geometry& g, const uint8_t* src,
                    int64_t stride, const images::Region& region, void* out, ResampleScratch& s);

}  // namespace fastpipe
