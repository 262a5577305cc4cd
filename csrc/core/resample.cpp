#include "core/resample.h"

#include <algorithm>
#include <cstring>

namespace fastpipe {
namespace {

using images::Axis;
using images::ImageTransformParams;
using images::kChannels;
using images::OutDtype;

// Four floats in one register: a pixel's R, G, B (and a lane that is ignored). GCC's and clang's
// vector extension: SSE2 on any x86-64, NEON on ARM, no CPU dispatch needed.
using v4 = float __attribute__((vector_size(16)));

inline v4 load4(const float* p) {
  v4 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// Every output's taps along one axis: the first source pixel relative to the region (`start`) and the
// weights, zero-padded to the axis's most taps (the returned stride), so that every output reads the
// same number of taps. A padding output (no taps) reads from pixel 0 with zero weights.
int axis_taps(const Axis& a, int outputs, int start, std::vector<int>& first, std::vector<float>& weights) {
  const int stride = images::max_taps(a);
  first.resize(static_cast<size_t>(outputs));
  weights.assign(static_cast<size_t>(outputs) * stride, 0.0f);
  for (int o = 0; o < outputs; ++o) {
    int f = 0;
    const int n = images::output_taps(a, o, &f, weights.data() + static_cast<size_t>(o) * stride);
    first[o] = n > 0 ? a.origin + f - start : 0;
  }
  return stride;
}

// One output row's vertical taps over the region's whole width (n floats): K source rows weighted and
// summed in registers, one store per value; the compiler vectorises over j. K = 0: `taps` at run time.
template <int K>
void vertical(const float* const* rows, const float* w, int taps, int64_t n, float* __restrict__ out) {
  const int k = K ? K : taps;
  for (int64_t j = 0; j < n; ++j) {
    float acc = 0.0f;
    for (int t = 0; t < k; ++t) acc += w[t] * rows[t][j];
    out[j] = acc;
  }
}

// One output row's horizontal taps: per output pixel, K taps of a whole RGB pixel each (one unaligned
// 4-float load; `row` is padded so that the last pixel's load stays inside), written to the channel
// planes at the output's place (flipped or not).
template <int K>
void horizontal(const float* row, const int* first, const float* weights, int stride, int taps, int ow, bool flip,
                float* __restrict__ r, float* __restrict__ g, float* __restrict__ b) {
  const int k = K ? K : taps;
  for (int ox = 0; ox < ow; ++ox) {
    const float* px = row + 3 * static_cast<int64_t>(first[ox]);
    const float* w = weights + static_cast<int64_t>(ox) * stride;
    v4 acc = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int t = 0; t < k; ++t) acc += w[t] * load4(px + 3 * t);
    r[ox] = acc[0];
    g[ox] = acc[1];
    b[ox] = acc[2];
  }
  if (flip) {
    std::reverse(r, r + ow);
    std::reverse(g, g + ow);
    std::reverse(b, b + ow);
  }
}

template <OutDtype D>
struct Out;
template <>
struct Out<OutDtype::Float32> {
  using T = float;
  static T convert(float v) { return v; }
};
template <>
struct Out<OutDtype::Float16> {
  using T = uint16_t;
  static T convert(float v) { return transforms::float_to_half_bits(v); }
};
template <>
struct Out<OutDtype::BFloat16> {
  using T = uint16_t;
  static T convert(float v) { return transforms::float_to_bfloat16_bits(v); }
};
template <>
struct Out<OutDtype::UInt8> {
  using T = uint8_t;
  static T convert(float v) { return transforms::float_to_uint8(v); }
};

// A channel plane of one output row normalised, converted and stored kStep elements apart (1: NCHW,
// vectorised; 3: NHWC).
template <OutDtype D, int kStep>
void store(const float* __restrict__ plane, int n, float scale, float shift, typename Out<D>::T* __restrict__ dst) {
  if (D == OutDtype::UInt8) {
    // A resampled pixel is a weighted mean of pixels (weights >= 0): within [0, 255] but for rounding,
    // where rounding, then clamping the integer, is float_to_uint8's value; unlike its float clamps, it
    // vectorises.
    for (int x = 0; x < n; ++x) {
      const int v = static_cast<int>(plane[x] + 0.5f);
      dst[x * kStep] = static_cast<uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v));
    }
  } else {
    for (int x = 0; x < n; ++x) dst[x * kStep] = Out<D>::convert(plane[x] * scale + shift);
  }
}

