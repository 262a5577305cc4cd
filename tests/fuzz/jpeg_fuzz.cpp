// libFuzzer harness of the JPEG path one image takes in a reader thread (csrc/core/image_column.cpp's
// read_image, in memory): the header parser (jpeg_header.cpp), the transform's geometry and taps
// (cuda/image_transform.h), the region decode with libjpeg (jpeg_decode.cpp) and the resample
// (resample.cpp). Input: 4 control bytes (transform, output height, output width, flags), then the file.
// A clean end is an accepted image or an error; a sanitizer report or a broken invariant
// (__builtin_trap) is a finding. Invariants: an accepted header has a size and a scan inside the data,
// the taps region lies inside the decoded image, every tap inside the region, and float outputs are
// finite.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/image_scan.h"
#include "core/jpeg_decode.h"
#include "core/jpeg_header.h"
#include "core/resample.h"
#include "cuda/image_transform.h"
#include "fuzz_check.h"

using namespace fastpipe;

namespace {

// Larger images are parsed but not decoded: a progressive one holds all its coefficients (fuzzing is
// about our code, not libjpeg's appetite for memory).
constexpr int64_t kMaxPixels = 4 << 20;

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
  JpegInfo info;
  std::string why;
  const JpegParse r = read_jpeg_info(data, n, &info, &why);
  if (r == JpegParse::kError) CHECK(!why.empty());
  if (r != JpegParse::kOk) return 0;
  CHECK(info.sos_offset >= 2 && static_cast<size_t>(info.sos_offset) + 2 <= n);
  CHECK(info.width >= 0 && info.width <= 65535 && info.height >= 0 && info.height <= 65535);
  if (!check_jpeg(data, n, &info).empty()) return 0;
  CHECK(info.width >= 1 && info.height >= 1);
  if (static_cast<int64_t>(info.width) * info.height > kMaxPixels) return 0;

  const images::ImageTransformParams p = params(input);
  const images::Geometry g = images::image_geometry(p, info.height, info.width, input[1], input[2]);
  CHECK(g.denom >= 1 && g.denom <= p.max_dct_denom);
  const int sh = images::scaled_size(info.height, g.denom), sw = images::scaled_size(info.width, g.denom);
  const images::Region region = images::taps_region(g);
  CHECK(region.y0 >= 0 && region.y1 <= sh && region.x0 >= 0 && region.x1 <= sw);
  check_taps(g.y, p.out_height, region.y0, region.y1);
  check_taps(g.x, p.out_width, region.x0, region.x1);

  static JpegDecoder decoder;
  static ResampleScratch scratch;
  const uint8_t* pixels = nullptr;
  int64_t stride = 0;
  if (region.y1 > region.y0 && region.x1 > region.x0) {
    try {
      pixels = decoder.decode(data, n, info, g.denom, region, &stride);
    } catch (const std::runtime_error&) {
      return 0;  // corrupt data: the clean end
    }
    CHECK(stride >= 3 * static_cast<int64_t>(region.x1 - region.x0));
  }
  std::vector<float> out(static_cast<size_t>(images::out_image_elements(p)));  // big enough for any dtype
  resample_image(p, g, pixels, stride, region, out.data(), scratch);
  if (p.out_dtype == images::OutDtype::Float32)
    for (float v : out) CHECK(std::isfinite(v));
  return 0;
}
