// The bicubic resample in fixed point, as PIL (and torch's uint8 kernels) compute it: one axis's taps,
// each sum clipped to uint8, then the other's over those values; the horizontal pass first, but in
// Pillow 13 on where the height shrinks much more than the width (Geometry::vertical_first). Bicubic's negative lobes
// overshoot at edges, and the clip between the passes matters: summing in float, or in the other order,
// moves such pixels by up to 16 levels.
#include <algorithm>
#include <cstring>

#include "core/resample_rows.h"

namespace fastpipe::resample_rows {
namespace {

using images::clip8;
using images::ImageTransformParams;

// Four int32 lanes: a pixel's R, G, B (and a lane that is ignored), as resample.cpp's v4; widened from
// four bytes in one vector conversion (SSE4.1's pmovzxbd where the target has it).
using i4 = int32_t __attribute__((vector_size(16)));
using u8x4 = uint8_t __attribute__((vector_size(4)));

inline i4 widen4(const uint8_t* p) {
  u8x4 b;
  std::memcpy(&b, p, sizeof(b));
  return __builtin_convertvector(b, i4);
}

// One row's horizontal taps: per output pixel K taps of a whole RGB pixel (`row` is padded so that the
// last pixel's 4-byte load and an output's zero-weight taps stay inside), each channel clipped to uint8.
template <int K>
[[gnu::always_inline]] inline void horizontal(const uint8_t* row, const int* first, const int32_t* weights, int stride,
                                              int ow, int precision, uint8_t* __restrict__ out) {
  const int k = K ? K : stride;
  const int32_t half = 1 << (precision - 1);
  for (int ox = 0; ox < ow; ++ox) {
    const uint8_t* px = row + 3 * static_cast<int64_t>(first[ox]);
    const int32_t* w = weights + static_cast<int64_t>(ox) * stride;
    i4 acc = {half, half, half, half};
    for (int t = 0; t < k; ++t) acc += w[t] * widen4(px + 3 * t);
    // clip8 on every lane at once: the shift of a sum at or below 0 is at most 0.
    i4 v = acc >> precision;
    v = v < 0 ? 0 : v;
    v = v > 255 ? 255 : v;
    for (int c = 0; c < 3; ++c) out[3 * ox + c] = static_cast<uint8_t>(v[c]);
  }
}

// One output row's vertical taps over rows of n values, each sum clipped to uint8.
[[gnu::always_inline]] inline void vertical(const uint8_t* const* rows, const int32_t* w, int taps, int64_t n,
                                            int precision, int32_t* acc, uint8_t* __restrict__ out) {
  const int32_t half = 1 << (precision - 1);
  std::fill(acc, acc + n, half);
  for (int t = 0; t < taps; ++t) {
    const uint8_t* r = rows[t];
    const int32_t wt = w[t];
    for (int64_t j = 0; j < n; ++j) acc[j] += wt * r[j];
  }
  for (int64_t j = 0; j < n; ++j) out[j] = static_cast<uint8_t>(clip8(acc[j], precision));
}

// The two passes' loops, compiled for a target: horizontal<K> with K from the axis's taps,
// 2 * ceil(2 * max(step, 1)) + 1 (5 when enlarging, 7 to 13 for a shrink of up to 3x: the common cases,
// DCT scaling leaving less than 4x; others at run time), and vertical.
struct FixedKernels {
  void (*horizontal)(const uint8_t* row, const int* first, const int32_t* w, int kx, int ow, int precision,
                     uint8_t* out);
  void (*vertical)(const uint8_t* const* rows, const int32_t* w, int taps, int64_t n, int precision, int32_t* acc,
                   uint8_t* out);
};

#define FASTPIPE_FIXED_KERNELS(name, attributes)                                                                   \
  attributes void name##_horizontal(const uint8_t* row, const int* first, const int32_t* w, int kx, int ow,     \
                                    int precision, uint8_t* out) {                                               \
    switch (kx) {                                                                                                 \
      case 5: return horizontal<5>(row, first, w, kx, ow, precision, out);                                        \
      case 7: return horizontal<7>(row, first, w, kx, ow, precision, out);                                        \
      case 9: return horizontal<9>(row, first, w, kx, ow, precision, out);                                        \
      case 11: return horizontal<11>(row, first, w, kx, ow, precision, out);                                      \
      case 13: return horizontal<13>(row, first, w, kx, ow, precision, out);                                      \
      default: return horizontal<0>(row, first, w, kx, ow, precision, out);                                       \
    }                                                                                                             \
  }                                                                                                               \
  attributes void name##_vertical(const uint8_t* const* rows, const int32_t* w, int taps, int64_t n, int precision, \
                                  int32_t* acc, uint8_t* out) {                                                  \
    vertical(rows, w, taps, n, precision, acc, out);                                                              \
  }

FASTPIPE_FIXED_KERNELS(baseline, )
#if defined(__x86_64__)
// x86-64's baseline (SSE2) has no 32-bit lane multiply (pmulld) nor byte widening (pmovzxbd): the same
// integer sums compiled for SSE4.1, chosen at run time where the CPU has it (every x86-64 CPU since 2008).
FASTPIPE_FIXED_KERNELS(sse41, __attribute__((target("sse4.1"))))
#endif