// RandomErasing's box within an output row: n elements kStep apart set to `value` (the output's units).
template <OutDtype D, int kStep>
void fill(int n, float value, typename Out<D>::T* dst) {
  const typename Out<D>::T v = Out<D>::convert(value);
  for (int x = 0; x < n; ++x) dst[x * kStep] = v;
}

template <OutDtype D, int KY, int KX>
void resample(const ImageTransformParams& p, const images::Geometry& g, const uint8_t* src, int64_t stride,
              const images::Region& r, void* out_image, ResampleScratch& s) {
  using T = typename Out<D>::T;
  T* out = static_cast<T*>(out_image);
  const int oh = p.out_height, ow = p.out_width;
  const int ky = axis_taps(g.y, oh, r.y0, s.y_first, s.y_weights);
  const int kx = axis_taps(g.x, ow, r.x0, s.x_first, s.x_weights);
  const int64_t row_floats = static_cast<int64_t>(r.x1 - r.x0) * kChannels;
  // Padding: the taps past an output's own count (zero weights) and the lane after the last pixel.
  const int64_t padded = row_floats + 3 * static_cast<int64_t>(kx) + 4;
  s.row.resize(static_cast<size_t>(padded + 3 * ow));
  float* row = s.row.data();
  std::fill(row + row_floats, row + padded, 0.0f);
  float* planes[kChannels] = {row + padded, row + padded + ow, row + padded + 2 * ow};
  // The region as floats, each value converted once (an output row reads up to ky source rows).
  const int rh = r.y1 - r.y0;
  s.region.resize(static_cast<size_t>(std::max<int64_t>(1, rh * row_floats)));
  for (int y = 0; y < rh; ++y) {
    const uint8_t* in = src + y * stride;
    float* f = s.region.data() + y * row_floats;
    for (int64_t j = 0; j < row_floats; ++j) f[j] = static_cast<float>(in[j]);
  }
  const float* rows[64];
  std::vector<const float*> many;
  const float** taps_rows = rows;
  if (ky > 64) {
    many.resize(static_cast<size_t>(ky));
    taps_rows = many.data();
  }
  const int64_t plane = static_cast<int64_t>(oh) * ow;
  for (int oy = 0; oy < oh; ++oy) {
    const float* wy = s.y_weights.data() + static_cast<size_t>(oy) * ky;
    if (row_floats > 0 && std::any_of(wy, wy + ky, [](float w) { return w != 0.0f; })) {
      // Rows past this output's own taps have zero weights: any row of the region serves.
      const int first = s.y_first[oy], last = r.y1 - r.y0 - 1;
      for (int t = 0; t < ky; ++t) taps_rows[t] = s.region.data() + std::min(first + t, last) * row_floats;
      vertical<KY>(taps_rows, wy, ky, row_floats, row);
      horizontal<KX>(row, s.x_first.data(), s.x_weights.data(), kx, kx, ow, g.flip, planes[0], planes[1], planes[2]);
    } else {  // padding: the whole row is 0 before normalisation
      for (float* pl : planes) std::fill(pl, pl + ow, 0.0f);
    }
    const images::EraseBox& e = g.erase;
    const bool erased = oy >= e.top && oy < e.top + e.height && e.width > 0;
    for (int c = 0; c < kChannels; ++c) {
      if (p.out_nhwc) {
        typename Out<D>::T* dst = out + static_cast<int64_t>(oy) * ow * kChannels + c;
        store<D, kChannels>(planes[c], ow, p.scale[c], p.shift[c], dst);
        if (erased) fill<D, kChannels>(e.width, p.erase.value[c], dst + e.left * kChannels);
      } else {
        typename Out<D>::T* dst = out + c * plane + static_cast<int64_t>(oy) * ow;
        store<D, 1>(planes[c], ow, p.scale[c], p.shift[c], dst);
        if (erased) fill<D, 1>(e.width, p.erase.value[c], dst + e.left);
      }
    }
  }
}

// The taps per axis are 2 * ceil(max(step, 1)) + 1: 3 when enlarging, 5 for a shrink of up to 2x (the
// common case: DCT scaling leaves less than 2x), 7 up to 3x; others take the run-time count.
template <OutDtype D, int KY>
void resample_kx(const ImageTransformParams& p, const images::Geometry& g, const uint8_t* src, int64_t stride,
                 const images::Region& r, void* out, ResampleScratch& s) {
  switch (images::max_taps(g.x)) {
    case 3: return resample<D, KY, 3>(p, g, src, stride, r, out, s);
    case 5: return resample<D, KY, 5>(p, g, src, stride, r, out, s);
    case 7: return resample<D, KY, 7>(p, g, src, stride, r, out, s);
    default: return resample<D, KY, 0>(p, g, src, stride, r, out, s);
  }
}

