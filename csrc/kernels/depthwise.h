// Direct depthwise convolution (groups = in_channels = out_channels) with bias, residual and activation
// in the same kernel: one pass over the input and one write of the output, where eager makes a
// convolution pass, then the bias/add/activation passes. Any kernel size, stride, padding, dilation;
// NCHW or NHWC (channels_last); float32, float16 or bfloat16 with float32 accumulation.
//
// On NHWC tensors whose channels are a multiple of 16 bytes' worth, each thread computes that many
// channels of a pixel with 16-byte loads and stores (the vectorised path); else one element per thread.
//
// The index and boundary arithmetic lives here as functions compiled for the host and the device; the
// CPU tests run depthwise_pre_activation over whole grids at every lane count (through the private op
// fastpipe::_depthwise_host) against float64 references on awkward shapes. Plain C++ outside nvcc.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/activation.h"
#include "kernels/host_device.h"

namespace fastpipe::cuda {

struct DepthwiseParams {
  void* out = nullptr;             // [n, c, oh, ow] in the layout below
  const void* input = nullptr;     // [n, c, h, w]
  const void* weight = nullptr;    // [c, 1, kh, kw], dense (its own layout does not matter: kh x kw per channel)
  const void* bias = nullptr;      // [c] or null
  const void* residual = nullptr;  // like out, or null
  int64_t n = 0, c = 0, h = 0, w = 0, oh = 0, ow = 0;
  int kh = 1, kw = 1, sh = 1, sw = 1, ph = 0, pw = 0, dh = 1, dw = 1;
  bool channels_last = false;      // input, output and residual: NHWC storage
  int dtype = 0;                   // DType (dtype.h) of every tensor
  ActSpec act;
};

struct OutCoord {
  int64_t n, c, y, x;
};

// Element `i` (its offset in storage order) of a tensor of `hh` x `ww` pixels in the params' layout as
// coordinates; with `lanes` > 1 (NHWC, c a multiple of lanes), group `i` of `lanes` consecutive channels
// of one pixel, o.c its first.
FASTPIPE_HD inline OutCoord depthwise_coord(const DepthwiseParams& p, int64_t i, int64_t hh, int64_t ww,
                                            int lanes = 1) {
  OutCoord o;
  if (p.channels_last) {
    const int64_t groups = p.c / lanes;
    o.c = i % groups * lanes;
    i /= groups;
    o.x = i % ww;
    i /= ww;
    o.y = i % hh;
    o.n = i / hh;
  } else {
    o.x = i % ww;
    i /= ww;
    o.y = i % hh;
    i /= hh;
    o.c = i % p.c;
    o.n = i / p.c;
  }
  return o;
}

// Output element (or group of `lanes`) `i` as coordinates.
FASTPIPE_HD inline OutCoord depthwise_out_coord(const DepthwiseParams& p, int64_t i, int lanes = 1) {
  return depthwise_coord(p, i, p.oh, p.ow, lanes);
}

// Offset of element (n, c, y, x) of a tensor of `hh` x `ww` pixels stored in the params' layout.
FASTPIPE_HD inline int64_t depthwise_offset(const DepthwiseParams& p, int64_t n, int64_t c, int64_t y, int64_t x,
                                            int64_t hh, int64_t ww) {
  return p.channels_last ? ((n * hh + y) * ww + x) * p.c + c : ((n * p.c + c) * hh + y) * ww + x;
}

// The taps [first, last) of one kernel dimension that land inside the input: input coordinate
// origin + k * dilation in [0, size). The loops then need no bounds checks.
struct TapRange {
  int first, last;
};

FASTPIPE_HD inline TapRange depthwise_taps(int64_t origin, int64_t size, int kernel, int dilation) {
  TapRange r{0, kernel};
  if (origin < 0) r.first = static_cast<int>((-origin + dilation - 1) / dilation);
  const int64_t past = size - origin;  // taps k with origin + k * dilation < size: k < past / dilation
  if (past <= 0) {
    r.last = 0;
  } else {
    const int64_t fit = (past + dilation - 1) / dilation;
    if (fit < kernel) r.last = static_cast<int>(fit);
  }
  if (r.last < r.first) r.last = r.first;
  return r;
}

// conv + bias + residual at output element o (before the activation), accumulating in float, for V
// consecutive channels from o.c (V > 1: NHWC, where they are adjacent in memory). `load_in(offset, v)` and
// `load_res(offset, v)` read V elements from an element offset as float; `load_w` and `load_bias` read one.
template <int V, typename LoadIn, typename LoadW, typename LoadBias, typename LoadRes>
FASTPIPE_HD inline void depthwise_pre_activation(const DepthwiseParams& p, const OutCoord& o, float (&acc)[V],
                                                 LoadIn load_in, LoadW load_w, LoadBias load_bias,
                                                 LoadRes load_res) {
  const int64_t y0 = o.y * p.sh - p.ph, x0 = o.x * p.sw - p.pw;
  const TapRange ty = depthwise_taps(y0, p.h, p.kh, p.dh), tx = depthwise_taps(x0, p.w, p.kw, p.dw);
  for (int l = 0; l < V; ++l) acc[l] = 0.f;
  float v[V];
  for (int ky = ty.first; ky < ty.last; ++ky) {
    const int64_t iy = y0 + static_cast<int64_t>(ky) * p.dh;
    for (int kx = tx.first; kx < tx.last; ++kx) {
      const int64_t ix = x0 + static_cast<int64_t>(kx) * p.dw;
      load_in(depthwise_offset(p, o.n, o.c, iy, ix, p.h, p.w), v);
      for (int l = 0; l < V; ++l) acc[l] += v[l] * load_w(((o.c + l) * p.kh + ky) * p.kw + kx);
    }
  }
  if (p.bias)
    for (int l = 0; l < V; ++l) acc[l] += load_bias(o.c + l);
  if (p.residual) {
    load_res(depthwise_offset(p, o.n, o.c, o.y, o.x, p.oh, p.ow), v);
    for (int l = 0; l < V; ++l) acc[l] += v[l];
  }
}

// Channels per thread of the vectorised path (16-byte loads and stores) for elements of `bytes`, or 1
// where it does not apply: NCHW, or a channel count that is not a multiple.
FASTPIPE_HD inline int depthwise_lanes(const DepthwiseParams& p, int bytes) {
  const int lanes = 16 / bytes;
  return p.channels_last && p.c % lanes == 0 ? lanes : 1;
}

// ---- NCHW tiles (the depthwise_tiled engine) ---------------------------------------------------
// A block computes a kTileH x kTileW tile of outputs of one (n, c) plane from a copy in shared memory of
// the input patch the tile reads (zeros where it lies outside the image), so each input pixel is read
// from global memory once per tile instead of once per tap.
constexpr int kTileH = 16, kTileW = 16;

struct DepthwiseTile {
  int64_t n, c;        // the plane
  int64_t oy0, ox0;    // first output of the tile
  int64_t iy0, ix0;    // input coordinates of patch element (0, 0)
  int64_t patch_h, patch_w;
};

FASTPIPE_HD inline int64_t depthwise_tiles_per_plane(const DepthwiseParams& p) {
  return ((p.oh + kTileH - 1) / kTileH) * ((p.ow + kTileW - 1) / kTileW);
}

// Elements of the input patch of a tile (the shared memory a block needs, in elements).
FASTPIPE_HD inline int64_t depthwise_patch_elements(const DepthwiseParams& p) {
  return (int64_t(kTileH - 1) * p.sh + int64_t(p.kh - 1) * p.dh + 1) *
         (int64_t(kTileW - 1) * p.sw + int64_t(p.kw - 1) * p.dw + 1);
}

// Why the tiled kernel cannot compute `p` (null when it can). The patch is held as float.
constexpr int64_t kMaxTiledPatchBytes = 48 << 10;
inline const char* depthwise_tiled_why_not(const DepthwiseParams& p) {
  if (p.channels_last) return "NHWC: the depthwise engine's vectorised path reads whole channel vectors instead";
  if (depthwise_patch_elements(p) * int64_t(sizeof(float)) > kMaxTiledPatchBytes)
    return "the input patch of a tile (kernel, stride and dilation) does not fit in 48 KiB of shared memory";
  if (p.n * p.c * depthwise_tiles_per_plane(p) > INT32_MAX) return "more tiles than a grid holds";
  return nullptr;
}

FASTPIPE_HD inline DepthwiseTile depthwise_tile(const DepthwiseParams& p, int64_t block) {
  const int64_t tiles_x = (p.ow + kTileW - 1) / kTileW, per_plane = depthwise_tiles_per_plane(p);
  const int64_t plane = block / per_plane, t = block % per_plane;
  DepthwiseTile tile;
  tile.n = plane / p.c;
  tile.c = plane % p.c;
  tile.oy0 = t / tiles_x * kTileH;
  tile.ox0 = t % tiles_x * kTileW;
  tile.iy0 = tile.oy0 * p.sh - p.ph;
  tile.ix0 = tile.ox0 * p.sw - p.pw;
  tile.patch_h = int64_t(kTileH - 1) * p.sh + int64_t(p.kh - 1) * p.dh + 1;
  tile.patch_w = int64_t(kTileW - 1) * p.sw + int64_t(p.kw - 1) * p.dw + 1;
  return tile;
}

// Input offset of patch element k (row-major in the patch), or -1 where it lies outside the image (a zero).
FASTPIPE_HD inline int64_t depthwise_patch_source(const DepthwiseParams& p, const DepthwiseTile& t, int64_t k) {
  const int64_t iy = t.iy0 + k / t.patch_w, ix = t.ix0 + k % t.patch_w;
  if (iy < 0 || iy >= p.h || ix < 0 || ix >= p.w) return -1;
  return depthwise_offset(p, t.n, t.c, iy, ix, p.h, p.w);
}

// conv + bias + residual of output (t.oy0 + a, t.ox0 + b) from the patch (before the activation).
template <typename LoadPatch, typename LoadW, typename LoadBias, typename LoadRes>
FASTPIPE_HD inline float depthwise_tile_pre_activation(const DepthwiseParams& p, const DepthwiseTile& t, int a, int b,
                                                       LoadPatch load_patch, LoadW load_w, LoadBias load_bias,
                                                       LoadRes load_res) {
  float acc = 0.f;
  for (int ky = 0; ky < p.kh; ++ky)
    for (int kx = 0; kx < p.kw; ++kx)
      acc += load_patch((int64_t(a) * p.sh + int64_t(ky) * p.dh) * t.patch_w + int64_t(b) * p.sw + int64_t(kx) * p.dw) *
             load_w((t.c * p.kh + ky) * p.kw + kx);
  if (p.bias) acc += load_bias(t.c);
  if (p.residual) acc += load_res(depthwise_offset(p, t.n, t.c, t.oy0 + a, t.ox0 + b, p.oh, p.ow));
  return acc;
}


// ---- backward ----------------------------------------------------------------------------------
// Given g, the gradient of conv(x) + bias (+ residual) (the activation's backward already applied), the
// input gradient dx[n, c, y, x] = sum of g * w over the taps that read (y, x), the weight gradient
// dw[c, ky, kx] = sum over (n, oy, ox) of g * x at the tap, and the bias gradient db[c] = sum of g.
// Pointers live in the kernels' arguments; the shape, stride, padding, dilation, layout and dtype are a
// DepthwiseParams' (its pointers unused).

// dx at input element o (or `V` consecutive channels from o.c), accumulated in float: the taps whose
// output position lies on the output grid (oy * sh = y + ph - ky * dh for an oy in [0, oh)).
// `load_g(offset, v)` reads V elements of g as float, `load_w` one weight.
template <int V, typename LoadGrad, typename LoadW>
FASTPIPE_HD inline void depthwise_input_grad(const DepthwiseParams& p, const OutCoord& o, float (&acc)[V],
                                             LoadGrad load_g, LoadW load_w) {
  for (int l = 0; l < V; ++l) acc[l] = 0.f;
  float v[V];
  for (int ky = 0; ky < p.kh; ++ky) {
    const int64_t ty = o.y + p.ph - int64_t(ky) * p.dh;
    if (ty < 0) break;  // only decreases with ky
    if (ty % p.sh != 0 || ty / p.sh >= p.oh) continue;
    for (int kx = 0; kx < p.kw; ++kx) {
      const int64_t tx = o.x + p.pw - int64_t(kx) * p.dw;
      if (tx < 0) break;
      if (tx % p.sw != 0 || tx / p.sw >= p.ow) continue;
      load_g(depthwise_offset(p, o.n, o.c, ty / p.sh, tx / p.sw, p.oh, p.ow), v);
      for (int l = 0; l < V; ++l) acc[l] += v[l] * load_w(((o.c + l) * p.kh + ky) * p.kw + kx);
    }
  }
}

// The weight-gradient kernel's work: a block of kWgradThreads threads sums, for `cpb` consecutive
// channels, the products at every tap (and g itself, for the bias) over one range of output positions
// pos = (n * oh + oy) * ow + ox; `streams` threads per channel each take every streams-th position of
// the range. Each block writes its sums to partial[split][c][tap] (the bias as tap kh * kw), added over
// the splits per channel afterwards in a fixed order, so the result does not depend on timing.
// NHWC blocks hold 32 channels (consecutive threads read consecutive channels), NCHW blocks one
// (consecutive threads read consecutive pixels).
constexpr int kWgradThreads = 128;

struct WgradPlan {
  int64_t positions = 0;       // n * oh * ow
  int cpb = 1;                 // channels per block
  int streams = 1;             // threads per channel: kWgradThreads / cpb
  int64_t channel_blocks = 0;  // ceil(c / cpb)
  int64_t per_split = 1;       // positions per range
  int64_t splits = 0;          // ranges; blocks = channel_blocks * splits, split-major
};

// About 4 blocks per SM, but at least 32 positions per thread, so that a block's sums pay for its
// reduction; no range is empty.
inline WgradPlan depthwise_wgrad_plan(const DepthwiseParams& p, int num_sms) {
  WgradPlan w;
  w.positions = p.n * p.oh * p.ow;
  w.cpb = p.channels_last ? 32 : 1;
  w.streams = kWgradThreads / w.cpb;
  w.channel_blocks = (p.c + w.cpb - 1) / w.cpb;
  if (w.positions <= 0 || w.channel_blocks <= 0) return w;
  const int64_t want = (int64_t(num_sms) * 4 + w.channel_blocks - 1) / w.channel_blocks;
  const int64_t most = w.positions / (int64_t(w.streams) * 32);
  const int64_t splits = want < most ? want : most;
  w.per_split = (w.positions + (splits > 1 ? splits : 1) - 1) / (splits > 1 ? splits : 1);
  w.splits = (w.positions + w.per_split - 1) / w.per_split;
  return w;
}

// Block `block`'s first channel and its range of positions [begin, end).
struct WgradBlock {
  int64_t c0, split, begin, end;
};

FASTPIPE_HD inline WgradBlock depthwise_wgrad_block(const WgradPlan& w, int64_t block) {
  WgradBlock b;
  b.c0 = block % w.channel_blocks * w.cpb;
  b.split = block / w.channel_blocks;
  b.begin = b.split * w.per_split;
  b.end = b.begin + w.per_split < w.positions ? b.begin + w.per_split : w.positions;
  return b;
}

// Adds output position `pos` of channel c to a thread's sums: acc[ky * KW + kx] += g * x at each tap
// inside the input, acc[KH * KW] += g. KH x KW is p's kernel (the kernels are built per size so that
// the sums stay in registers). `load_g` and `load_in` read one element as float.
template <int KH, int KW, typename LoadG, typename LoadIn>
FASTPIPE_HD inline void depthwise_wgrad_add(const DepthwiseParams& p, int64_t c, int64_t pos,
                                            float (&acc)[KH * KW + 1], LoadG load_g, LoadIn load_in) {
  const int64_t ox = pos % p.ow, rest = pos / p.ow, oy = rest % p.oh, n = rest / p.oh;
  const float g = load_g(depthwise_offset(p, n, c, oy, ox, p.oh, p.ow));
  // The input offset is linear in (iy, ix): one base and two strides rather than the full offset per tap.
  const int64_t base = depthwise_offset(p, n, c, 0, 0, p.h, p.w), sx = p.channels_last ? p.c : 1, sy = sx * p.w;
  const int64_t y0 = oy * p.sh - p.ph, x0 = ox * p.sw - p.pw;
  FASTPIPE_UNROLL
  for (int ky = 0; ky < KH; ++ky) {
    const int64_t iy = y0 + int64_t(ky) * p.dh;
    const bool row = iy >= 0 && iy < p.h;
    FASTPIPE_UNROLL
    for (int kx = 0; kx < KW; ++kx) {
      const int64_t ix = x0 + int64_t(kx) * p.dw;
      if (row && ix >= 0 && ix < p.w) acc[ky * KW + kx] += g * load_in(base + iy * sy + ix * sx);
    }
  }
  acc[KH * KW] += g;
}

// The square kernel sizes the weight-gradient kernel is built for: calls f(std::integral_constant<int, K>)
// for a K x K kernel of them; false (f not called) for other sizes.
template <typename F>
bool depthwise_wgrad_size_switch(int kh, int kw, F&& f) {
  if (kh != kw) return false;
  switch (kh) {
    case 3: f(std::integral_constant<int, 3>{}); return true;
    case 5: f(std::integral_constant<int, 5>{}); return true;
    case 7: f(std::integral_constant<int, 7>{}); return true;
    default: return false;
  }
}

// Why the depthwise backward kernels cannot compute `p` (null when they can).
inline const char* depthwise_backward_why_not(const DepthwiseParams& p) {
  if (!depthwise_wgrad_size_switch(p.kh, p.kw, [](auto) {}))
    return "its weight-gradient kernel is built for 3x3, 5x5 and 7x7 kernels only";
  return nullptr;
}

}  // namespace fastpipe::cuda
