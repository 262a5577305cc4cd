// Decoding one region of a JPEG with libjpeg(-turbo): only the rows and columns a transform reads
// (jpeg_skip_scanlines, jpeg_crop_scanline; the rows below are never decoded), at 1 / denom of the full
// size where libjpeg scales in the DCT, into RGB (grayscale expanded, CMYK/YCCK converted as PIL does).
//
// Built when libjpeg's headers are found (FASTPIPE_WITH_JPEG, see setup.py); otherwise decode() throws
// a message that says how to build it in.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/jpeg_header.h"
#include "kernels/image_transform.h"
#include "kernels/jpeg_color.h"

namespace fastpipe {

// Whether this build decodes JPEGs, and the libjpeg version it was built with ("" without).
bool jpeg_decoding_built();
std::string jpeg_library_version();

// One per reader thread: keeps its libjpeg state and pixel buffer from image to image.
class JpegDecoder {
 public:
  JpegDecoder();
  ~JpegDecoder();
  JpegDecoder(const JpegDecoder&) = delete;
  JpegDecoder& operator=(const JpegDecoder&) = delete;

  // Decodes rows [r.y0, r.y1) and columns [r.x0, r.x1) of the image (`info`: its parsed header) scaled
  // to 1 / denom (1, 2, 4 or 8). Returns RGB pixel (r.y0, r.x0), rows *stride bytes apart, valid until
  // the next call. Throws std::runtime_error with libjpeg's message when the data is corrupt (a
  // warning that the data is damaged counts: it would decode as grey or garbage).
  const uint8_t* decode(const uint8_t* data, size_t size, const JpegInfo& info, int denom,
                        const images::Region& r, int64_t* stride);

  // Decodes the whole image at full size into `p`'s planes at `out`: libjpeg's raw output (JDCT_ISLOW),
  // before upsampling and colour conversion, which is what a GPU decoder's planar output holds. Throws
  // std::runtime_error as decode() does, and where the image's components or sampling are not p's.
  void decode_planes(const uint8_t* data, size_t size, const images::YccPlanes& p, uint8_t* out);

 private:
  struct State;
  std::unique_ptr<State> s_;
  std::vector<uint8_t> pixels_;
};

}  // namespace fastpipe