template <OutDtype D>
void resample_dtype(const ImageTransformParams& p, const images::Geometry& g, const uint8_t* src, int64_t stride,
                    const images::Region& r, void* out, ResampleScratch& s) {
  switch (images::max_taps(g.y)) {
    case 3: return resample_kx<D, 3>(p, g, src, stride, r, out, s);
    case 5: return resample_kx<D, 5>(p, g, src, stride, r, out, s);
    case 7: return resample_kx<D, 7>(p, g, src, stride, r, out, s);
    default: return resample_kx<D, 0>(p, g, src, stride, r, out, s);
  }
}

// The augmented uint8 image `img` (3 planes) normalised, converted and erased into `out`, a row at a time.
template <OutDtype D>
void store_augmented(const ImageTransformParams& p, const images::EraseBox& e, const uint8_t* img, void* out_image,
                     ResampleScratch& s) {
  using T = typename Out<D>::T;
  T* out = static_cast<T*>(out_image);
  const int oh = p.out_height, ow = p.out_width;
  const int64_t plane = static_cast<int64_t>(oh) * ow;
  s.row.resize(static_cast<size_t>(ow));
  float* values = s.row.data();
  for (int oy = 0; oy < oh; ++oy) {
    const bool erased = oy >= e.top && oy < e.top + e.height && e.width > 0;
    for (int c = 0; c < kChannels; ++c) {
      const uint8_t* px = img + c * plane + static_cast<int64_t>(oy) * ow;
      for (int x = 0; x < ow; ++x) values[x] = static_cast<float>(px[x]);
      if (p.out_nhwc) {
        T* dst = out + static_cast<int64_t>(oy) * ow * kChannels + c;
        store<D, kChannels>(values, ow, p.scale[c], p.shift[c], dst);
        if (erased) fill<D, kChannels>(e.width, p.erase.value[c], dst + e.left * kChannels);
      } else {
        T* dst = out + c * plane + static_cast<int64_t>(oy) * ow;
        store<D, 1>(values, ow, p.scale[c], p.shift[c], dst);
        if (erased) fill<D, 1>(e.width, p.erase.value[c], dst + e.left);
      }
    }
  }
}

// Resized to uint8 (rounded, without the erasing), augmented, then stored as p asks.
void resample_augmented(const ImageTransformParams& p, const images::Geometry& g, const uint8_t* src, int64_t stride,
                        const images::Region& region, void* out, ResampleScratch& s) {
  ImageTransformParams resized = p;
  resized.out_dtype = OutDtype::UInt8;
  resized.out_nhwc = false;  // planes
  images::Geometry whole = g;
  whole.erase = images::EraseBox{};
  s.augment.image.resize(static_cast<size_t>(p.out_height) * p.out_width * kChannels);
  resample_dtype<OutDtype::UInt8>(resized, whole, src, stride, region, s.augment.image.data(), s);
  augment_image(g.ops, p.augment.fill, p.out_height, p.out_width, s.augment);
  const uint8_t* img = s.augment.image.data();
  switch (p.out_dtype) {
    case OutDtype::Float32: return store_augmented<OutDtype::Float32>(p, g.erase, img, out, s);
    case OutDtype::Float16: return store_augmented<OutDtype::Float16>(p, g.erase, img, out, s);
    case OutDtype::BFloat16: return store_augmented<OutDtype::BFloat16>(p, g.erase, img, out, s);
    case OutDtype::UInt8: return store_augmented<OutDtype::UInt8>(p, g.erase, img, out, s);
  }
}

}  // namespace

void resample_image(const ImageTransformParams& p, const images::Geometry& g, const uint8_t* src, int64_t stride,
                    const images::Region& region, void* out, ResampleScratch& s) {
  if (p.augment.stages > 0) {
    return resample_augmented(p, g, src, stride, region, out, s);
  }
  switch (p.out_dtype) {
    case OutDtype::Float32: return resample_dtype<OutDtype::Float32>(p, g, src, stride, region, out, s);
    case OutDtype::Float16: return resample_dtype<OutDtype::Float16>(p, g, src, stride, region, out, s);
    case OutDtype::BFloat16: return resample_dtype<OutDtype::BFloat16>(p, g, src, stride, region, out, s);
    case OutDtype::UInt8: return resample_dtype<OutDtype::UInt8>(p, g, src, stride, region, out, s);
  }
}

}  // namespace fastpipe
