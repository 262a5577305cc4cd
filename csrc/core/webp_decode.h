// Decoding the region of a still WebP that a transform reads, with libwebp's cropped decode (a lossy
// image is decoded down to the region's last macroblock row only), into RGB as Pillow's
// Image.open(...).convert("RGB") does: alpha dropped, never composited. The crop is widened by a margin
// so that the chroma upsampling at its edges is the full image's.
//
// Built when libwebp's headers are found (FASTPIPE_WITH_WEBP, see setup.py); otherwise decode() throws
// and WebPs go to the fallback decoder (Pillow). Animated WebPs always do (their first frame is composed
// on a canvas).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/image_format.h"
#include "kernels/image_transform.h"

namespace fastpipe {

// Whether this build decodes WebPs, and the libwebp version it was built with ("" without).
bool webp_decoding_built();
std::string webp_library_version();

// One per reader thread: keeps its pixel buffer from image to image.
class WebpDecoder {
 public:
  // Decodes rows [r.y0, r.y1) and columns [r.x0, r.x1) of a still WebP (`info`: its parsed header).
  // Returns RGB pixel (r.y0, r.x0), rows *stride bytes apart, valid until the next call. Throws
  // std::runtime_error with why when the data cannot be decoded.
  const uint8_t* decode(const uint8_t* data, size_t size, const WebpInfo& info, const images::Region& r,
                        int64_t* stride);

 private:
  std::vector<uint8_t> pixels_;
};

}  // namespace fastpipe
