// libFuzzer harness of the path one JPEG, PNG or WebP takes in a reader thread (csrc/core/image_column.cpp's
// read_image, in memory): the header parsers (image_format.cpp, jpeg_header.cpp), the completeness check,
// the transform's geometry and taps (kernels/image_transform.h), the region decode (libjpeg, libspng or
// libwebp: jpeg_decode.cpp, png_decode.cpp, webp_decode.cpp), the resample (resample.cpp) and, with the
// transform byte's top bit, every augmentation op (augment.cpp). Input: 4 control bytes (transform,
// output height, output width, flags), then the file. A clean end is an
// accepted image or an error; a sanitizer report or a broken invariant (__builtin_trap) is a finding.
// Invariants: an accepted header has a size (a JPEG's scan inside the data), the taps region lies inside
// the decoded image, every tap inside the region, the decoder returns the region's pixels, and float
// outputs are finite.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/image_scan.h"
#include "core/jpeg_decode.h"
#include "core/png_decode.h"
#include "core/resample.h"
#include "core/webp_decode.h"
#include "kernels/image_transform.h"
#include "fuzz_check.h"

using namespace fastpipe;

namespace {

// Larger images are parsed but not decoded: a progressive JPEG or an interlaced PNG is held whole
// (fuzzing is about our code, not the libraries' appetite for memory).
constexpr int64_t kMaxPixels = 4 << 20;

// Every augmentation op (augment_ops.h) at the ends and the middle of its magnitudes, 3 ops a sample,
// then a colour jitter over the widest ranges, a grayscale half the time (or an AugMix, for some seeds) and
// a blur whose kernel fits; the geometric ops sampled bilinearly, with each fill blend, for half the
// seeds (bicubically for a quarter), and rounded each way.
void add_augmentations(images::ImageTransformParams& p) {
  images::AugmentParams& a = p.augment;
  const float extremes[][3] = {{0, 0, 0},      {-0.99f, 0.3f, 0.99f}, {-0.99f, 0.3f, 0.99f}, {-32, 7, 32},
                               {-32, 7, 32},    {-135, 90, 180},       {-0.99f, 0, 0.99f},    {-0.99f, 0, 0.99f},
                               {-0.99f, 0, 0.99f}, {-0.99f, 0, 0.99f}, {0, 4, 8},             {0, 0.5f, 1},
                               {0, 0, 0},      {0, 0, 0},             {0, 0, 0},             {-0.5f, 0.1f, 0.5f}};
  for (int op = 0; op < 16; ++op) {
    a.candidate[op] = images::AugmentCandidate{op, 0, 1.0f, 3 * op, 3};
    for (int k = 0; k < 3; ++k) a.magnitudes[3 * op + k] = extremes[op][k];
  }
  a.candidates = 16;
  a.stages = 4;
  a.stage[0].kind = static_cast<int32_t>(images::AugmentStageKind::kOneOf);
  a.stage[0].num_ops = 3;
  a.stage[0].count = 16;
  images::AugmentStage& jitter = a.stage[1];
  jitter.kind = static_cast<int32_t>(images::AugmentStageKind::kColorJitter);
  for (int k = 0; k < 4; ++k) {
    jitter.jitter[k] = 1;
    jitter.lo[k] = k == 3 ? -0.5f : 0.0f;
    jitter.hi[k] = k == 3 ? 0.5f : 3.0f;
  }
  a.stage[2].kind = static_cast<int32_t>(images::AugmentStageKind::kGrayscale);
  a.stage[2].p = 0.5f;
  if (p.seed & 64) {  // an AugMix of 2 chains of 2 ops over every op instead
    images::AugmentStage& augmix = a.stage[2];
    augmix.kind = static_cast<int32_t>(images::AugmentStageKind::kAugMix);
    augmix.num_ops = 2;
    augmix.chains = 2;
    augmix.alpha = 0.3f;
    augmix.count = 16;
  }
  images::AugmentStage& blur = a.stage[3];
  blur.kind = static_cast<int32_t>(images::AugmentStageKind::kBlur);
  blur.lo[0] = 0.1f;
  blur.hi[0] = 5.0f;
  blur.taps[0] = 2 * std::min(p.out_width - 1, 11) + 1;
  blur.taps[1] = 2 * std::min(p.out_height - 1, 11) + 1;
  a.fill[0] = 7;
  a.sampling.bilinear = static_cast<int32_t>(p.seed & 1);
  a.sampling.bicubic = static_cast<int32_t>((p.seed >> 6 & 1) && !(p.seed & 1));
  a.sampling.blend = static_cast<int32_t>(p.seed / 2 % 3);
  a.sampling.fill[0] = 7.5f;
  a.sampling.grid_fma = static_cast<int32_t>(p.seed >> 3 & 1);
  a.sampling.unnormalize_fma = static_cast<int32_t>(p.seed >> 4 & 1);
  a.sampling.interpolate_fma = static_cast<int32_t>(p.seed >> 5 & 1);
}

images::ImageTransformParams params(const uint8_t* c) {
  images::ImageTransformParams p;
  p.mode = c[0] & 1 ? images::CropMode::kRandomResized : images::CropMode::kCenter;
  p.out_height = 1 + c[1] % 64;
  p.out_width = 1 + c[2] % 64;
  p.resize_short = (c[0] >> 1) % 4 == 1 ? 1 + c[1] : 0;
  if ((c[0] >> 1) % 4 == 2) {
    p.resize_height = 1 + c[2];
    p.resize_width = 1 + c[1];
  }
  p.area_min = 0.01 + (c[3] & 15) / 16.0 * 0.9;
  p.ratio_min = 0.2 + (c[3] >> 4) / 16.0;
  p.ratio_max = p.ratio_min * 3;
  p.mirror = c[0] & 8 ? 1.0f : 0.0f;
  p.out_nhwc = c[0] & 16;
  p.out_dtype = static_cast<images::OutDtype>((c[0] >> 5) & 3);
  p.max_dct_denom = 1 << ((c[3] >> 2) & 3);
  p.seed = c[1] * 131u + c[2];
  // Every filter in every arithmetic (the fixed-point passes in either order).
  p.filter = static_cast<images::Filter>(p.seed % 3);
  p.resize_as = static_cast<images::ResizeAs>(p.seed / 3 % 3);
  p.pil_vertical_first = p.seed & 4;
  if (c[0] & 128) add_augmentations(p);
  return p;
}

void check_taps(const images::Axis& a, int outputs, int lo, int hi) {
  std::vector<float> w(static_cast<size_t>(images::max_taps(a)));
  for (int o = 0; o < outputs; ++o) {
    int first = 0;
    const int n = images::output_taps(a, o, &first, w.data());
    CHECK(n >= 0 && n <= images::max_taps(a));
    if (n > 0) CHECK(a.origin + first >= lo && a.origin + first + n <= hi);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* input, size_t size) {
  if (size < 4) return 0;
  const uint8_t* data = input + 4;
  const size_t n = size - 4;
  ImageHeader h;
  std::string why;
  const HeaderParse r = read_image_header(data, n, &h, &why);
  if (r == HeaderParse::kError) CHECK(!why.empty());
  if (r != HeaderParse::kOk) return 0;
  if (h.format == ImageFormat::kJpeg) {
    CHECK(h.jpeg.sos_offset >= 2 && static_cast<size_t>(h.jpeg.sos_offset) + 2 <= n);
    CHECK(h.width <= 65535 && h.height <= 65535);
  }
  if (h.format == ImageFormat::kOther || h.format == ImageFormat::kUnknown) {
    CHECK(h.width == 0 && h.height == 0);
    return 0;  // the fallback decoder's (Pillow's)
  }
  if (h.format == ImageFormat::kWebp && h.webp.animated) return 0;
  CHECK(h.width >= 1 && h.height >= 1);
  if (h.format != ImageFormat::kJpeg) CHECK(static_cast<int64_t>(h.width) * h.height <= kMaxImagePixels);
  if (!image_truncation(data, n, h).empty()) return 0;
  if (static_cast<int64_t>(h.width) * h.height > kMaxPixels) return 0;

  images::ImageTransformParams p = params(input);
  if (h.format != ImageFormat::kJpeg) p.max_dct_denom = 1;
  const images::Geometry g = images::image_geometry(p, h.height, h.width, input[1], input[2]);
  CHECK(g.denom >= 1 && g.denom <= p.max_dct_denom);
  const int sh = images::scaled_size(h.height, g.denom), sw = images::scaled_size(h.width, g.denom);
  const images::Region region = images::taps_region(g);
  CHECK(region.y0 >= 0 && region.y1 <= sh && region.x0 >= 0 && region.x1 <= sw);
  check_taps(g.y, p.out_height, region.y0, region.y1);
  check_taps(g.x, p.out_width, region.x0, region.x1);

  static JpegDecoder jpeg;
  static PngDecoder png;
  static WebpDecoder webp;
  static ResampleScratch scratch;
  const uint8_t* pixels = nullptr;
  int64_t stride = 0;
  if (region.y1 > region.y0 && region.x1 > region.x0) {
    try {
      if (h.format == ImageFormat::kJpeg) {
        pixels = jpeg.decode(data, n, h.jpeg, g.denom, region, &stride);
      } else if (h.format == ImageFormat::kPng) {
        pixels = png.decode(data, n, h.png, region, &stride);
      } else {
        pixels = webp.decode(data, n, h.webp, region, &stride);
      }
    } catch (const std::runtime_error&) {
      return 0;  // corrupt data: the clean end
    }
    CHECK(stride >= 3 * static_cast<int64_t>(region.x1 - region.x0));
    // Every pixel of the region is readable (ASan reports a short buffer here).
    uint32_t sum = 0;
    for (int y = 0; y < region.y1 - region.y0; ++y)
      for (int x = 0; x < 3 * (region.x1 - region.x0); ++x) sum += pixels[y * stride + x];
    CHECK(sum != 0xFFFFFFFFu);
  }
  std::vector<float> out(static_cast<size_t>(images::out_image_elements(p)));  // big enough for any dtype
  resample_image(p, g, pixels, stride, region, out.data(), scratch);
  if (p.out_dtype == images::OutDtype::Float32)
    for (float v : out) CHECK(std::isfinite(v));
  return 0;
}
