// The JPEG transforms' geometry (fastpipe.transforms.RandomResizedCrop and CenterCrop), shared by the
// CPU path (reader threads, core/resample.h) and the CUDA path: where a sample's crop lies, whether it
// is flipped, which DCT scale the decoder may use, and how each output pixel samples the source.
//
// - RandomResizedCrop's box is drawn as torchvision draws it (10 tries of area and log-ratio, then the
//   central fallback), from a counter-based hash of (seed, epoch, sample index, draw) and the image's
//   stored size: a pure function, known before the image is decoded.
// - CenterCrop resizes the shorter side (or to a fixed size) and crops the centre, as torchvision's
//   Resize + CenterCrop do (zero padding where the crop is larger than the resized image). RandomCrop is
//   the same with the crop's offsets drawn uniformly in the resized image with its padding (torchvision's
//   Resize + RandomCrop(padding, pad_if_needed); where the crop does not fit even so, it pads as the
//   centre crop does: torchvision's RandomCrop raises there).
// - Resampling is PIL's antialiased filter (torchvision's resize(antialias=True) follows it): output o
//   of an axis samples source position in0 + (o + 0.5) * step with the filter stretched by max(step, 1),
//   taps clamped to the crop (RandomResizedCrop crops, then resizes) or to the image (CenterCrop resizes,
//   then crops), weights normalised to sum 1; bilinear, bicubic or nearest, summed as resample_taps.h says.
// - The decoder may scale by 1/2, 1/4 or 1/8 in the DCT (libjpeg) where the crop is at least that many
//   times the output on both axes; the axes are then expressed in the scaled image's pixels.
//
// Plain C++ (no torch, no CUDA headers outside nvcc): the CPU tests execute these functions.
#pragma once

#include <math.h>
#include <stdint.h>

#include "kernels/augment_draws.h"
#include "kernels/host_device.h"
#include "kernels/jpeg_color.h"
#include "kernels/random_erasing.h"
#include "kernels/resample_taps.h"
#include "kernels/sample_draws.h"
#include "kernels/transforms.h"

