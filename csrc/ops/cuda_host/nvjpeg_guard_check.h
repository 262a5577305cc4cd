// What nvJPEG writes, checked on a GPU (tests/data/test_image_device.py): each image decoded into a region
// of its own between guard bytes, which must be intact afterwards whatever the backend (the hardware
// engines too), the chroma sampling or the size.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/jpeg_color.h"

namespace fastpipe::cuda {

struct GuardedDecode {
  images::DecodedLayout layout = images::DecodedLayout::kYccPlanar;
  std::vector<std::string> outputs;   // per image, the bytes of its region (planes, or interleaved RGB)
  std::vector<int64_t> overwritten;   // per image, guard bytes changed before and after its region
};

// Decodes `jpegs` (each one a device decodes: device_jpeg_planes) in one batch on the current device with
// the nvJPEG at `library`, `guard` bytes around each image's region. Throws Error naming what failed.
GuardedDecode guarded_decode(const std::vector<std::string>& jpegs, const std::string& library, int64_t guard);

}  // namespace fastpipe::cuda
