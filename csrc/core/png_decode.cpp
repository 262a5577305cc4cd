#include "core/png_decode.h"

#include <atomic>
#include <cstring>
#include <stdexcept>
#include <string>

#ifdef FASTPIPE_WITH_PNG
#include <spng.h>
#endif

namespace fastpipe {

#ifdef FASTPIPE_WITH_PNG

namespace {

struct Context {
  // Checksums are not verified, as Pillow verifies none over the image data (what torchvision reads, read
  // here too); zlib still stops at data that does not inflate. Saves ~6% of a decode.
  spng_ctx* ctx = spng_ctx_new(SPNG_CTX_IGNORE_ADLER32);
  ~Context() { spng_ctx_free(ctx); }
};

void check(int err) {
  if (err != 0) throw std::runtime_error(spng_strerror(err));
}

// Sample x of a row of 1, 2 or 4-bit samples, packed from the high bit down.
inline int packed_sample(const uint8_t* row, int x, int depth) {
  const int bit = x * depth;
  return (row[bit >> 3] >> (8 - depth - (bit & 7))) & ((1 << depth) - 1);
}

// Columns [x0, x1) of one row of the PNG's samples (libspng's SPNG_FMT_PNG: 16-bit host-endian) as Pillow
// converts them to RGB; `palette`: 256 RGB entries, black past the PNG's.
void row_to_rgb(const uint8_t* row, const PngInfo& info, const uint8_t* palette, int x0, int x1, uint8_t* out) {
  const int depth = info.bit_depth;
  auto sample16 = [row](int k) {
    uint16_t v;
    std::memcpy(&v, row + 2 * k, 2);
    return v;
  };
  auto grey = [&](int v) {
    out[0] = out[1] = out[2] = static_cast<uint8_t>(v);
    out += 3;
  };
  switch (info.color_type) {
    case 0:  // grey: 1, 2, 4-bit scaled to 0-255 ("1", "L;2", "L;4"); 16-bit clipped ("I;16")
      for (int x = x0; x < x1; ++x) {
        if (depth == 16) {
          grey(sample16(x) > 255 ? 255 : sample16(x));
        } else if (depth == 8) {
          grey(row[x]);
        } else {
          grey(packed_sample(row, x, depth) * (255 / ((1 << depth) - 1)));
        }
      }
      return;
    case 3:  // palette
      for (int x = x0; x < x1; ++x, out += 3) {
        const uint8_t* c = palette + 3 * (depth == 8 ? row[x] : packed_sample(row, x, depth));
        out[0] = c[0];
        out[1] = c[1];
        out[2] = c[2];
      }
      return;
    default: {  // 2 RGB, 4 grey + alpha, 6 RGBA: 16-bit samples keep their high byte, alpha is dropped
      const int channels = info.color_type == 2 ? 3 : info.color_type == 4 ? 2 : 4;
      for (int x = x0; x < x1; ++x, out += 3) {
        for (int c = 0; c < 3; ++c) {
          const int k = x * channels + (info.color_type == 4 ? 0 : c);
          out[c] = depth == 16 ? static_cast<uint8_t>(sample16(k) >> 8) : row[k];
        }
      }
    }
  }
}

}  // namespace

namespace {
std::atomic<size_t> interlaced_budget{kMaxInterlacedBytes};
constexpr size_t kKeepBytes = size_t{16} << 20;  // a buffer larger than this is freed after its image
}  // namespace

void set_interlaced_budget(size_t bytes) { interlaced_budget = bytes ? bytes : kMaxInterlacedBytes; }

bool png_decoding_built() { return true; }
std::string png_library_version() { return std::string("libspng ") + spng_version_string(); }

const uint8_t* PngDecoder::decode(const uint8_t* data, size_t size, const PngInfo& info, const images::Region& r,
                                  int64_t* stride) {
  Context c;
  if (!c.ctx) throw std::runtime_error("libspng could not allocate its context");
  check(spng_set_png_buffer(c.ctx, data, size));
  check(spng_set_crc_action(c.ctx, SPNG_CRC_USE, SPNG_CRC_DISCARD));
  // The image's size was checked against kMaxImagePixels; metadata chunks (text, profiles) are bounded
  // by the file, and their decompressed copies to 16 MiB.
  check(spng_set_image_limits(c.ctx, static_cast<uint32_t>(info.width), static_cast<uint32_t>(info.height)));
  check(spng_set_chunk_limits(c.ctx, size, 16 << 20));
  size_t image_bytes = 0;
  check(spng_decoded_image_size(c.ctx, SPNG_FMT_PNG, &image_bytes));
  const size_t row_bytes = image_bytes / static_cast<size_t>(info.height);
  uint8_t palette[256 * 3] = {};
  if (info.color_type == 3) {
    spng_plte plte;
    check(spng_get_plte(c.ctx, &plte));
    for (uint32_t k = 0; k < plte.n_entries && k < 256; ++k) {
      palette[3 * k] = plte.entries[k].red;
      palette[3 * k + 1] = plte.entries[k].green;
      palette[3 * k + 2] = plte.entries[k].blue;
    }
  }
  const int64_t out_row = static_cast<int64_t>(r.x1 - r.x0) * 3;
  pixels_.resize(static_cast<size_t>(out_row * (r.y1 - r.y0)));
  *stride = out_row;
  if (info.interlaced) {
    // Adam7 spreads every row over seven passes: the whole image is decoded, then the region converted.
    const size_t budget = interlaced_budget.load(std::memory_order_relaxed);
    if (image_bytes > budget)
      throw std::runtime_error("an interlaced PNG of " + std::to_string(info.width) + "x" +
                               std::to_string(info.height) + " is decoded whole (Adam7 spreads each row over seven "
                               "passes): " + std::to_string(image_bytes >> 20) + " MiB of samples, over the " +
                               std::to_string(budget >> 20) + " MiB a reader thread may hold for one image; save it "
                               "without interlacing");
    rows_.resize(image_bytes);
    check(spng_decode_image(c.ctx, rows_.data(), image_bytes, SPNG_FMT_PNG, 0));
    for (int y = r.y0; y < r.y1; ++y)
      row_to_rgb(rows_.data() + static_cast<size_t>(y) * row_bytes, info, palette, r.x0, r.x1,
                 pixels_.data() + (y - r.y0) * out_row);
    if (image_bytes > kKeepBytes) std::vector<uint8_t>().swap(rows_);  // not held between images
    return pixels_.data();
  }
  rows_.resize(row_bytes);
  check(spng_decode_image(c.ctx, nullptr, 0, SPNG_FMT_PNG, SPNG_DECODE_PROGRESSIVE));
  for (int y = 0; y < r.y1; ++y) {
    const int err = spng_decode_row(c.ctx, rows_.data(), row_bytes);
    if (err != 0 && !(err == SPNG_EOI && y == info.height - 1)) check(err);
    if (y >= r.y0) row_to_rgb(rows_.data(), info, palette, r.x0, r.x1, pixels_.data() + (y - r.y0) * out_row);
  }
  return pixels_.data();
}

#else  // built without libspng

void set_interlaced_budget(size_t) {}

bool png_decoding_built() { return false; }
std::string png_library_version() { return ""; }

const uint8_t* PngDecoder::decode(const uint8_t*, size_t, const PngInfo&, const images::Region&, int64_t*) {
  throw std::runtime_error("fastpipe was built without libspng (PNG decoding in the reader threads)");
}

#endif

}  // namespace fastpipe
