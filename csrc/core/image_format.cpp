#include "core/image_format.h"

#include <cstring>

namespace fastpipe {
namespace {

constexpr uint8_t kPngMagic[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};

uint32_t be32(const uint8_t* p) {
  return (static_cast<uint32_t>(p[0]) << 24) | (static_cast<uint32_t>(p[1]) << 16) |
         (static_cast<uint32_t>(p[2]) << 8) | p[3];
}
uint32_t le32(const uint8_t* p) {
  return p[0] | (static_cast<uint32_t>(p[1]) << 8) | (static_cast<uint32_t>(p[2]) << 16) |
         (static_cast<uint32_t>(p[3]) << 24);
}
uint32_t le24(const uint8_t* p) { return p[0] | (static_cast<uint32_t>(p[1]) << 8) | (static_cast<uint32_t>(p[2]) << 16); }

bool is_png(const uint8_t* d, size_t n) { return n >= 8 && std::memcmp(d, kPngMagic, 8) == 0; }
bool is_webp(const uint8_t* d, size_t n) {
  return n >= 12 && std::memcmp(d, "RIFF", 4) == 0 && std::memcmp(d + 8, "WEBP", 4) == 0;
}

HeaderParse fail(std::string* reason, const std::string& why) {
  *reason = why;
  return HeaderParse::kError;
}

// The bit depths PNG allows for each colour type.
bool png_depth_valid(int color_type, int depth) {
  switch (color_type) {
    case 0: return depth == 1 || depth == 2 || depth == 4 || depth == 8 || depth == 16;
    case 3: return depth == 1 || depth == 2 || depth == 4 || depth == 8;
    case 2: case 4: case 6: return depth == 8 || depth == 16;
    default: return false;
  }
}

HeaderParse read_png(const uint8_t* d, size_t n, PngInfo* info, std::string* reason) {
  // Signature, then IHDR: length 13, type, width, height, depth, colour type, compression, filter, interlace.
  if (n < 8 + 8 + 13) return HeaderParse::kNeedMore;
  if (be32(d + 8) != 13 || std::memcmp(d + 12, "IHDR", 4) != 0)
    return fail(reason, "malformed PNG: its first chunk is not a 13-byte IHDR");
  const uint8_t* h = d + 16;
  const uint32_t w = be32(h), ht = be32(h + 4);
  if (w == 0 || ht == 0 || w > 0x7fffffffu || ht > 0x7fffffffu)
    return fail(reason, "malformed PNG: a size of " + std::to_string(w) + "x" + std::to_string(ht));
  if (!png_depth_valid(h[9], h[8]))
    return fail(reason, "malformed PNG: colour type " + std::to_string(h[9]) + " with " + std::to_string(h[8]) +
                            "-bit samples");
  if (h[10] != 0 || h[11] != 0 || h[12] > 1)
    return fail(reason, "malformed PNG: unknown compression, filter or interlace method");
  info->width = static_cast<int>(w);
  info->height = static_cast<int>(ht);
  info->bit_depth = h[8];
  info->color_type = h[9];
  info->interlaced = h[12] == 1;
  return HeaderParse::kOk;
}

// The size in a VP8 (lossy) or VP8L (lossless) chunk's payload.
HeaderParse webp_bitstream_size(const uint8_t* fourcc, const uint8_t* p, size_t avail, WebpInfo* info,
                                std::string* reason) {
  if (std::memcmp(fourcc, "VP8 ", 4) == 0) {
    if (avail < 10) return HeaderParse::kNeedMore;
    if ((p[0] & 1) != 0 || p[3] != 0x9d || p[4] != 0x01 || p[5] != 0x2a)
      return fail(reason, "malformed WebP: its VP8 data does not start with a key frame");
    info->width = (p[6] | (p[7] << 8)) & 0x3fff;
    info->height = (p[8] | (p[9] << 8)) & 0x3fff;
  } else {
    if (avail < 5) return HeaderParse::kNeedMore;
    const uint32_t bits = le32(p + 1);
    if (p[0] != 0x2f || (bits >> 29) != 0) return fail(reason, "malformed WebP: a bad VP8L signature or version");
    info->width = static_cast<int>(bits & 0x3fff) + 1;
    info->height = static_cast<int>((bits >> 14) & 0x3fff) + 1;
  }
  if (info->width == 0 || info->height == 0) return fail(reason, "malformed WebP: a width or height of 0");
  return HeaderParse::kOk;
}

HeaderParse read_webp(const uint8_t* d, size_t n, WebpInfo* info, std::string* reason) {
  if (n < 20) return HeaderParse::kNeedMore;
  const uint8_t* fourcc = d + 12;
  const uint8_t* payload = d + 20;
  if (std::memcmp(fourcc, "VP8X", 4) == 0) {
    // Extended: flags (animation 0x02), 3 reserved bytes, canvas width - 1 and height - 1 (24 bits each).
    if (n < 30) return HeaderParse::kNeedMore;
    info->animated = (payload[0] & 0x02) != 0;
    info->width = static_cast<int>(le24(payload + 4)) + 1;
    info->height = static_cast<int>(le24(payload + 7)) + 1;
    return HeaderParse::kOk;
  }
  if (std::memcmp(fourcc, "VP8 ", 4) == 0 || std::memcmp(fourcc, "VP8L", 4) == 0)
    return webp_bitstream_size(fourcc, payload, n - 20, info, reason);
  return fail(reason, "malformed WebP: its first chunk is not VP8, VP8L or VP8X");
}

// The PNG's chunks walked from the signature: "" when every IDAT chunk is complete.
std::string png_truncation(const uint8_t* d, size_t n) {
  size_t pos = 8;
  bool seen_idat = false;
  while (pos + 8 <= n) {
    const uint64_t len = be32(d + pos);
    const uint8_t* type = d + pos + 4;
    const bool idat = std::memcmp(type, "IDAT", 4) == 0;
    if (seen_idat && !idat) return "";  // the image data ended: what follows is not needed to decode it
    if (len > 0x7fffffffu) return "malformed PNG: a chunk length over 2**31";
    if (std::memcmp(type, "IEND", 4) == 0) return "malformed PNG: no image data before its end";
    if (len + 12 > n - pos) return idat ? "truncated: the file ends inside the PNG image data"
                                        : "truncated: the file ends before the PNG image data";
    seen_idat = seen_idat || idat;
    pos += static_cast<size_t>(len) + 12;
  }
  // Out of chunks: complete only if the last IDAT ended exactly here (the end chunk is not needed, as for Pillow).
  return seen_idat ? "" : "truncated: the file ends before the PNG image data";
}

// The WebP's chunks walked from the first: "" when its image chunk (VP8 or VP8L) is complete.
std::string webp_truncation(const uint8_t* d, size_t n) {
  size_t pos = 12;
  while (pos + 8 <= n) {
    const uint64_t len = le32(d + pos + 4);
    const bool image = std::memcmp(d + pos, "VP8 ", 4) == 0 || std::memcmp(d + pos, "VP8L", 4) == 0;
    if (len + 8 > n - pos) return image ? "truncated: the file ends inside the WebP image data"
                                        : "truncated: the file ends before the WebP image data";
    if (image) return "";
    pos += 8 + static_cast<size_t>(len) + (len & 1);  // chunks are padded to an even size
  }
  return "truncated: the file ends before the WebP image data";
}

}  // namespace

const char* image_format_name(ImageFormat f) {
  switch (f) {
    case ImageFormat::kJpeg: return "JPEG";
    case ImageFormat::kPng: return "PNG";
    case ImageFormat::kWebp: return "WebP";
    case ImageFormat::kOther: return "other";
    default: return "unknown";
  }
}

HeaderParse read_image_header(const uint8_t* data, size_t size, ImageHeader* header, std::string* reason) {
  *header = ImageHeader{};
  if (size >= 2 && data[0] == 0xFF && data[1] == 0xD8) {
    header->format = ImageFormat::kJpeg;
    switch (read_jpeg_info(data, size, &header->jpeg, reason)) {
      case JpegParse::kNeedMore: return HeaderParse::kNeedMore;
      case JpegParse::kError: return HeaderParse::kError;
      case JpegParse::kOk: break;
    }
    const std::string why = jpeg_unsupported_reason(header->jpeg);
    if (!why.empty()) return fail(reason, "unsupported: " + why);
    header->width = header->jpeg.width;
    header->height = header->jpeg.height;
    return HeaderParse::kOk;
  }
  HeaderParse r = HeaderParse::kOk;
  if (is_png(data, size)) {
    header->format = ImageFormat::kPng;
    r = read_png(data, size, &header->png, reason);
    header->width = header->png.width;
    header->height = header->png.height;
  } else if (is_webp(data, size)) {
    header->format = ImageFormat::kWebp;
    r = read_webp(data, size, &header->webp, reason);
    header->width = header->webp.width;
    header->height = header->webp.height;
  } else {
    // Too short to tell what it is (an empty file, say) asks for more; the caller has no more to give.
    if (size < 12) return HeaderParse::kNeedMore;
    header->other = sniff_image_format(data, size);
    header->format = *header->other ? ImageFormat::kOther : ImageFormat::kUnknown;
    return HeaderParse::kOk;
  }
  if (r != HeaderParse::kOk) return r;
  if (static_cast<int64_t>(header->width) * header->height > kMaxImagePixels)
    return fail(reason, "unsupported: " + std::to_string(header->width) + "x" + std::to_string(header->height) +
                            " pixels, more than Pillow's decompression-bomb limit of " + std::to_string(kMaxImagePixels));
  return HeaderParse::kOk;
}

std::string header_truncation(const ImageHeader& header, const char* what) {
  return header.format == ImageFormat::kUnknown
             ? std::string("truncated: the ") + what + " ends before any image format's header"
             : std::string("truncated: the ") + what + " ends inside the " + image_format_name(header.format) +
                   " header";
}

std::string image_truncation(const uint8_t* data, size_t size, const ImageHeader& header) {
  switch (header.format) {
    case ImageFormat::kJpeg:
      return jpeg_has_end(data, size, header.jpeg) ? "" : "truncated: no end-of-image marker after the image data";
    case ImageFormat::kPng: return png_truncation(data, size);
    case ImageFormat::kWebp: return header.webp.animated ? "" : webp_truncation(data, size);  // frames: Pillow's
    default: return "";
  }
}

}  // namespace fastpipe