namespace fastpipe::images {

using transforms::OutDtype;

enum class CropMode : int { kRandomResized = 0, kCenter = 1, kRandom = 2 };

constexpr int kChannels = 3;   // outputs are RGB
constexpr int kMaxDctDenom = 8;

struct ImageTransformParams {
  CropMode mode = CropMode::kCenter;
  int out_height = 0, out_width = 0;
  // RandomResizedCrop: the box's fraction of the image area in [area_min, area_max], its aspect ratio
  // (width / height) log-uniform in [ratio_min, ratio_max].
  double area_min = 0.08, area_max = 1.0;
  double ratio_min = 3.0 / 4.0, ratio_max = 4.0 / 3.0;
  // CenterCrop and RandomCrop: the image is first resized so that its shorter side is resize_short, or to
  // exactly resize_height x resize_width; all zero: cropped without a resize.
  int resize_short = 0, resize_height = 0, resize_width = 0;
  // RandomCrop: zero pixels around the resized image before the crop's place is drawn (torchvision's
  // padding), and pad_if_needed: an axis still shorter than the crop padded by the difference on both sides.
  int pad_top = 0, pad_left = 0, pad_bottom = 0, pad_right = 0;
  bool pad_if_needed = false;
  float mirror = 0.0f;  // probability of a horizontal flip
  bool out_nhwc = false;
  OutDtype out_dtype = OutDtype::Float32;
  // The stored value is v * scale[c] + shift[c], v the resampled pixel in [0, 255] (UInt8: v itself).
  float scale[kChannels] = {1.0f, 1.0f, 1.0f};
  float shift[kChannels] = {0.0f, 0.0f, 0.0f};
  uint64_t seed = 0;
  int max_dct_denom = kMaxDctDenom;  // 1: always decode at full resolution
  Filter filter = Filter::kBilinear;  // the resize's (resample_taps.h)
  ResizeAs resize_as = ResizeAs::kPil;
  // Pillow 13 on sums a bicubic resize that shrinks the height much more than the width vertically first
  // (Geometry::vertical_first); earlier Pillows always horizontally first.
  bool pil_vertical_first = true;
  ErasingParams erase;               // RandomErasing of the output (random_erasing.h)
  AugmentParams augment;             // TrivialAugmentWide, RandAugment, AutoAugment (augment_draws.h)
};

// Where a sample's output comes from: per axis, in the image decoded at 1 / denom of its size.
struct Geometry {
  Axis y, x;
  bool flip = false;
  int denom = 1;
  bool vertical_first = false;  // fixed-point sums: the vertical pass first (Pillow 13 on, by the sizes)
  // RandomResizedCrop's box in the stored image (CenterCrop, RandomCrop: the resized image's crop).
  int top = 0, left = 0, height = 0, width = 0;
  EraseBox erase;  // in the output image
  SampleOps ops;   // the augmentations of the resized image, in order (augment_draws.h)
};

// Source rows [y0, y1) and columns [x0, x1) of the decoded image that the taps read.
struct Region {
  int y0 = 0, y1 = 0, x0 = 0, x1 = 0;
};

// ---- random draws -------------------------------------------------------------------------------
// Draw numbers: draw_numbers.h.
FASTPIPE_HD inline bool draw_flip(const ImageTransformParams& p, uint64_t epoch, uint64_t index) {
  const uint32_t r = static_cast<uint32_t>(transforms::sample_bits(p.seed, epoch, index, draws::kFlip) >> 40);
  return static_cast<float>(r) < p.mirror * 16777216.0f;
}

// torchvision's RandomResizedCrop.get_params with our draws: sets g's top, left, height, width.
FASTPIPE_HD inline void random_resized_box(const ImageTransformParams& p, int height, int width, uint64_t epoch,
                                           uint64_t index, Geometry* g) {
  const double area = static_cast<double>(height) * width;
  const double log_lo = log(p.ratio_min), log_hi = log(p.ratio_max);
  for (int t = 0; t < static_cast<int>(draws::kTries); ++t) {
    const uint64_t d = draws::kBox + draws::kPerTry * static_cast<uint64_t>(t);
    const double target = area * (p.area_min + (p.area_max - p.area_min) *
                                                   uniform01(transforms::sample_bits(p.seed, epoch, index, d)));
    const double aspect =
        exp(log_lo + (log_hi - log_lo) * uniform01(transforms::sample_bits(p.seed, epoch, index, d + 1)));
    const int w = round_half_even(sqrt(target * aspect));
    const int h = round_half_even(sqrt(target / aspect));
    if (0 < w && w <= width && 0 < h && h <= height) {
      g->top = below(transforms::sample_bits(p.seed, epoch, index, d + 2), height - h + 1);
      g->left = below(transforms::sample_bits(p.seed, epoch, index, d + 3), width - w + 1);
      g->height = h;
      g->width = w;
      return;
    }
  }
  const double in_ratio = static_cast<double>(width) / height;
  int w = width, h = height;
  if (in_ratio < p.ratio_min) {
    h = round_half_even(w / p.ratio_min);
  } else if (in_ratio > p.ratio_max) {
    w = round_half_even(h * p.ratio_max);
  }
  g->top = (height - h) / 2;
  g->left = (width - w) / 2;
  g->height = h;
  g->width = w;
}

// torchvision v2's Resize output size for an image of height x width.
FASTPIPE_HD inline void resized_size(const ImageTransformParams& p, int height, int width, int* rh, int* rw) {
  if (p.resize_short > 0) {
    // _compute_resized_output_size: the shorter side becomes resize_short, the longer int(s * long / short).
    if (width <= height) {
      *rw = p.resize_short;
      *rh = static_cast<int>(static_cast<double>(p.resize_short) * height / width);
    } else {
      *rh = p.resize_short;
      *rw = static_cast<int>(static_cast<double>(p.resize_short) * width / height);
    }
  } else if (p.resize_height > 0) {
    *rh = p.resize_height;
    *rw = p.resize_width;
  } else {
    *rh = height;
    *rw = width;
  }
}

// Where a centred crop of `out` pixels starts in `resized` ones (torchvision's center_crop, padding included).
FASTPIPE_HD inline int center_crop_start(int resized, int out) {
  if (out > resized) return -((out - resized) / 2);  // center_crop pads (out - resized) // 2 on the leading side
  return round_half_even((resized - out) / 2.0);
}

// Where RandomCrop's crop of `out` pixels starts in `resized` ones: torchvision pads `lo` and `hi` zeros
// around them (pad_if_needed: then, while shorter than the crop, the difference on both sides) and draws
// the crop's place uniformly in the padded axis (`bits`). A crop longer than even that is centred.
FASTPIPE_HD inline int random_crop_start(int resized, int out, int lo, int hi, bool if_needed, uint64_t bits) {
  int padded = resized + lo + hi;
  if (if_needed && padded < out) {
    lo += out - padded;
    padded = 2 * out - padded;
  }
  if (out > padded) return center_crop_start(resized, out);
  return below(bits, padded - out + 1) - lo;
}

// The crop of `out` pixels from `resized` ones at `start`: output o is resized pixel o + start; outputs
// whose pixel is outside [0, resized) are padding.
FASTPIPE_HD inline void crop_axis(int source, int resized, int out, int start, Axis* a) {
  a->step = static_cast<double>(source) / resized;
  a->in0 = 0.0;
  a->start = start;
  a->origin = 0;
  a->size = source;
  a->valid_lo = start < 0 ? -start : 0;
  a->valid_hi = resized - start < out ? resized - start : out;
}

// The largest of 1, 2, 4, 8 (up to max_denom) that the source covers on both axes at least that many
// times: decoding at 1 / denom then still only shrinks.
FASTPIPE_HD inline int dct_denom(double step_y, double step_x, int max_denom) {
  const double s = step_y < step_x ? step_y : step_x;
  int d = 1;
  while (d * 2 <= max_denom && s >= d * 2) d *= 2;
  return d;
}

// An axis of the full-resolution image re-expressed in the image decoded at 1 / denom, whose size on
// this axis is `scaled` pixels (libjpeg: ceil(full / denom)).
FASTPIPE_HD inline void scale_axis(Axis* a, int denom, int scaled) {
  if (denom == 1) return;
  const double begin = static_cast<double>(a->origin) / denom;
  const int origin = static_cast<int>(floor(begin));
  int end = static_cast<int>(ceil(static_cast<double>(a->origin + a->size) / denom));
  if (end > scaled) end = scaled;
  a->in0 = begin - origin + a->in0 / denom;
  a->step /= denom;
  a->origin = origin;
  a->size = end - origin;
}

// Scaled size of one axis of an image decoded at 1 / denom (libjpeg's jdiv_round_up).
FASTPIPE_HD inline int scaled_size(int full, int denom) { return (full + denom - 1) / denom; }

// The whole geometry of sample `index` in `epoch`, for an image stored as height x width.
FASTPIPE_HD inline Geometry image_geometry(const ImageTransformParams& p, int height, int width, uint64_t epoch,
                                           uint64_t index) {
  Geometry g;
  g.flip = draw_flip(p, epoch, index);
  if (p.mode == CropMode::kRandomResized) {
    random_resized_box(p, height, width, epoch, index, &g);
    g.y = Axis{0.0, static_cast<double>(g.height) / p.out_height, 0, g.top, g.height, 0, p.out_height};
    g.x = Axis{0.0, static_cast<double>(g.width) / p.out_width, 0, g.left, g.width, 0, p.out_width};
  } else {
    int rh = 0, rw = 0;
    resized_size(p, height, width, &rh, &rw);
    if (p.mode == CropMode::kRandom) {
      g.top = random_crop_start(rh, p.out_height, p.pad_top, p.pad_bottom, p.pad_if_needed,
                                transforms::sample_bits(p.seed, epoch, index, draws::kCropY));
      g.left = random_crop_start(rw, p.out_width, p.pad_left, p.pad_right, p.pad_if_needed,
                                 transforms::sample_bits(p.seed, epoch, index, draws::kCropX));
    } else {
      g.top = center_crop_start(rh, p.out_height);
      g.left = center_crop_start(rw, p.out_width);
    }
    crop_axis(height, rh, p.out_height, g.top, &g.y);
    crop_axis(width, rw, p.out_width, g.left, &g.x);
    g.height = p.out_height;
    g.width = p.out_width;
  }
  g.erase = erase_box(p.erase, p.seed, epoch, index, p.out_height, p.out_width);
  g.ops = draw_augment(p.augment, p.seed, epoch, index, p.out_height, p.out_width);
  g.denom = dct_denom(g.y.step, g.x.step, p.max_dct_denom);
  scale_axis(&g.y, g.denom, scaled_size(height, g.denom));
  scale_axis(&g.x, g.denom, scaled_size(width, g.denom));
  Axis* axes[2] = {&g.y, &g.x};
  for (Axis* a : axes) {
    a->filter = p.filter;
    a->as = p.resize_as;
  }
  if (fixed_point(p.filter, p.resize_as)) {
    // torch's bits depend on every resized pixel's weights: RandomResizedCrop's outputs, or the whole
    // resized image that CenterCrop and RandomCrop crop.
    int rh = p.out_height, rw = p.out_width, sh = g.height, sw = g.width;  // RandomResizedCrop: the box
    if (p.mode != CropMode::kRandomResized) {
      resized_size(p, height, width, &rh, &rw);
      sh = height;
      sw = width;
    }
    g.y.precision = fixed_precision(g.y, rh);
    g.x.precision = fixed_precision(g.x, rw);
    // Pillow 13's ImagingResampleInner: vertically first where the height loses more than twice the
    // pixels the width loses, counted on the image it is given (torchvision's crop, or the whole image).
    g.vertical_first = p.resize_as == ResizeAs::kPil && p.pil_vertical_first && sh - rh > 0 && sh - rh > (sw - rw) * 2;
  }
  return g;
}

// ---- resampling taps (resample_taps.h) ----------------------------------------------------------
// The source pixels every output of the geometry reads (empty when all are padding).
FASTPIPE_HD inline Region taps_region(const Geometry& g) {
  Region r;
  int lo = 0, hi = 0;
  const Axis* axes[2] = {&g.y, &g.x};
  int* bounds[2][2] = {{&r.y0, &r.y1}, {&r.x0, &r.x1}};
  for (int k = 0; k < 2; ++k) {
    const Axis& a = *axes[k];
    if (a.valid_hi <= a.valid_lo) continue;
    tap_range(a, a.valid_lo, &lo, &hi);  // taps move monotonically with o
    *bounds[k][0] = a.origin + lo;
    tap_range(a, a.valid_hi - 1, &lo, &hi);
    *bounds[k][1] = a.origin + hi;
    if (*bounds[k][1] < *bounds[k][0]) *bounds[k][1] = *bounds[k][0];
  }
  return r;
}

// ---- the device decode path ---------------------------------------------------------------------
// On a GPU the image is decoded whole (nvJPEG, no DCT scaling) and each output element computes its own
// taps: an image goes there only when every axis has at most kDeviceTaps taps (a shrink of up to 4x);
// larger shrinks are decoded on the host, where DCT scaling makes them cheap.
constexpr int kDeviceTaps = 9;

// How record k of a batch reaches its output: decoded on the device (its image at staging + k * pixel
// budget), decoded on the host (its output already made, copied as is), or not in the batch.
enum class DecodeOn : int { kDevice = 0, kHost = 1 };

struct ImageDesc {
  int32_t on = 0;  // DecodeOn
  int32_t height = 0, width = 0;
  int64_t encoded_bytes = 0;
  Geometry geometry;  // denom 1: the whole image is decoded
  YccPlanes planes;   // where a planar decode puts its components (DecodedLayout::kYccPlanar)
};

// Channel c of pixel (y, x) of image `d` decoded whole into `image` in `layout`.
FASTPIPE_HD inline float decoded_pixel(DecodedLayout layout, const ImageDesc& d, const uint8_t* image, int y, int x,
                                       int c) {
  if (layout == DecodedLayout::kYccPlanar) return static_cast<float>(ycc_pixel(image, d.planes, y, x, c));
  return static_cast<float>(image[(static_cast<int64_t>(y) * d.width + x) * kChannels + c]);
}

// The resampled value of channel c at output row oy, column ox before the flip, of image `d` decoded
// whole into `image`: both axes' taps computed here, with the host resample's weights. Float sums are
// summed per element, in another order than the host's (equal to float rounding); fixed-point ones
// exactly as the host sums them (each tap row's horizontal sum clipped to uint8, then the vertical one).
// Needs max_taps <= kDeviceTaps.
FASTPIPE_HD inline float resampled_value(DecodedLayout layout, const ImageDesc& d, const uint8_t* image, int c, int oy,
                                         int ox) {
  const Geometry& g = d.geometry;
  if (fixed_point(g.y.filter, g.y.as)) {
    int32_t wy[kDeviceTaps], wx[kDeviceTaps];
    int fy = 0, fx = 0;
    const int ny = output_taps(g.y, oy, &fy, wy);
    const int nx = output_taps(g.x, ox, &fx, wx);
    if (ny == 0 || nx == 0) return 0.0f;
    // The first pass's sums along one axis, each clipped, then the second pass's over them.
    const bool v1st = g.vertical_first;
    const Axis &first = v1st ? g.y : g.x, &second = v1st ? g.x : g.y;
    const int32_t* w1 = v1st ? wy : wx;
    const int32_t* w2 = v1st ? wx : wy;
    const int n1 = v1st ? ny : nx, n2 = v1st ? nx : ny;
    int32_t acc = 1 << (second.precision - 1);
    for (int i = 0; i < n2; ++i) {
      int32_t h = 1 << (first.precision - 1);
      for (int j = 0; j < n1; ++j) {
        const int y = g.y.origin + fy + (v1st ? j : i), x = g.x.origin + fx + (v1st ? i : j);
        h += w1[j] * static_cast<int32_t>(decoded_pixel(layout, d, image, y, x, c));
      }
      acc += w2[i] * clip8(h, first.precision);
    }
    return static_cast<float>(clip8(acc, second.precision));
  }
  float wy[kDeviceTaps], wx[kDeviceTaps];
  int fy = 0, fx = 0;
  const int ny = output_taps(g.y, oy, &fy, wy);
  const int nx = output_taps(g.x, ox, &fx, wx);
  float acc = 0.0f;
  for (int i = 0; i < ny; ++i) {
    const int y = g.y.origin + fy + i;
    float h = 0.0f;  // rounded as the host rounds (float_rounding.h): nvcc would fuse each step
    for (int j = 0; j < nx; ++j) h = add_rn(h, mul_rn(wx[j], decoded_pixel(layout, d, image, y, g.x.origin + fx + j, c)));
    acc = add_rn(acc, mul_rn(wy[i], h));
  }
  return g.y.filter == Filter::kBicubic ? torch_float_uint8(acc) : acc;
}

// Element i of the device resample's output (images of out_image_elements(p) each): the whole body of
// its kernel, run per element on the GPU and over every element by the simulation. With `work` (an
// augmented transform: augment_images.h) the resized value is stored rounded to uint8 in record n's work
// area (work + n * work_stride, 3 planes) instead, for the augmentations to run on.
FASTPIPE_HD inline void resample_element(const ImageTransformParams& p, DecodedLayout layout, const ImageDesc* descs,
                                         const uint8_t* staging, int64_t image_stride, void* out, int64_t i,
                                         uint8_t* work = nullptr, int64_t work_stride = 0);

// Element offset of output (c, y, x) in one image of the output layout.
FASTPIPE_HD inline int64_t out_offset(const ImageTransformParams& p, int c, int y, int x) {
  return p.out_nhwc ? (static_cast<int64_t>(y) * p.out_width + x) * kChannels + c
                    : (static_cast<int64_t>(c) * p.out_height + y) * p.out_width + x;
}

FASTPIPE_HD inline int64_t out_image_elements(const ImageTransformParams& p) {
  return static_cast<int64_t>(p.out_height) * p.out_width * kChannels;
}

// The value stored for resampled pixel value v of channel c, before the dtype conversion: rounded as
// the reader threads round it (no fused multiply-add), so that an augmented image, whose uint8 pixels the
// device computes exactly, is stored with the same bits on both.
FASTPIPE_HD inline float normalized(const ImageTransformParams& p, int c, float v) {
  return p.out_dtype == OutDtype::UInt8 ? v : add_rn(mul_rn(v, p.scale[c]), p.shift[c]);
}

FASTPIPE_HD inline void resample_element(const ImageTransformParams& p, DecodedLayout layout, const ImageDesc* descs,
                                         const uint8_t* staging, int64_t image_stride, void* out, int64_t i,
                                         uint8_t* work, int64_t work_stride) {
  const int64_t per_image = out_image_elements(p);
  const int64_t n = i / per_image, e = i % per_image;
  const ImageDesc& d = descs[n];
  if (d.on != static_cast<int32_t>(DecodeOn::kDevice)) return;
  int c, y, x;
  if (p.out_nhwc) {
    c = static_cast<int>(e % kChannels);
    x = static_cast<int>(e / kChannels % p.out_width);
    y = static_cast<int>(e / kChannels / p.out_width);
  } else {
    x = static_cast<int>(e % p.out_width);
    y = static_cast<int>(e / p.out_width % p.out_height);
    c = static_cast<int>(e / p.out_width / p.out_height);
  }
  if (work) {
    const int source_x = d.geometry.flip ? p.out_width - 1 - x : x;
    const float v = resampled_value(layout, d, staging + n * image_stride, c, y, source_x);
    work[n * work_stride + (static_cast<int64_t>(c) * p.out_height + y) * p.out_width + x] = transforms::float_to_uint8(v);
    return;
  }
  if (inside(d.geometry.erase, y, x)) {  // erased after the flip, in the output's units
    transforms::store(p.out_dtype, out, i, p.erase.value[c]);
    return;
  }
  const int source_x = d.geometry.flip ? p.out_width - 1 - x : x;
  const float v = resampled_value(layout, d, staging + n * image_stride, c, y, source_x);
  transforms::store(p.out_dtype, out, i, normalized(p, c, v));
}

}  // namespace fastpipe::images
