// The augmentations of images decoded on the device (a CUDA loader's image_decode="device"): the
// resample kernel leaves each augmented record's resized image rounded to uint8, as 3 planes, in the
// first half of the record's work area (ResampleImagesKernel::work), then this pass runs the sample's ops
// (augment_ops.h) in turn, between the two halves (AugMix's mixing in place, with the original and the
// sums after them; GaussianBlur in two 1-D passes through a float plane), and stores the normalised,
// erased output. On a GPU one block per image (the
// statistics gathered in shared memory); on the simulated device the same per-pixel code over every
// pixel in turn (augment_image_serial). Both compute the same integers for the statistics, so the
// outputs are equal.
// Plain C++ (no torch, no CUDA headers outside nvcc).
#pragma once

#include <stdint.h>

#include "kernels/augment_ops.h"
#include "kernels/host_device.h"
#include "kernels/image_transform.h"

namespace fastpipe::images {

FASTPIPE_HD inline bool has_stage(const ImageTransformParams& p, AugmentStageKind kind) {
  for (int n = 0; n < p.augment.stages; ++n)
    if (p.augment.stage[n].kind == static_cast<int32_t>(kind)) return true;
  return false;
}
// AugMix's mixing needs the original image and the sums; GaussianBlur's two passes a plane of column sums.
FASTPIPE_HD inline bool mixes(const ImageTransformParams& p) { return has_stage(p, AugmentStageKind::kAugMix); }
FASTPIPE_HD inline bool blurs(const ImageTransformParams& p) { return has_stage(p, AugmentStageKind::kBlur); }

// One record's work area: two images of 3 uint8 planes (the image and the next op's output, in turn);
// with AugMix, then the original (3 uint8 planes) and, 16-aligned, the mix (3 float planes); with a blur,
// then its column sums (1 float plane: a channel at a time).
FASTPIPE_HD inline int64_t mix_offset(int64_t plane) { return (3 * kChannels * plane + 15) / 16 * 16; }
FASTPIPE_HD inline int64_t blur_offset(const ImageTransformParams& p, int64_t plane) {
  return mix_offset(plane) + (mixes(p) ? kChannels * plane * static_cast<int64_t>(sizeof(float)) : 0);
}
FASTPIPE_HD inline int64_t augment_work_bytes(const ImageTransformParams& p) {
  const int64_t plane = static_cast<int64_t>(p.out_height) * p.out_width;
  if (!mixes(p) && !blurs(p)) return 2 * kChannels * plane;
  return blur_offset(p, plane) + (blurs(p) ? plane * static_cast<int64_t>(sizeof(float)) : 0);
}

FASTPIPE_HD inline bool augments(const ImageTransformParams& p) {
  return p.augment.stages > 0;
}

// Output pixel `at` (y * width + x) of image n from the augmented planes `img`: normalised, erased,
// converted and stored in the output's layout.
FASTPIPE_HD inline void store_augmented_pixel(const ImageTransformParams& p, const EraseBox& e, const uint8_t* img,
                                              void* out, int64_t n, int64_t at) {
  const int64_t plane = static_cast<int64_t>(p.out_height) * p.out_width;
  const int y = static_cast<int>(at / p.out_width), x = static_cast<int>(at % p.out_width);
  const bool erased = inside(e, y, x);
  for (int c = 0; c < kChannels; ++c) {
    const float v = erased ? p.erase.value[c] : normalized(p, c, static_cast<float>(img[c * plane + at]));
    transforms::store(p.out_dtype, out, n * out_image_elements(p) + out_offset(p, c, y, x), v);
  }
}

// Adds pixel `at` of the planes to the statistics op needs (the serial form; the GPU adds atomically).
FASTPIPE_HD inline void add_to_stats(const PlannedOp& op, const uint8_t* img, int64_t plane, int64_t at,
                                     ImageStats* s) {
  if (needs_histograms(op))
    for (int c = 0; c < 3; ++c) ++s->hist[c][img[c * plane + at]];
  if (needs_grey_sum(op))
    s->grey_sum += static_cast<int64_t>(floored_grey(img[at], img[plane + at], img[2 * plane + at]));
}

// Image n's whole pass, one pixel after another (the simulated device).
inline void augment_image_serial(const ImageTransformParams& p, const ImageDesc& d, uint8_t* work, void* out,
                                 int64_t n) {
  const int h = p.out_height, w = p.out_width;
  const int64_t plane = static_cast<int64_t>(h) * w;
  uint8_t* img = work;
  uint8_t* other = work + kChannels * plane;
  uint8_t tables[3 * 256];
  ImageStats stats;
  const SampleOps& ops = d.geometry.ops;
  for (int k = 0; k < ops.count; ++k) {
    const PlannedOp& op = ops.op[k];
    if (op.kind == static_cast<int32_t>(OpKind::kCopy)) continue;
    if (op.kind == static_cast<int32_t>(OpKind::kMix)) {
      for (int64_t at = 0; at < plane; ++at)
        mix_pixel(op, img, work + 2 * kChannels * plane, reinterpret_cast<float*>(work + mix_offset(plane)), plane, at);
      continue;
    }
    if (op.kind == static_cast<int32_t>(OpKind::kBlur)) {  // two passes, as the GPU kernel and the CPU
      float* columns = reinterpret_cast<float*>(work + blur_offset(p, plane));
      for (int c = 0; c < kChannels; ++c) {
        for (int64_t at = 0; at < plane; ++at)
          columns[at] = blur_column(op, ops.blur + kMaxBlurTaps, img + c * plane, h, w, static_cast<int>(at / w),
                                    static_cast<int>(at % w));
        for (int64_t at = 0; at < plane; ++at)
          other[c * plane + at] = blur_row(op, ops.blur, columns, w, static_cast<int>(at / w), static_cast<int>(at % w));
      }
      uint8_t* t = img;
      img = other;
      other = t;
      continue;
    }
    if (op.kind == static_cast<int32_t>(OpKind::kTable)) {
      for (int c = 0; c < 3; ++c)
        for (int v = 0; v < 256; ++v) stats.hist[c][v] = 0;
      stats.grey_sum = 0;
      for (int64_t at = 0; at < plane; ++at) add_to_stats(op, img, plane, at, &stats);
      for (int c = 0; c < 3; ++c) op_table(op, stats, plane, c, tables + 256 * c);
    }
    for (int64_t at = 0; at < plane; ++at)
      op_pixel(op, tables, p.augment.fill, img, h, w, static_cast<int>(at / w), static_cast<int>(at % w), other,
               ops.blur);
    uint8_t* t = img;
    img = other;
    other = t;
  }
  for (int64_t at = 0; at < plane; ++at) store_augmented_pixel(p, d.geometry.erase, img, out, n, at);
}

}  // namespace fastpipe::images
