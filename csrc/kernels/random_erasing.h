// torchvision's RandomErasing (v1 and v2: applied last, to the normalised output) fused into the JPEG
// transforms' output: a box of the output image, drawn per sample as torchvision's get_params draws it
// (probability p; then up to 10 tries of an area in `scale` times the image's and a log-uniform aspect
// ratio in `ratio`, the box kept when it fits strictly inside; none when no try fits), whose elements are
// stored as `value` (per channel, in the output's units: after normalisation) instead of the resampled
// pixel. The CPU path (core/resample.cpp) and the device kernel (image_transform.h) apply the same box.
// Plain C++ (no torch, no CUDA headers outside nvcc).
#pragma once

#include <math.h>
#include <stdint.h>

#include "kernels/host_device.h"
#include "kernels/sample_draws.h"

namespace fastpipe::images {

struct ErasingParams {
  float p = 0.0f;  // 0: no erasing
  double scale_min = 0.02, scale_max = 0.33;
  double ratio_min = 0.3, ratio_max = 3.3;
  float value[3] = {0.0f, 0.0f, 0.0f};
};

// The erased box of one output image (height 0: nothing erased).
struct EraseBox {
  int top = 0, left = 0, height = 0, width = 0;
};

FASTPIPE_HD inline EraseBox erase_box(const ErasingParams& e, uint64_t seed, uint64_t epoch, uint64_t index,
                                      int out_height, int out_width) {
  EraseBox b;
  if (e.p <= 0.0f || draw01(seed, epoch, index, draws::kErase) >= static_cast<double>(e.p)) return b;
  const double area = static_cast<double>(out_height) * out_width;
  const double log_lo = log(e.ratio_min), log_hi = log(e.ratio_max);
  for (int t = 0; t < static_cast<int>(draws::kTries); ++t) {
    const uint64_t d = draws::kErase + 1 + draws::kPerTry * static_cast<uint64_t>(t);
    const double erase_area = area * (e.scale_min + (e.scale_max - e.scale_min) * draw01(seed, epoch, index, d));
    const double aspect = exp(log_lo + (log_hi - log_lo) * draw01(seed, epoch, index, d + 1));
    const int h = round_half_even(sqrt(erase_area * aspect));
    const int w = round_half_even(sqrt(erase_area / aspect));
    if (!(h < out_height && w < out_width)) continue;
    b.top = below(transforms::sample_bits(seed, epoch, index, d + 2), out_height - h + 1);
    b.left = below(transforms::sample_bits(seed, epoch, index, d + 3), out_width - w + 1);
    b.height = h;
    b.width = w;
    return b;
  }
  return b;
}

FASTPIPE_HD inline bool inside(const EraseBox& b, int y, int x) {
  return y >= b.top && y < b.top + b.height && x >= b.left && x < b.left + b.width;
}

}  // namespace fastpipe::images
