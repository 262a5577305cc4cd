#include "core/jpeg_header.h"

#include <cstring>

namespace fastpipe {
namespace {

int be16(const uint8_t* p) { return (p[0] << 8) | p[1]; }

// The EXIF orientation from an APP1 payload (starting at "Exif\0\0"); 1 when absent or malformed.
int exif_orientation(const uint8_t* p, size_t n) {
  if (n < 6 + 8 || std::memcmp(p, "Exif\0\0", 6) != 0) return 1;
  const uint8_t* t = p + 6;  // the TIFF header
  const size_t tn = n - 6;
  bool little;
  if (t[0] == 'I' && t[1] == 'I') {
    little = true;
  } else if (t[0] == 'M' && t[1] == 'M') {
    little = false;
  } else {
    return 1;
  }
  auto u16 = [&](size_t off) { return little ? t[off] | (t[off + 1] << 8) : (t[off] << 8) | t[off + 1]; };
  auto u32 = [&](size_t off) {
    return little ? static_cast<uint32_t>(t[off]) | (static_cast<uint32_t>(t[off + 1]) << 8) |
                        (static_cast<uint32_t>(t[off + 2]) << 16) | (static_cast<uint32_t>(t[off + 3]) << 24)
                  : (static_cast<uint32_t>(t[off]) << 24) | (static_cast<uint32_t>(t[off + 1]) << 16) |
                        (static_cast<uint32_t>(t[off + 2]) << 8) | static_cast<uint32_t>(t[off + 3]);
  };
  if (u16(2) != 42) return 1;
  const uint32_t ifd = u32(4);
  if (ifd > tn || tn - ifd < 2) return 1;
  const int entries = u16(ifd);
  for (int k = 0; k < entries; ++k) {
    const size_t e = ifd + 2 + static_cast<size_t>(k) * 12;
    if (e > tn || tn - e < 12) return 1;
    if (u16(e) == 0x0112) {
      const int type = u16(e + 2);
      const int v = type == 3 ? u16(e + 8) : -1;  // SHORT, stored in the entry's value field
      return v >= 1 && v <= 8 ? v : 1;
    }
  }
  return 1;
}

bool is_sof(int m) { return m >= 0xC0 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC; }

}  // namespace

JpegParse read_jpeg_info(const uint8_t* data, size_t size, JpegInfo* info, std::string* reason) {
  *info = JpegInfo{};
  auto fail = [&](const std::string& why) {
    *reason = why;
    return JpegParse::kError;
  };
  if (size < 2) return size == 0 || data[0] == 0xFF ? JpegParse::kNeedMore : fail("not a JPEG");
  if (data[0] != 0xFF || data[1] != 0xD8) {
    const char* what = sniff_image_format(data, size);
    return fail(*what ? std::string("not a JPEG: the data is ") + what : std::string("not a JPEG (no start-of-image marker)"));
  }
  size_t pos = 2;
  bool have_frame = false;
  for (;;) {
    // A marker: one or more 0xFF fill bytes, then its code.
    if (pos >= size) return JpegParse::kNeedMore;
    if (data[pos] != 0xFF)
      return fail("malformed JPEG header: expected a marker at byte " + std::to_string(pos));
    while (pos < size && data[pos] == 0xFF) ++pos;
    if (pos >= size) return JpegParse::kNeedMore;
    const int m = data[pos++];
    const size_t marker_at = pos - 2;
    if (m == 0xD8) return fail("malformed JPEG header: a second start-of-image marker");
    if (m == 0xD9) return fail("malformed JPEG header: the image ends before any image data");
    if (m == 0x01 || (m >= 0xD0 && m <= 0xD7)) continue;  // no length
    if (m == 0x00) return fail("malformed JPEG header: a stuffed byte outside image data");
    if (size - pos < 2) return JpegParse::kNeedMore;
    const int len = be16(data + pos);
    if (len < 2) return fail("malformed JPEG header: a segment length of " + std::to_string(len));
    if (m == 0xDA) {
      if (!have_frame) return fail("malformed JPEG header: image data before the frame header");
      info->sos_offset = static_cast<int64_t>(marker_at);
      return JpegParse::kOk;
    }
    if (size - pos < static_cast<size_t>(len)) return JpegParse::kNeedMore;
    const uint8_t* seg = data + pos + 2;
    const size_t n = static_cast<size_t>(len) - 2;
    if (is_sof(m)) {
      if (have_frame) return fail("malformed JPEG header: a second frame header");
      if (n < 6) return fail("malformed JPEG header: a frame header of " + std::to_string(n) + " bytes");
      info->sof = m - 0xC0;
      info->precision = seg[0];
      info->height = be16(seg + 1);
      info->width = be16(seg + 3);
      info->components = seg[5];
      if (n < 6 + 3 * static_cast<size_t>(info->components))
        return fail("malformed JPEG header: a frame header too short for its " + std::to_string(info->components) +
                    " components");
      for (int c = 0; c < info->components && c < 4; ++c) {
        info->h_samp[c] = seg[6 + 3 * c + 1] >> 4;
        info->v_samp[c] = seg[6 + 3 * c + 1] & 15;
      }
      have_frame = true;
    } else if (m == 0xEE && n >= 12 && std::memcmp(seg, "Adobe", 5) == 0) {
      info->adobe_transform = seg[11];
    } else if (m == 0xE1 && info->orientation == 1) {
      info->orientation = exif_orientation(seg, n);
    }
    pos += static_cast<size_t>(len);
  }
}

const char* sniff_image_format(const uint8_t* d, size_t n) {
  auto starts = [&](const char* magic, size_t len) { return n >= len && std::memcmp(d, magic, len) == 0; };
  if (starts("\x89PNG\r\n\x1a\n", 8)) return "PNG";
  if (starts("GIF87a", 6) || starts("GIF89a", 6)) return "GIF";
  if (starts("BM", 2)) return "BMP";
  if (n >= 12 && std::memcmp(d, "RIFF", 4) == 0 && std::memcmp(d + 8, "WEBP", 4) == 0) return "WebP";
  if (starts("II*\0", 4) || starts("MM\0*", 4)) return "TIFF";
  if (starts("\0\0\0\x0cjP  ", 8) || starts("\xff\x4f\xff\x51", 4)) return "JPEG 2000";
  if (n >= 12 && std::memcmp(d + 4, "ftyp", 4) == 0) return "HEIF/AVIF";
  if (starts("P1", 2) || starts("P2", 2) || starts("P3", 2) || starts("P4", 2) || starts("P5", 2) || starts("P6", 2))
    return "PNM";
  return "";
}

const char* jpeg_process_name(int sof) {
  switch (sof) {
    case 0: return "baseline";
    case 1: return "extended sequential";
    case 2: return "progressive";
    case 3: return "lossless";
    case 9: return "arithmetic sequential";
    case 10: return "arithmetic progressive";
    case 11: return "arithmetic lossless";
    default: return "hierarchical";
  }
}

std::string jpeg_unsupported_reason(const JpegInfo& info) {
  if (!(info.sof == 0 || info.sof == 1 || info.sof == 2 || info.sof == 9 || info.sof == 10))
    return std::string("a ") + jpeg_process_name(info.sof) + " JPEG (only baseline, extended and progressive ones are decoded)";
  if (info.precision != 8) return std::to_string(info.precision) + "-bit samples (only 8-bit JPEGs are decoded)";
  if (info.components != 1 && info.components != 3 && info.components != 4)
    return std::to_string(info.components) + " colour components (1, 3 or 4 are decoded)";
  if (info.height == 0) return "no height in the frame header (a DNL marker, which is not supported)";
  if (info.width == 0) return "a width of 0";
  for (int c = 0; c < info.components; ++c)
    if (info.h_samp[c] < 1 || info.h_samp[c] > 4 || info.v_samp[c] < 1 || info.v_samp[c] > 4)
      return "invalid sampling factors " + std::to_string(info.h_samp[c]) + "x" + std::to_string(info.v_samp[c]);
  return "";
}

bool jpeg_has_end(const uint8_t* data, size_t size, const JpegInfo& info) {
  // Searched backwards: an EOI marker (FF D9) cannot occur inside entropy-coded data (0xFF is stuffed there),
  // and files often carry padding after it.
  for (size_t k = size; k >= static_cast<size_t>(info.sos_offset) + 2; --k)
    if (data[k - 2] == 0xFF && data[k - 1] == 0xD9) return true;
  return false;
}

const char* device_jpeg_planes(const JpegInfo& info, images::YccPlanes* planes) {
  if (info.sof != 0) return "not a baseline JPEG";
  if (info.components == 3) {
    const bool chroma_1x1 = info.h_samp[1] == 1 && info.v_samp[1] == 1 && info.h_samp[2] == 1 && info.v_samp[2] == 1;
    const int h = info.h_samp[0], v = info.v_samp[0];
    if (!chroma_1x1 || !((h == 1 || h == 2 || h == 4) && (v == 1 || v == 2))) return "nonstandard chroma subsampling";
    // Adobe's transform 0: the components are RGB, which libjpeg does not convert (the device would).
    if (info.adobe_transform == 0) return "RGB components (Adobe transform 0)";
  } else if (info.components != 1) {
    return "not grayscale or YCbCr";
  }
  // Chroma 1x1: Y's factors are the ratios.
  *planes = images::ycc_planes(info.height, info.width, info.v_samp[0], info.h_samp[0], info.components == 1);
  return nullptr;
}

}  // namespace fastpipe
