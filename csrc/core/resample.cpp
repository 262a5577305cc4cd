#include "core/resample.h"

#include <algorithm>

namespace fastpipe {
namespace {

using images::Axis;
using images::ImageTransformParams;
using images::OutDtype;
using images::kChannels;

// Every output's taps along one axis: the first source pixel relative to the region (`start`), the
// count, and the weights in rows of `stride` floats. Returns the stride (the axis's most taps).
int axis_taps(const Axis& a, int outputs, int start, std::vector<int>& first, std::vector<int>& count,
              std::vector<float>& weights) {
  const int stride = images::max_taps(a);
  first.resize(static_cast<size_t>(outputs));
  count.resize(static_cast<size_t>(outputs));
  weights.assign(static_cast<size_t>(outputs) * stride, 0.0f);
  for (int o = 0; o < outputs; ++o) {
    int f = 0;
    count[o] = images::output_taps(a, o, &f, weights.data() + static_cast<size_t>(o) * stride);
    first[o] = a.origin + f - start;
  }
  return stride;
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

// Vertical taps of one output row over the region's whole width (3 * width floats): a weighted sum of
// source rows, which the compiler vectorises.
void vertical(const uint8_t* first_row, int64_t stride, const float* w, int taps, int64_t n, float* row) {
  for (int64_t j = 0; j < n; ++j) row[j] = w[0] * static_cast<float>(first_row[j]);
  for (int t = 1; t < taps; ++t) {
    const uint8_t* src = first_row + t * stride;
    const float wt = w[t];
    for (int64_t j = 0; j < n; ++j) row[j] += wt * static_cast<float>(src[j]);
  }
}

template <OutDtype D, bool kNhwc>
void resample(const ImageTransformParams& p, const images::Geometry& g, const uint8_t* src, int64_t stride,
              const images::Region& r, void* out_image, ResampleScratch& s) {
  using T = typename Out<D>::T;
  T* out = static_cast<T*>(out_image);
  const int oh = p.out_height, ow = p.out_width;
  const int ky = axis_taps(g.y, oh, r.y0, s.y_first, s.y_count, s.y_weights);
  const int kx = axis_taps(g.x, ow, r.x0, s.x_first, s.x_count, s.x_weights);
  const int64_t row_floats = static_cast<int64_t>(r.x1 - r.x0) * kChannels;
  s.row.resize(static_cast<size_t>(std::max<int64_t>(row_floats, 1)));
  float* row = s.row.data();
  const int64_t plane = static_cast<int64_t>(oh) * ow;
  auto put = [&](int64_t pixel, int c, float v) {
    out[kNhwc ? pixel * kChannels + c : c * plane + pixel] = Out<D>::convert(images::normalized(p, c, v));
  };
  for (int oy = 0; oy < oh; ++oy) {
    const int ny = s.y_count[oy];
    if (ny > 0) {
      vertical(src + s.y_first[oy] * stride, stride, s.y_weights.data() + static_cast<size_t>(oy) * ky, ny,
               row_floats, row);
    }
    const int64_t line = static_cast<int64_t>(oy) * ow;
    for (int ox = 0; ox < ow; ++ox) {
      float acc[kChannels] = {0.0f, 0.0f, 0.0f};
      const int nx = ny > 0 ? s.x_count[ox] : 0;
      const float* w = s.x_weights.data() + static_cast<size_t>(ox) * kx;
      const float* px = row + static_cast<int64_t>(s.x_first[ox]) * kChannels;
      for (int t = 0; t < nx; ++t) {
        acc[0] += w[t] * px[3 * t];
        acc[1] += w[t] * px[3 * t + 1];
        acc[2] += w[t] * px[3 * t + 2];
      }
      const int64_t pixel = line + (g.flip ? ow - 1 - ox : ox);
      for (int c = 0; c < kChannels; ++c) put(pixel, c, acc[c]);
    }
  }
}

template <OutDtype D>
void resample_layout(const ImageTransformParams& p, const images::Geometry& g, const uint8_t* src, int64_t stride,
                     const images::Region& r, void* out, ResampleScratch& s) {
  if (p.out_nhwc) {
    resample<D, true>(p, g, src, stride, r, out, s);
  } else {
    resample<D, false>(p, g, src, stride, r, out, s);
  }
}

}  // namespace

void resample_image(const ImageTransformParams& p, const images::Geometry& g, const uint8_t* src, int64_t stride,
                    const images::Region& region, void* out, ResampleScratch& s) {
  switch (p.out_dtype) {
    case OutDtype::Float32: return resample_layout<OutDtype::Float32>(p, g, src, stride, region, out, s);
    case OutDtype::Float16: return resample_layout<OutDtype::Float16>(p, g, src, stride, region, out, s);
    case OutDtype::BFloat16: return resample_layout<OutDtype::BFloat16>(p, g, src, stride, region, out, s);
    case OutDtype::UInt8: return resample_layout<OutDtype::UInt8>(p, g, src, stride, region, out, s);
  }
}

}  // namespace fastpipe