const FixedKernels& kernels() {
  static const FixedKernels baseline{baseline_horizontal, baseline_vertical};
#if defined(__x86_64__)
  static const FixedKernels sse41{sse41_horizontal, sse41_vertical};
  static const bool has_sse41 = __builtin_cpu_supports("sse4.1");
  if (has_sse41) return sse41;
#endif
  return baseline;
}

// The rows an output's vertical taps read: `first` onwards (relative to `base`, rows `pitch` apart,
// `count` of them); rows past its own taps have zero weights, and any row serves.
void tap_rows(const uint8_t* base, int64_t pitch, int first, int count, int taps, std::vector<const uint8_t*>& rows) {
  rows.resize(static_cast<size_t>(taps));
  for (int t = 0; t < taps; ++t) rows[t] = base + std::min(first + t, count - 1) * pitch;
}

// An output row's RGB pixels as the flipped channel planes store_row takes.
void to_planes(const uint8_t* pixels, int ow, bool flip, float* const planes[3]) {
  for (int x = 0; x < ow; ++x) {
    const int from = flip ? ow - 1 - x : x;
    for (int c = 0; c < kChannels; ++c) planes[c][x] = static_cast<float>(pixels[3 * from + c]);
  }
}

template <OutDtype D>
void resample(const ImageTransformParams& p, const images::Geometry& g, const uint8_t* src, int64_t stride,
              const images::Region& r, void* out, ResampleScratch& s) {
  const int oh = p.out_height, ow = p.out_width;
  const int ky = axis_taps(g.y, oh, r.y0, s.y_first, s.y_fixed);
  const int kx = axis_taps(g.x, ow, r.x0, s.x_first, s.x_fixed);
  const int rh = r.y1 - r.y0;
  const int64_t width = static_cast<int64_t>(r.x1 - r.x0) * 3, n = static_cast<int64_t>(ow) * 3;
  const bool empty = rh <= 0 || width <= 0;
  s.row.resize(static_cast<size_t>(3 * ow));
  float* const planes[kChannels] = {s.row.data(), s.row.data() + ow, s.row.data() + 2 * ow};
  s.fixed_row.assign(static_cast<size_t>(width + 3 * static_cast<int64_t>(kx) + 4), 0);
  s.fixed_acc.resize(static_cast<size_t>(std::max(width, n)));
  std::vector<uint8_t>& pixels = s.fixed_rows;
  const FixedKernels& k = kernels();
  // The horizontal pass first: every region row the vertical taps read (after a row of this output row's).
  if (!empty && !g.vertical_first) {
    pixels.resize(static_cast<size_t>(rh + 1) * n);
    for (int y = 0; y < rh; ++y) {
      std::memcpy(s.fixed_row.data(), src + y * stride, static_cast<size_t>(width));
      k.horizontal(s.fixed_row.data(), s.x_first.data(), s.x_fixed.data(), kx, ow, g.x.precision,
                   pixels.data() + (y + 1) * n);
    }
  } else {
    pixels.resize(static_cast<size_t>(n));
  }
  for (int oy = 0; oy < oh; ++oy) {
    const int32_t* wy = s.y_fixed.data() + static_cast<size_t>(oy) * ky;
    if (empty || std::none_of(wy, wy + ky, [](int32_t w) { return w != 0; })) {
      for (float* pl : planes) std::fill(pl, pl + ow, 0.0f);  // padding: 0 before normalisation
    } else if (g.vertical_first) {  // this output row's vertical taps over the region's columns, then its horizontal ones
      tap_rows(src, stride, s.y_first[oy], rh, ky, s.fixed_taps);
      k.vertical(s.fixed_taps.data(), wy, ky, width, g.y.precision, s.fixed_acc.data(), s.fixed_row.data());
      k.horizontal(s.fixed_row.data(), s.x_first.data(), s.x_fixed.data(), kx, ow, g.x.precision, pixels.data());
      to_planes(pixels.data(), ow, g.flip, planes);
    } else {
      tap_rows(pixels.data() + n, n, s.y_first[oy], rh, ky, s.fixed_taps);
      k.vertical(s.fixed_taps.data(), wy, ky, n, g.y.precision, s.fixed_acc.data(), pixels.data());
      to_planes(pixels.data(), ow, g.flip, planes);
    }
    store_row<D>(p, g.erase, oy, planes, out);
  }
}

}  // namespace

void resample_fixed(const ImageTransformParams& p, const images::Geometry& g, const uint8_t* src, int64_t stride,
                    const images::Region& region, void* out, ResampleScratch& s) {
  switch (p.out_dtype) {
    case OutDtype::Float32: return resample<OutDtype::Float32>(p, g, src, stride, region, out, s);
    case OutDtype::Float16: return resample<OutDtype::Float16>(p, g, src, stride, region, out, s);
    case OutDtype::BFloat16: return resample<OutDtype::BFloat16>(p, g, src, stride, region, out, s);
    case OutDtype::UInt8: return resample<OutDtype::UInt8>(p, g, src, stride, region, out, s);
  }
}

}  // namespace fastpipe::resample_rows
