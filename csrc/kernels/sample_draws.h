// The numbers a sample's random transforms draw, as torchvision draws them but from a counter-based hash
// of (seed, epoch, sample index, draw number) instead of torch's generator: pure functions, so that the
// reader threads and the device kernels make the same draws and a resumed or sharded run the same ones.
// Plain C++ (no torch, no CUDA headers outside nvcc).
#pragma once

#include <math.h>
#include <stdint.h>

#include "kernels/host_device.h"
#include "kernels/transforms.h"

namespace fastpipe::images {

// A uniform double in [0, 1) from the top 53 bits.
FASTPIPE_HD inline double uniform01(uint64_t bits) {
  return static_cast<double>(bits >> 11) * (1.0 / 9007199254740992.0);
}

// An integer in [0, n) (n >= 1); the bias of the modulo is below 2**-40 for any image size.
FASTPIPE_HD inline int below(uint64_t bits, int n) { return static_cast<int>(bits % static_cast<uint64_t>(n)); }

// Python's round(): half to even (rint under the default rounding mode).
FASTPIPE_HD inline int round_half_even(double v) { return static_cast<int>(rint(v)); }

// Draw `what` of sample `index` in `epoch` as a uniform double in [0, 1).
FASTPIPE_HD inline double draw01(uint64_t seed, uint64_t epoch, uint64_t index, uint64_t what) {
  return uniform01(transforms::sample_bits(seed, epoch, index, what));
}

}  // namespace fastpipe::images
