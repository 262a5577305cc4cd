// The CPU side of the fused augmentations (cuda/augment_ops.h): a sample's ops applied in turn to its
// resized uint8 image in a reader thread, each op a pass over the output-sized image.
#pragma once

#include <cstdint>
#include <vector>

#include "cuda/augment_draws.h"

namespace fastpipe {

// A reader thread's buffers, kept from image to image.
struct AugmentScratch {
  std::vector<uint8_t> image, other;  // the HWC image and the next op's output, swapped after each op
  uint8_t tables[3 * 256];
  images::ImageStats stats;
};

// Applies `ops` to the h x w HWC image in s.image (the result is left there); `fill`: the pixels the
// geometric ops bring in from outside.
void augment_image(const images::SampleOps& ops, const uint8_t fill[3], int h, int w, AugmentScratch& s);

}  // namespace fastpipe
