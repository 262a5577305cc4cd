// The CPU side of the fused augmentations (kernels/augment_ops.h): a sample's ops applied in turn to its
// resized uint8 image in a reader thread, each op a pass over the output-sized image, kept as 3 planes
// (R, G, B) so that every op's loop runs over contiguous values.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/augment_draws.h"

namespace fastpipe {

// A reader thread's buffers, kept from image to image.
struct AugmentScratch {
  std::vector<uint8_t> image, other;  // the image (3 planes) and the next op's output, swapped after each op
  std::vector<float> columns;         // a geometric op's column products and a row's source positions
  std::vector<float> grey;            // the colour op's greys
  std::vector<uint8_t> original;      // AugMix: the image its chains start from
  std::vector<float> mix;             // AugMix: the sums
  uint8_t tables[3 * 256];
  images::ImageStats stats;
};

// Applies `ops` to the h x w image in s.image, 3 planes (the result is left there); `fill`: the pixels the
// geometric ops bring in from outside (nearest sampling). The colour, sharpness, contrast and geometric
// ops use the CPU's fused multiply-add where it has one (x86-64: AVX2 and FMA, chosen at run time), else images::ExactFma's
// emulation (emulate_fma: always; the tests check that both give torchvision's values).
void augment_image(const images::SampleOps& ops, const uint8_t fill[3], int h, int w, AugmentScratch& s,
                   bool emulate_fma = false);

}  // namespace fastpipe
