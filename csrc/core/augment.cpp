#include "core/augment.h"

#include <algorithm>
#include <cstring>

namespace fastpipe {
namespace {

using images::OpKind;
using images::PlannedOp;

// The CPU's own fused multiply-add, where the function it is inlined into was compiled for one: the same
// results as images::ExactFma, a vector instruction instead of a dozen scalar ones.
struct HardwareFma {
  float operator()(float a, float b, float c) const { return __builtin_fmaf(a, b, c); }
};

constexpr int64_t kChunk = 1024;  // pixels per pass of the colour op's loops

// The per-pixel ops over whole rows of the 3 planes, written for the compiler to vectorise; each computes
// what images::op_pixel computes (the device's and the simulation's per-pixel code), with its helpers.
template <class Fma>
[[gnu::always_inline]] inline void color_rows(const PlannedOp& op, const uint8_t* src, uint8_t* dst, int64_t pixels,
                                              float* grey) {
  for (int64_t start = 0; start < pixels; start += kChunk) {
    const int64_t n = std::min(kChunk, pixels - start);
    const uint8_t *r = src + start, *g = r + pixels, *b = g + pixels;
    for (int64_t i = 0; i < n; ++i) grey[i] = images::floored_grey(r[i], g[i], b[i], Fma());
    for (int c = 0; c < 3; ++c) {
      const uint8_t* in = src + c * pixels + start;
      uint8_t* out = dst + c * pixels + start;
      for (int64_t i = 0; i < n; ++i) out[i] = images::blend(op, static_cast<float>(in[i]), grey[i], Fma());
    }
  }
}

template <class Fma>
[[gnu::always_inline]] inline void sharpness_rows(const PlannedOp& op, const uint8_t* src, uint8_t* dst, int h,
                                                  int w) {
  const int64_t plane = static_cast<int64_t>(h) * w;
  for (int c = 0; c < 3; ++c) {
    const uint8_t* in = src + c * plane;
    uint8_t* out = dst + c * plane;
    std::memcpy(out, in, static_cast<size_t>(w));  // the border is kept
    std::memcpy(out + plane - w, in + plane - w, static_cast<size_t>(w));
    for (int y = 1; y < h - 1; ++y) {
      const uint8_t *up = in + (y - 1) * w, *mid = in + y * w, *down = in + (y + 1) * w;
      uint8_t* o = out + y * w;
      o[0] = mid[0];
      o[w - 1] = mid[w - 1];
      for (int x = 1; x < w - 1; ++x) {
        const int sum = up[x - 1] + up[x] + up[x + 1] + mid[x - 1] + mid[x] + mid[x + 1] + down[x - 1] + down[x] +
                        down[x + 1];
        o[x] = images::sharpened(op, mid[x], sum, Fma());
      }
    }
  }
}

// ColorJitter's hue (no fused operations, but floor and trunc, which the FMA build does in registers)
// and RandomGrayscale (the grey's fused adds).
template <class Fma>
[[gnu::always_inline]] inline void hue_rows(const PlannedOp& op, const uint8_t* src, uint8_t* dst, int64_t pixels) {
  const uint8_t *r = src, *g = src + pixels, *b = src + 2 * pixels;
  uint8_t *ro = dst, *go = dst + pixels, *bo = dst + 2 * pixels;
  for (int64_t i = 0; i < pixels; ++i) images::hue_pixel(op.ratio, r[i], g[i], b[i], ro + i, go + i, bo + i);
}

template <class Fma>
[[gnu::always_inline]] inline void grey_rows(const uint8_t* src, uint8_t* dst, int64_t pixels) {
  const uint8_t *r = src, *g = src + pixels, *b = src + 2 * pixels;
  for (int64_t i = 0; i < pixels; ++i) {
    const uint8_t v = static_cast<uint8_t>(images::floored_grey(r[i], g[i], b[i], Fma()));
    dst[i] = dst[pixels + i] = dst[2 * pixels + i] = v;
  }
}

template <class Fma>
[[gnu::always_inline]] inline int64_t grey_sum(const uint8_t* img, int64_t pixels) {
  const uint8_t *r = img, *g = img + pixels, *b = img + 2 * pixels;
  int64_t sum = 0;
  for (int64_t i = 0; i < pixels; ++i) sum += static_cast<int32_t>(images::floored_grey(r[i], g[i], b[i], Fma()));
  return sum;
}

// A geometric op: each column's products once, then per row each pixel's source position (as
// images::affine_position computes it), then the gather from the 3 planes (nearest) or the interpolation
// (bilinear, bicubic). `columns`: 4 w floats.
template <class Fma>
[[gnu::always_inline]] inline void affine_rows(const PlannedOp& op, const uint8_t* fill, const uint8_t* src,
                                               uint8_t* dst, int h, int w, float* columns) {
  const int64_t plane = static_cast<int64_t>(h) * w;
  const bool bilinear = op.kind == static_cast<int32_t>(OpKind::kBilinear);
  const bool bicubic = op.kind == static_cast<int32_t>(OpKind::kBicubic);
  float *cx = columns, *cy = cx + w, *ix = cy + w, *iy = ix + w;
  for (int x = 0; x < w; ++x) {
    const float bx = images::base_coordinate(x, w);
    cx[x] = images::mul_rn(bx, op.theta[0]);
    cy[x] = images::mul_rn(bx, op.theta[3]);
  }
  for (int y = 0; y < h; ++y) {
    const float by = images::base_coordinate(y, h);
    for (int x = 0; x < w; ++x) {
      ix[x] = images::grid_position(op.sampling, cx[x], by, op.theta[1], op.theta[2], w, Fma());
      iy[x] = images::grid_position(op.sampling, cy[x], by, op.theta[4], op.theta[5], h, Fma());
    }
    const int64_t at = static_cast<int64_t>(y) * w;
    if (bilinear) {
      for (int x = 0; x < w; ++x) images::bilinear_pixel(op, src, h, w, iy[x], ix[x], dst, at + x, Fma());
      continue;
    }
    if (bicubic) {
      for (int x = 0; x < w; ++x) images::bicubic_pixel(op, src, h, w, iy[x], ix[x], dst, at + x);
      continue;
    }
    for (int x = 0; x < w; ++x) {
      ix[x] = images::round_even(ix[x]);
      iy[x] = images::round_even(iy[x]);
    }
    for (int x = 0; x < w; ++x) {
      if (images::inside_image(iy[x], ix[x], h, w)) {
        const int64_t from = static_cast<int64_t>(iy[x]) * w + static_cast<int64_t>(ix[x]);
        for (int c = 0; c < 3; ++c) dst[c * plane + at + x] = src[c * plane + from];
      } else {
        for (int c = 0; c < 3; ++c) dst[c * plane + at + x] = fill[c];
      }
    }
  }
}

// The kernels, compiled for the CPU's FMA (x86-64: chosen at run time where the CPU has one) and without.
struct PixelKernels {
  void (*color)(const PlannedOp&, const uint8_t*, uint8_t*, int64_t, float*);
  void (*sharpness)(const PlannedOp&, const uint8_t*, uint8_t*, int, int);
  int64_t (*grey_sum)(const uint8_t*, int64_t);
  void (*hue)(const PlannedOp&, const uint8_t*, uint8_t*, int64_t);
  void (*grey)(const uint8_t*, uint8_t*, int64_t);
  void (*affine)(const PlannedOp&, const uint8_t*, const uint8_t*, uint8_t*, int, int, float*);
};

#if defined(__x86_64__)
#define FASTPIPE_FMA_TARGET __attribute__((target("avx2,fma")))
#else
#define FASTPIPE_FMA_TARGET
#endif

FASTPIPE_FMA_TARGET void color_fma(const PlannedOp& op, const uint8_t* src, uint8_t* dst, int64_t pixels, float* g) {
  color_rows<HardwareFma>(op, src, dst, pixels, g);
}
FASTPIPE_FMA_TARGET void sharpness_fma(const PlannedOp& op, const uint8_t* src, uint8_t* dst, int h, int w) {
  sharpness_rows<HardwareFma>(op, src, dst, h, w);
}
FASTPIPE_FMA_TARGET int64_t grey_sum_fma(const uint8_t* img, int64_t pixels) { return grey_sum<HardwareFma>(img, pixels); }
FASTPIPE_FMA_TARGET void hue_fma(const PlannedOp& op, const uint8_t* src, uint8_t* dst, int64_t pixels) {
  hue_rows<HardwareFma>(op, src, dst, pixels);
}
FASTPIPE_FMA_TARGET void grey_fma(const uint8_t* src, uint8_t* dst, int64_t pixels) {
  grey_rows<HardwareFma>(src, dst, pixels);
}
FASTPIPE_FMA_TARGET void affine_fma(const PlannedOp& op, const uint8_t* fill, const uint8_t* src, uint8_t* dst, int h,
                                    int w, float* columns) {
  affine_rows<HardwareFma>(op, fill, src, dst, h, w, columns);
}

void color_exact(const PlannedOp& op, const uint8_t* src, uint8_t* dst, int64_t pixels, float* g) {
  color_rows<images::ExactFma>(op, src, dst, pixels, g);
}
void sharpness_exact(const PlannedOp& op, const uint8_t* src, uint8_t* dst, int h, int w) {
  sharpness_rows<images::ExactFma>(op, src, dst, h, w);
}
int64_t grey_sum_exact(const uint8_t* img, int64_t pixels) { return grey_sum<images::ExactFma>(img, pixels); }
void hue_exact(const PlannedOp& op, const uint8_t* src, uint8_t* dst, int64_t pixels) {
  hue_rows<images::ExactFma>(op, src, dst, pixels);
}
void grey_exact(const uint8_t* src, uint8_t* dst, int64_t pixels) { grey_rows<images::ExactFma>(src, dst, pixels); }
void affine_exact(const PlannedOp& op, const uint8_t* fill, const uint8_t* src, uint8_t* dst, int h, int w,
                  float* columns) {
  affine_rows<images::ExactFma>(op, fill, src, dst, h, w, columns);
}

const PixelKernels& kernels(bool emulate_fma) {
  static const PixelKernels exact{color_exact, sharpness_exact, grey_sum_exact, hue_exact, grey_exact, affine_exact};
  static const PixelKernels fma{color_fma, sharpness_fma, grey_sum_fma, hue_fma, grey_fma, affine_fma};
#if defined(__x86_64__)
  static const bool has_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#elif defined(__FP_FAST_FMAF)
  static const bool has_fma = true;
#else
  static const bool has_fma = false;
#endif
  return has_fma && !emulate_fma ? fma : exact;
}

// GaussianBlur in two passes per plane, each summing as images::blurred_value sums: the rows' taps into
// floats, then the columns' taps over a row padded by reflection (both vectorised over x).
void blur_planes(const PlannedOp& op, const float* wx, const float* wy, const uint8_t* src, uint8_t* dst, int h, int w,
                 AugmentScratch& s) {
  const int rx = op.taps[0] / 2, ry = op.taps[1] / 2;
  const int64_t plane = static_cast<int64_t>(h) * w;
  s.columns.resize(static_cast<size_t>(w + 2 * rx + w));
  float* padded = s.columns.data();
  float* column = padded + w + 2 * rx;
  for (int c = 0; c < 3; ++c) {
    const uint8_t* in = src + c * plane;
    for (int y = 0; y < h; ++y) {
      std::fill(column, column + w, 0.0f);
      for (int i = 0; i < op.taps[1]; ++i) {
        const uint8_t* row = in + static_cast<int64_t>(images::reflect(y + i - ry, h)) * w;
        const float wi = wy[i];
        for (int x = 0; x < w; ++x) column[x] = images::add_rn(column[x], images::mul_rn(wi, static_cast<float>(row[x])));
      }
      for (int x = -rx; x < w + rx; ++x) padded[x + rx] = column[images::reflect(x, w)];
      // Each output's sum in tap order, the taps outermost so that the loop over x vectorises.
      std::fill(column, column + w, 0.0f);
      for (int j = 0; j < op.taps[0]; ++j) {
        const float wj = wx[j];
        const float* from = padded + j;
        for (int x = 0; x < w; ++x) column[x] = images::add_rn(column[x], images::mul_rn(wj, from[x]));
      }
      uint8_t* out = dst + c * plane + static_cast<int64_t>(y) * w;
      for (int x = 0; x < w; ++x) out[x] = static_cast<uint8_t>(images::round_even(column[x]));
    }
  }
}

void table_pass(const PlannedOp& op, const uint8_t* src, uint8_t* dst, int64_t pixels, const PixelKernels& k,
                AugmentScratch& s) {
  if (images::needs_histograms(op)) {
    std::memset(s.stats.hist, 0, sizeof(s.stats.hist));
    for (int c = 0; c < 3; ++c)
      for (int64_t i = 0; i < pixels; ++i) ++s.stats.hist[c][src[c * pixels + i]];
  }
  if (images::needs_grey_sum(op)) s.stats.grey_sum = k.grey_sum(src, pixels);
  for (int c = 0; c < 3; ++c) {
    uint8_t* table = s.tables + 256 * c;
    images::op_table(op, s.stats, pixels, c, table);
    for (int64_t i = 0; i < pixels; ++i) dst[c * pixels + i] = table[src[c * pixels + i]];
  }
}

}  // namespace

void augment_image(const images::SampleOps& ops, const uint8_t fill[3], int h, int w, AugmentScratch& s,
                   bool emulate_fma) {
  const int64_t pixels = static_cast<int64_t>(h) * w;
  const PixelKernels& k = kernels(emulate_fma);
  s.other.resize(s.image.size());
  for (int n = 0; n < ops.count; ++n) {
    const PlannedOp& op = ops.op[n];
    const uint8_t* src = s.image.data();
    uint8_t* dst = s.other.data();
    switch (static_cast<OpKind>(op.kind)) {
      case OpKind::kCopy: continue;
      case OpKind::kMix:  // in place
        s.original.resize(s.image.size());
        s.mix.resize(s.image.size());
        for (int64_t i = 0; i < pixels; ++i)
          images::mix_pixel(op, s.image.data(), s.original.data(), s.mix.data(), pixels, i);
        continue;
      case OpKind::kTable: table_pass(op, src, dst, pixels, k, s); break;
      case OpKind::kColor:
        s.grey.resize(kChunk);
        k.color(op, src, dst, pixels, s.grey.data());
        break;
      case OpKind::kSharpness:
        if (h <= 2 || w <= 2) continue;  // adjust_sharpness returns such images as they are
        k.sharpness(op, src, dst, h, w);
        break;
      case OpKind::kAffine:
      case OpKind::kBilinear:
      case OpKind::kBicubic:
        s.columns.resize(4 * static_cast<size_t>(w));
        k.affine(op, fill, src, dst, h, w, s.columns.data());
        break;
      case OpKind::kHue: k.hue(op, src, dst, pixels); break;
      case OpKind::kBlur: blur_planes(op, ops.blur, ops.blur + images::kMaxBlurTaps, src, dst, h, w, s); break;
      case OpKind::kGrey: k.grey(src, dst, pixels); break;
      default:
        for (int y = 0; y < h; ++y)
          for (int x = 0; x < w; ++x)
            images::op_pixel(op, s.tables, fill, src, h, w, y, x, dst, ops.blur);
    }
    s.image.swap(s.other);
  }
}

}  // namespace fastpipe
