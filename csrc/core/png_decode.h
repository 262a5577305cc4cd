// Decoding the rows of a PNG that a transform reads, with libspng: from the top row through the region's
// last (the rows below are never decoded; an interlaced image is decoded whole), converted to RGB as
// Pillow's Image.open(...).convert("RGB") does, which is what torchvision's ImageFolder trains on:
// alpha dropped (never composited), 1/2/4-bit grey scaled to 0-255, palettes looked up (an index past the
// palette is black), 16-bit colour truncated to its high byte, and 16-bit grey clipped at 255 (Pillow's
// "I;16" to "RGB"). Gamma, colour profiles and transparency chunks are ignored, as Pillow ignores them.
//
// Built when libspng's headers are found (FASTPIPE_WITH_PNG, see setup.py); otherwise decode() throws
// and PNGs go to the fallback decoder (Pillow).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/image_format.h"
#include "kernels/image_transform.h"

namespace fastpipe {

// Whether this build decodes PNGs, and the libspng version it was built with ("" without).
bool png_decoding_built();
std::string png_library_version();

// An interlaced PNG is decoded whole in its reader thread: at most this many bytes of samples (a
// larger one is an error saying so, not gigabytes per thread at the pixel cap).
constexpr size_t kMaxInterlacedBytes = size_t{128} << 20;
// Test hook: the budget in force (0: kMaxInterlacedBytes again).
void set_interlaced_budget(size_t bytes);

// One per reader thread: keeps its buffers from image to image.
class PngDecoder {
 public:
  // Decodes rows [r.y0, r.y1) and columns [r.x0, r.x1) of the PNG (`info`: its parsed header). Returns
  // RGB pixel (r.y0, r.x0), rows *stride bytes apart, valid until the next call. Throws
  // std::runtime_error with libspng's message when the data is corrupt.
  const uint8_t* decode(const uint8_t* data, size_t size, const PngInfo& info, const images::Region& r,
                        int64_t* stride);

 private:
  std::vector<uint8_t> rows_;    // the PNG's own samples: one row, or the whole image when interlaced
  std::vector<uint8_t> pixels_;  // the region in RGB
};

}  // namespace fastpipe
