// The loader's fused image transform, CropMirrorNormalize, as per-element functions compiled for the
// host and the device: the CPU path (reader threads) and the CUDA kernel (transforms.cu) call the same
// code, so both give bit-identical results. The random choices of a sample (crop offset, flip) come from
// a counter-based hash of (seed, epoch, sample index): runs reproduce and resume exactly.
//
// Plain C++ (no torch, no CUDA headers outside nvcc): the CPU tests execute these functions.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/draw_numbers.h"
#include "kernels/host_device.h"

namespace fastpipe::transforms {

// UInt8 is only produced by the JPEG transforms (image_transform.h): the resampled value rounded and clamped.
enum class OutDtype : int { Float32, Float16, BFloat16, UInt8 };

constexpr int kMaxChannels = 16;

struct CropMirrorNormalizeParams {
  // Input: uint8 images, in_height x in_width x channels (HWC) or channels x in_height x in_width (CHW).
  int in_height = 0, in_width = 0, channels = 0;
  bool in_hwc = true;
  // Output: the crop (out_height x out_width, at most the input with its padding), NCHW or NHWC, in
  // out_dtype.
  int out_height = 0, out_width = 0;
  bool out_nhwc = false;
  OutDtype out_dtype = OutDtype::Float32;
  bool random_crop = false;  // else the centred crop
  float mirror = 0.0f;       // probability of a horizontal flip
  // (x / 255 - mean) / std as fma(x, scale, shift): scale = 1 / (255 std), shift = -mean / std.
  float scale[kMaxChannels] = {};
  float shift[kMaxChannels] = {};
  uint64_t seed = 0;
  int pad = 0;  // zero pixels around the input before the crop (torchvision's RandomCrop(padding=pad))
};

// splitmix64's finaliser: a bijective mix of 64 bits.
FASTPIPE_HD inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Random 64 bits for draw `what` of sample `index` in `epoch`: a pure function of its arguments.
FASTPIPE_HD inline uint64_t sample_bits(uint64_t seed, uint64_t epoch, uint64_t index, uint64_t what) {
  return mix64(mix64(mix64(mix64(seed) ^ epoch) ^ index) ^ what);
}

// Where a sample's crop starts in the input (negative, or past its end, in the padding) and whether it is
// flipped.
struct SampleWindow {
  int y0 = 0, x0 = 0;
  bool flip = false;
};

FASTPIPE_HD inline SampleWindow sample_window(const CropMirrorNormalizeParams& p, uint64_t epoch, uint64_t index) {
  SampleWindow w;
  const int dy = p.in_height + 2 * p.pad - p.out_height, dx = p.in_width + 2 * p.pad - p.out_width;
  if (p.random_crop) {
    w.y0 = static_cast<int>(sample_bits(p.seed, epoch, index, draws::kCropY) % static_cast<uint64_t>(dy + 1));
    w.x0 = static_cast<int>(sample_bits(p.seed, epoch, index, draws::kCropX) % static_cast<uint64_t>(dx + 1));
  } else {
    w.y0 = dy / 2;
    w.x0 = dx / 2;
  }
  w.y0 -= p.pad;
  w.x0 -= p.pad;
  // 24 random bits against the probability: exact for 0 and 1, and for every multiple of 2**-24.
  const uint32_t r = static_cast<uint32_t>(sample_bits(p.seed, epoch, index, draws::kFlip) >> 40);
  w.flip = static_cast<float>(r) < p.mirror * 16777216.0f;
  return w;
}

// Byte offset of input element (c, y, x) within one image.
FASTPIPE_HD inline int64_t in_offset(const CropMirrorNormalizeParams& p, int c, int y, int x) {
  return p.in_hwc ? (static_cast<int64_t>(y) * p.in_width + x) * p.channels + c
                  : (static_cast<int64_t>(c) * p.in_height + y) * p.in_width + x;
}

// Element offset of output element (c, y, x) within one image.
FASTPIPE_HD inline int64_t out_offset(const CropMirrorNormalizeParams& p, int c, int y, int x) {
  return p.out_nhwc ? (static_cast<int64_t>(y) * p.out_width + x) * p.channels + c
                    : (static_cast<int64_t>(c) * p.out_height + y) * p.out_width + x;
}

// Whether a window's crop lies inside the image (none of it in the padding).
FASTPIPE_HD inline bool window_inside(const CropMirrorNormalizeParams& p, const SampleWindow& w) {
  return w.y0 >= 0 && w.x0 >= 0 && w.y0 + p.out_height <= p.in_height && w.x0 + p.out_width <= p.in_width;
}

// The normalised value of output element (c, y, x) of an image whose window is w; kPadded: the window may
// reach into the padding (zeros). The unchecked form is the hot loop's where the window is inside.
template <bool kPadded = false>
FASTPIPE_HD inline float cmn_value(const CropMirrorNormalizeParams& p, const SampleWindow& w, const uint8_t* image,
                                   int c, int y, int x) {
  const int sy = w.y0 + y, sx = w.x0 + (w.flip ? p.out_width - 1 - x : x);
  const bool padding = kPadded && (sy < 0 || sy >= p.in_height || sx < 0 || sx >= p.in_width);
  const float v = padding ? 0.0f : static_cast<float>(image[in_offset(p, c, sy, sx)]);
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(v, p.scale[c], p.shift[c]);
#else
  return std::fma(v, p.scale[c], p.shift[c]);  // correctly rounded, as the device's: bit-identical
#endif
}

FASTPIPE_HD inline uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

// float -> float16 / bfloat16 bits, round to nearest even (as CUDA's __float2half_rn / __float2bfloat16_rn).
FASTPIPE_HD inline uint16_t float_to_bfloat16_bits(float f) {
  const uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN stays NaN
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

FASTPIPE_HD inline uint16_t float_to_half_bits(float f) {
  const uint32_t u = float_bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (abs < 0x38800000u) {  // below the smallest normal half: a subnormal (or zero)
    const uint32_t shift = 126u - (abs >> 23);  // value / 2**-24 = mantissa (24 bits) * 2**(exponent - 126)
    if (shift > 24) return static_cast<uint16_t>(sign);  // below 2**-25 (or exactly it: ties to even)
    const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t half = mant >> shift;
    const uint32_t rest = mant & ((1u << shift) - 1u), mid = 1u << (shift - 1);
    return static_cast<uint16_t>(sign | (half + (rest > mid || (rest == mid && (half & 1u)))));
  }
  const uint32_t rebased = abs - 0x38000000u;  // exponent 127 -> 15
  const uint32_t rounded = rebased + 0xfffu + ((rebased >> 13) & 1u);
  return static_cast<uint16_t>(sign | (rounded >> 13));
}

// Round half up and saturate, as PIL rounds its resampled pixels (v >= 0 after the clamp, so the
// truncation is a floor; NaN becomes 0).
FASTPIPE_HD inline uint8_t float_to_uint8(float v) {
  v = v > 0.0f ? (v < 255.0f ? v : 255.0f) : 0.0f;
  return static_cast<uint8_t>(static_cast<int>(v + 0.5f));
}

// Writes element `element` of `out` (a batch's output, of dtype t).
FASTPIPE_HD inline void store(OutDtype t, void* out, int64_t element, float v) {
  switch (t) {
    case OutDtype::Float32: static_cast<float*>(out)[element] = v; return;
    case OutDtype::Float16: static_cast<uint16_t*>(out)[element] = float_to_half_bits(v); return;
    case OutDtype::BFloat16: static_cast<uint16_t*>(out)[element] = float_to_bfloat16_bits(v); return;
    case OutDtype::UInt8: static_cast<uint8_t*>(out)[element] = float_to_uint8(v); return;
  }
}

FASTPIPE_HD inline void store(const CropMirrorNormalizeParams& p, void* out, int64_t element, float v) {
  store(p.out_dtype, out, element, v);
}

FASTPIPE_HD inline int out_dtype_bytes(OutDtype t) {
  return t == OutDtype::Float32 ? 4 : t == OutDtype::UInt8 ? 1 : 2;
}

FASTPIPE_HD inline int64_t in_image_bytes(const CropMirrorNormalizeParams& p) {
  return static_cast<int64_t>(p.in_height) * p.in_width * p.channels;
}

FASTPIPE_HD inline int64_t out_image_elements(const CropMirrorNormalizeParams& p) {
  return static_cast<int64_t>(p.out_height) * p.out_width * p.channels;
}

template <bool kPadded>
inline void crop_mirror_normalize_image(const CropMirrorNormalizeParams& p, const SampleWindow& w,
                                        const uint8_t* image, void* out, int64_t base) {
  for (int c = 0; c < p.channels; ++c)
    for (int y = 0; y < p.out_height; ++y)
      for (int x = 0; x < p.out_width; ++x)
        store(p, out, base + out_offset(p, c, y, x), cmn_value<kPadded>(p, w, image, c, y, x));
}

// The whole transform of `count` images on the host: images[k] is sample index[k] of `epoch`.
inline void crop_mirror_normalize_host(const CropMirrorNormalizeParams& p, const uint8_t* images, void* out,
                                       int64_t count, const int64_t* index, uint64_t epoch) {
  for (int64_t k = 0; k < count; ++k) {
    const SampleWindow w = sample_window(p, epoch, static_cast<uint64_t>(index[k]));
    const uint8_t* image = images + k * in_image_bytes(p);
    const int64_t base = k * out_image_elements(p);
    if (window_inside(p, w))
      crop_mirror_normalize_image<false>(p, w, image, out, base);
    else
      crop_mirror_normalize_image<true>(p, w, image, out, base);
  }
}

}  // namespace fastpipe::transforms
