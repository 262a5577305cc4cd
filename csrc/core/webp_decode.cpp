#include "core/webp_decode.h"

#include <algorithm>
#include <stdexcept>

#ifdef FASTPIPE_WITH_WEBP
#include <webp/decode.h>
#endif

namespace fastpipe {

#ifdef FASTPIPE_WITH_WEBP

namespace {

const char* status_name(VP8StatusCode s) {
  switch (s) {
    case VP8_STATUS_OUT_OF_MEMORY: return "out of memory";
    case VP8_STATUS_INVALID_PARAM: return "invalid parameter";
    case VP8_STATUS_BITSTREAM_ERROR: return "corrupt WebP data (bitstream error)";
    case VP8_STATUS_UNSUPPORTED_FEATURE: return "an unsupported WebP feature";
    case VP8_STATUS_NOT_ENOUGH_DATA: return "truncated WebP data";
    default: return "libwebp could not decode it";
  }
}

}  // namespace

bool webp_decoding_built() { return true; }

std::string webp_library_version() {
  const int v = WebPGetDecoderVersion();
  return "libwebp " + std::to_string(v >> 16) + "." + std::to_string((v >> 8) & 255) + "." + std::to_string(v & 255);
}

const uint8_t* WebpDecoder::decode(const uint8_t* data, size_t size, const WebpInfo& info, const images::Region& r,
                                   int64_t* stride) {
  // The chroma of a lossy WebP is upsampled from its neighbours: a crop's first and last rows and columns
  // take theirs from inside the crop. With a margin of 2 every pixel of the region is the full image's.
  constexpr int kMargin = 2;
  WebPDecoderConfig config;
  if (!WebPInitDecoderConfig(&config)) throw std::runtime_error("libwebp's version does not match its headers");
  const int left = std::max(0, r.x0 - kMargin) & ~1, top = std::max(0, r.y0 - kMargin) & ~1;  // libwebp snaps to even
  const int right = std::min(info.width, r.x1 + kMargin), bottom = std::min(info.height, r.y1 + kMargin);
  config.options.use_cropping = 1;
  config.options.crop_left = left;
  config.options.crop_top = top;
  config.options.crop_width = right - left;
  config.options.crop_height = bottom - top;
  const int64_t row = static_cast<int64_t>(right - left) * 3;
  pixels_.resize(static_cast<size_t>(row * (bottom - top)));
  config.output.colorspace = MODE_RGB;
  config.output.is_external_memory = 1;
  config.output.u.RGBA.rgba = pixels_.data();
  config.output.u.RGBA.stride = static_cast<int>(row);
  config.output.u.RGBA.size = pixels_.size();
  const VP8StatusCode status = WebPDecode(data, size, &config);
  WebPFreeDecBuffer(&config.output);
  if (status != VP8_STATUS_OK) throw std::runtime_error(status_name(status));
  *stride = row;
  return pixels_.data() + (r.y0 - top) * row + (r.x0 - left) * 3;
}

#else  // built without libwebp

bool webp_decoding_built() { return false; }
std::string webp_library_version() { return ""; }

const uint8_t* WebpDecoder::decode(const uint8_t*, size_t, const WebpInfo&, const images::Region&, int64_t*) {
  throw std::runtime_error("fastpipe was built without libwebp (WebP decoding in the reader threads)");
}

#endif

}  // namespace fastpipe
