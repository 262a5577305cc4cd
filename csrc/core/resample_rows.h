// What the float and the fixed-point resamples (resample.cpp, resample_fixed.cpp) share: each output's
// taps along an axis, and an output row's channel planes stored into the batch (normalised, converted to
// the output dtype, laid out, and RandomErasing's box filled).
#pragma once

#include <cstdint>
#include <vector>

#include "core/resample.h"

namespace fastpipe::resample_rows {

using images::kChannels;
using images::OutDtype;

// Every output's taps along one axis: the first source pixel relative to the region (`start`) and the
// weights (float, or fixed point), zero-padded to the axis's most taps (the returned stride), so that
// every output reads the same number of taps. A padding output (no taps) reads from pixel 0 with zero
// weights.
template <typename W>
int axis_taps(const images::Axis& a, int outputs, int start, std::vector<int>& first, std::vector<W>& weights) {
  const int stride = images::max_taps(a);
  first.resize(static_cast<size_t>(outputs));
  weights.assign(static_cast<size_t>(outputs) * stride, W(0));
  for (int o = 0; o < outputs; ++o) {
    int f = 0;
    const int n = images::output_taps(a, o, &f, weights.data() + static_cast<size_t>(o) * stride);
    first[o] = n > 0 ? a.origin + f - start : 0;
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

// Output row oy from its three channel planes (ow values each, in [0, 255] units, already flipped):
// normalised, converted and stored in p's layout, RandomErasing's box filled where it crosses the row.
template <OutDtype D>
void store_row(const images::ImageTransformParams& p, const images::EraseBox& e, int oy, float* const planes[3],
               void* out_image) {
  using T = typename Out<D>::T;
  T* out = static_cast<T*>(out_image);
  const int oh = p.out_height, ow = p.out_width;
  const int64_t plane = static_cast<int64_t>(oh) * ow;
  const bool erased = oy >= e.top && oy < e.top + e.height && e.width > 0;
  for (int c = 0; c < kChannels; ++c) {
    if (p.out_nhwc) {
      T* dst = out + static_cast<int64_t>(oy) * ow * kChannels + c;
      store<D, kChannels>(planes[c], ow, p.scale[c], p.shift[c], dst);
      if (erased) fill<D, kChannels>(e.width, p.erase.value[c], dst + e.left * kChannels);
    } else {
      T* dst = out + c * plane + static_cast<int64_t>(oy) * ow;
      store<D, 1>(planes[c], ow, p.scale[c], p.shift[c], dst);
      if (erased) fill<D, 1>(e.width, p.erase.value[c], dst + e.left);
    }
  }
}

// The bicubic resample summed as PIL or torch's uint8 kernels sum it (images::fixed_point): the
// horizontal taps of every region row the vertical ones read, each clipped to uint8, then the vertical
// taps; stored as resample_image stores.
void resample_fixed(const images::ImageTransformParams& p, const images::Geometry& g, const uint8_t* src,
                    int64_t stride, const images::Region& region, void* out, ResampleScratch& s);

}  // namespace fastpipe::resample_rows
