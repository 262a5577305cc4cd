#include "core/augment.h"

#include <cstring>

namespace fastpipe {
namespace {

using images::OpKind;
using images::PlannedOp;

void image_stats(const PlannedOp& op, const uint8_t* img, int64_t pixels, images::ImageStats& s) {
  if (images::needs_histograms(op)) {
    std::memset(s.hist, 0, sizeof(s.hist));
    for (int64_t i = 0; i < pixels; ++i)
      for (int c = 0; c < 3; ++c) ++s.hist[c][img[3 * i + c]];
  }
  if (images::needs_grey_sum(op)) {
    int64_t sum = 0;
    for (int64_t i = 0; i < pixels; ++i)
      sum += static_cast<int64_t>(images::floored_grey(img[3 * i], img[3 * i + 1], img[3 * i + 2]));
    s.grey_sum = sum;
  }
}

}  // namespace

void augment_image(const images::SampleOps& ops, const uint8_t fill[3], int h, int w, AugmentScratch& s) {
  const int64_t pixels = static_cast<int64_t>(h) * w;
  s.other.resize(s.image.size());
  for (int k = 0; k < ops.count; ++k) {
    const PlannedOp& op = ops.op[k];
    const OpKind kind = static_cast<OpKind>(op.kind);
    if (kind == OpKind::kCopy) continue;
    const uint8_t* src = s.image.data();
    uint8_t* dst = s.other.data();
    if (kind == OpKind::kTable) {
      image_stats(op, src, pixels, s.stats);
      for (int c = 0; c < 3; ++c) images::op_table(op, s.stats, pixels, c, s.tables + 256 * c);
      const uint8_t *r = s.tables, *g = s.tables + 256, *b = s.tables + 512;
      for (int64_t i = 0; i < 3 * pixels; i += 3) {
        dst[i] = r[src[i]];
        dst[i + 1] = g[src[i + 1]];
        dst[i + 2] = b[src[i + 2]];
      }
    } else {
      for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x)
          for (int c = 0; c < 3; ++c)
            dst[(static_cast<int64_t>(y) * w + x) * 3 + c] = images::op_pixel(op, s.tables, fill, src, h, w, y, x, c);
    }
    s.image.swap(s.other);
  }
}

}  // namespace fastpipe
