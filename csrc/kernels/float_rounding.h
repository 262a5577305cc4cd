// Float arithmetic rounded as torchvision's kernels round it, the same on the host and the device: each
// operation rounded as written (mul_rn, add_rn, div_rn), a fused multiply-add rounded once (ExactFma,
// also on a CPU without FMA) and rintf without a library call (round_even). Used by the augmentation
// ops (augment_ops.h) and the resample's taps and sums (resample_taps.h, image_transform.h), whose
// device code must compute the host's bits. Plain C++ (no torch, no CUDA headers outside nvcc).
#pragma once

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/host_device.h"

namespace fastpipe::images {

// Operations rounded as written: nvcc would fuse a * b + c into one rounding (and --use_fast_math
// approximates float division); the host compilers here do neither (-ffp-contract=off, no -ffast-math).
// On the device the intrinsic, which is never fused; on the host the operator.
#if defined(__CUDA_ARCH__)
#define FASTPIPE_ROUNDED(device, host) return device
#else
#define FASTPIPE_ROUNDED(device, host) return host
#endif
FASTPIPE_HD inline float mul_rn(float a, float b) { FASTPIPE_ROUNDED(__fmul_rn(a, b), a * b); }
FASTPIPE_HD inline float add_rn(float a, float b) { FASTPIPE_ROUNDED(__fadd_rn(a, b), a + b); }
FASTPIPE_HD inline float div_rn(float a, float b) { FASTPIPE_ROUNDED(__fdiv_rn(a, b), a / b); }
FASTPIPE_HD inline double mul_rn(double a, double b) { FASTPIPE_ROUNDED(__dmul_rn(a, b), a * b); }
FASTPIPE_HD inline double add_rn(double a, double b) { FASTPIPE_ROUNDED(__dadd_rn(a, b), a + b); }
#undef FASTPIPE_ROUNDED

// a * b + c rounded once, as ATen's vectorised add_(other, alpha) computes it (a fused multiply-add). On
// a GPU the hardware's fmaf. On the CPU, where x86-64's baseline has no FMA instruction (and glibc's fmaf
// is a call), in double: the product of two floats is exact there (48 bits), and the sum is rounded to
// odd (the exact sum's neighbour with an odd last bit, when inexact), which then rounds to float as the
// single rounding would. core/augment.cpp uses the CPU's own FMA where it has one: the same results.
struct ExactFma {
  FASTPIPE_HD float operator()(float a, float b, float c) const {
#if defined(__CUDA_ARCH__)
    return fmaf(a, b, c);
#else
    const double p = static_cast<double>(a) * b, q = c;
    double s = p + q;
    const double pb = s - q, qb = s - pb;
    const double err = (p - pb) + (q - qb);  // TwoSum: s + err is exactly p + q
    // Inexact (err != 0, so s != 0) with an even last bit: one step toward the exact sum (+1 on the bits
    // steps away from 0).
    uint64_t bits;
    memcpy(&bits, &s, sizeof(bits));
    const uint64_t step = static_cast<uint64_t>(err != 0.0) & ~bits & 1;
    bits += (err > 0.0) == (s > 0.0) ? step : 0 - step;
    memcpy(&s, &bits, sizeof(bits));
    return static_cast<float>(s);
#endif
  }
};

// torchvision's _rgb_to_grayscale_image: r * 0.2989 + g * 0.587 + b * 0.114 in float32, each add_ with
// alpha fused as ATen's vectorised add computes it; then floored (uint8 images).
template <class Fma = ExactFma>
FASTPIPE_HD inline float floored_grey(uint8_t r, uint8_t g, uint8_t b, Fma fma = Fma()) {
  float v = mul_rn(static_cast<float>(r), 0.2989f);
  v = fma(static_cast<float>(g), 0.587f, v);
  v = fma(static_cast<float>(b), 0.114f, v);
  return static_cast<float>(static_cast<int>(v));  // floor: v >= 0
}

// rintf (half to even) without a library call where the CPU has no rounding instruction: adding and
// subtracting 1.5 * 2^23 rounds to an integer in the default rounding mode for |v| < 2^22; larger values
// stay as large, outside any image.
FASTPIPE_HD inline float round_even(float v) {
#if defined(__CUDA_ARCH__)
  return rintf(v);
#else
  return (v + 12582912.0f) - 12582912.0f;
#endif
}

}  // namespace fastpipe::images
