// What an encoded image holds, read from its first bytes without decoding it: its format (by content,
// never by file name: ImageNet has a PNG named .JPEG), its size, and what its decoder needs. The image
// folders' scans, the readers and write_images use it. Untrusted input: every length is bounds-checked
// (fuzzed: tests/fuzz/image_fuzz.cpp).
//
// JPEG, PNG and WebP have decoders here; any other format (BMP, GIF, TIFF, PNM, an animated WebP, ...)
// is decoded by the fallback decoder (core/image_fallback.h: Pillow, given by the Python layer), which
// also reports its size.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/jpeg_header.h"

namespace fastpipe {

// Stored in image folders' indexes: the values are kept.
enum class ImageFormat : int8_t { kUnknown = 0, kJpeg = 1, kPng = 2, kWebp = 3, kOther = 4 };

// "JPEG", "PNG", "WebP", "other", "unknown".
const char* image_format_name(ImageFormat f);

struct PngInfo {
  int width = 0, height = 0;
  int bit_depth = 0, color_type = 0;  // as IHDR stores them
  bool interlaced = false;
};

struct WebpInfo {
  int width = 0, height = 0;
  bool animated = false;  // an animation's frames are composed on a canvas: the fallback decodes those
};

struct ImageHeader {
  ImageFormat format = ImageFormat::kUnknown;
  int width = 0, height = 0;  // 0 x 0 for kOther and kUnknown: the fallback decoder knows
  const char* other = "";     // kOther: the format sniffed ("GIF", "BMP", ...)
  JpegInfo jpeg;              // kJpeg
  PngInfo png;                // kPng
  WebpInfo webp;              // kWebp
};

enum class HeaderParse {
  kOk,        // *header is filled (a format without a decoder here is kOther; no known magic is kUnknown)
  kNeedMore,  // the header continues past the bytes given (read more of the file and parse again)
  kError,     // a malformed or unsupported JPEG, PNG or WebP header: *reason says why
};

HeaderParse read_image_header(const uint8_t* data, size_t size, ImageHeader* header, std::string* reason);

// Why a header that asked for more (kNeedMore) when `what` ("file" or "data") held no more is bad.
std::string header_truncation(const ImageHeader& header, const char* what);

// The largest image decoded here, in pixels: Pillow's decompression-bomb limit (2 * MAX_IMAGE_PIXELS),
// past which torchvision's ImageFolder fails too. JPEGs are exempt (their decode is bounded by the crop).
constexpr int64_t kMaxImagePixels = 2 * 89478485LL;

// Why the whole of a parsed image's data is not in data[0, size) ("truncated: ..."), or "". JPEG: an
// end-of-image marker after the first scan; PNG: every image-data chunk complete; a still WebP: its image
// chunk complete. Checked before a decode, which may stop at a crop's last row.
std::string image_truncation(const uint8_t* data, size_t size, const ImageHeader& header);

}  // namespace fastpipe
