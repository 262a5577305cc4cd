// fastpipe::_depthwise_host: the direct depthwise kernel's per-element code (csrc/cuda/depthwise.h) run on
// the host over a whole output grid, in float32, before the activation, `lanes` channels per step as the
// vectorised NHWC path computes them (1: the element-wise path), or block by block through shared-memory
// patches as the NCHW tiled kernel does (`tiled`). A test op: the CPU tests check
// the kernel's index and boundary arithmetic with it on every build, GPU or not.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "cuda/depthwise.h"
#include "ops/conv_act.h"

namespace fastpipe::conv {
namespace {

at::Tensor depthwise_host(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                          const std::optional<at::Tensor>& residual, at::IntArrayRef stride, at::IntArrayRef padding,
                          at::IntArrayRef dilation, bool channels_last, int64_t lanes, bool tiled) {
  TORCH_CHECK(input.dim() == 4 && weight.dim() == 4 && weight.size(1) == 1 && weight.size(0) == input.size(1),
              "_depthwise_host takes input [N, C, H, W] and weight [C, 1, kH, kW]");
  TORCH_CHECK(stride.size() == 2 && padding.size() == 2 && dilation.size() == 2, "stride, padding, dilation: 2 values");
  const auto fmt = channels_last ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
  const at::Tensor in = input.to(at::kFloat).contiguous(fmt), w = weight.to(at::kFloat).contiguous();
  const at::Tensor b = bias ? bias->to(at::kFloat).contiguous() : at::Tensor();
  cuda::DepthwiseParams p;
  p.n = in.size(0), p.c = in.size(1), p.h = in.size(2), p.w = in.size(3);
  p.kh = static_cast<int>(w.size(2)), p.kw = static_cast<int>(w.size(3));
  p.sh = static_cast<int>(stride[0]), p.sw = static_cast<int>(stride[1]);
  p.ph = static_cast<int>(padding[0]), p.pw = static_cast<int>(padding[1]);
  p.dh = static_cast<int>(dilation[0]), p.dw = static_cast<int>(dilation[1]);
  p.oh = conv_output_size(p.h, p.kh, p.sh, p.ph, p.dh), p.ow = conv_output_size(p.w, p.kw, p.sw, p.pw, p.dw);
  p.channels_last = channels_last;
  TORCH_CHECK(lanes == 1 || lanes == 4 || lanes == 8, "lanes must be 1, 4 or 8");
  TORCH_CHECK(lanes == 1 || cuda::depthwise_lanes(p, static_cast<int>(16 / lanes)) == lanes,
              "lanes > 1 needs channels_last and channels a multiple of lanes");
  at::Tensor out = at::empty({p.n, p.c, p.oh, p.ow}, in.options().memory_format(fmt));
  const at::Tensor r = residual ? residual->to(at::kFloat).contiguous(fmt) : at::Tensor();
  TORCH_CHECK(!residual || r.sizes() == out.sizes(), "residual must have the output's shape ", out.sizes());
  p.input = in.data_ptr();
  p.weight = w.data_ptr();
  p.bias = bias ? b.data_ptr() : nullptr;
  p.residual = residual ? r.data_ptr() : nullptr;
  const float *pin = in.data_ptr<float>(), *pw = w.data_ptr<float>();
  const float* pb = bias ? b.data_ptr<float>() : nullptr;
  const float* pr = residual ? r.data_ptr<float>() : nullptr;
  float* po = out.data_ptr<float>();
  const int64_t total = out.numel();
  auto run = [&](auto lanes_tag) {
    constexpr int V = decltype(lanes_tag)::value;
    for (int64_t g = 0; g < total / V; ++g) {
      float acc[V];
      cuda::depthwise_pre_activation<V>(
          p, cuda::depthwise_out_coord(p, g, V), acc,
          [&](int64_t k, float(&v)[V]) { std::copy(pin + k, pin + k + V, v); }, [&](int64_t k) { return pw[k]; },
          [&](int64_t k) { return pb[k]; }, [&](int64_t k, float(&v)[V]) { std::copy(pr + k, pr + k + V, v); });
      std::copy(acc, acc + V, po + g * V);
    }
  };
  if (tiled) {
    // Block by block as the tiled kernel runs: the patch, then each thread's output; every output must
    // be written by exactly one thread of one block.
    TORCH_CHECK(lanes == 1 && !cuda::depthwise_tiled_why_not(p), "tiled needs NCHW, lanes 1 and a patch that fits");
    std::vector<int> writes(static_cast<size_t>(total), 0);
    std::vector<float> patch;
    const int64_t blocks = p.n * p.c * cuda::depthwise_tiles_per_plane(p);
    for (int64_t block = 0; block < blocks; ++block) {
      const cuda::DepthwiseTile t = cuda::depthwise_tile(p, block);
      patch.assign(static_cast<size_t>(t.patch_h * t.patch_w), 0.f);
      for (int64_t k = 0; k < t.patch_h * t.patch_w; ++k) {
        const int64_t src = cuda::depthwise_patch_source(p, t, k);
        if (src >= 0) patch[k] = pin[src];
      }
      for (int a = 0; a < cuda::kTileH; ++a) {
        for (int b = 0; b < cuda::kTileW; ++b) {
          if (t.oy0 + a >= p.oh || t.ox0 + b >= p.ow) continue;
          const int64_t at = cuda::depthwise_offset(p, t.n, t.c, t.oy0 + a, t.ox0 + b, p.oh, p.ow);
          po[at] = cuda::depthwise_tile_pre_activation(
              p, t, a, b, [&](int64_t k) { return patch.at(static_cast<size_t>(k)); }, [&](int64_t k) { return pw[k]; },
              [&](int64_t k) { return pb[k]; }, [&](int64_t k) { return pr[k]; });
          ++writes[at];
        }
      }
    }
    for (int64_t i = 0; i < total; ++i)
      TORCH_CHECK(writes[i] == 1, "tiled: output element ", i, " was written ", writes[i], " times");
  } else if (lanes == 8) {
    run(std::integral_constant<int, 8>{});
  } else if (lanes == 4) {
    run(std::integral_constant<int, 4>{});
  } else {
    run(std::integral_constant<int, 1>{});
  }
  return out;
}

}  // namespace
}  // namespace fastpipe::conv

TORCH_LIBRARY_FRAGMENT(fastpipe, m) {
  m.def(
      "_depthwise_host(Tensor input, Tensor weight, Tensor? bias, Tensor? residual, int[2] stride, int[2] padding, "
      "int[2] dilation, bool channels_last, int lanes=1, bool tiled=False) -> Tensor");
}

TORCH_LIBRARY_IMPL(fastpipe, CPU, m) {
  m.impl("_depthwise_host", &fastpipe::conv::depthwise_host);
}
