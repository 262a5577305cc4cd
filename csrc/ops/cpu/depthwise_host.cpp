// The depthwise kernels' code (csrc/kernels/depthwise.h) run on the host, in float32, so that the CPU tests
// check their index and boundary arithmetic on every build, GPU or not:
// - fastpipe::_depthwise_host, the forward kernels' per-element code over a whole output grid, before
//   the activation, `lanes` channels per step as the vectorised NHWC path computes them (1: the
//   element-wise path), or block by block through shared-memory patches as the NCHW tiled kernel does
//   (`tiled`);
// - the CPU backward engine "depthwise": the backward kernels' per-element code over the input grid and
//   their weight-gradient blocks one by one, as the GPU runs them (plan, ranges, streams, partial sums
//   per split). A model, registered unvalidated: only FASTPIPE_CONV_ENGINE=depthwise runs it.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "kernels/depthwise.h"
#include "ops/conv_act.h"
#include "ops/conv_tuner.h"
#include "ops/kernel_params.h"

namespace fastpipe::conv {
namespace {

// V = 1, 4 or 8 as a compile-time constant.
template <typename F>
void lanes_switch(int lanes, F&& f) {
  if (lanes == 8) {
    f(std::integral_constant<int, 8>{});
  } else if (lanes == 4) {
    f(std::integral_constant<int, 4>{});
  } else {
    f(std::integral_constant<int, 1>{});
  }
}

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
  } else {
    lanes_switch(static_cast<int>(lanes), run);
  }
  return out;
}

// The SM count the model plans for (an H100's or H200's), so that it splits the positions as a GPU does.
constexpr int kModelSms = 132;

EngineOut depthwise_backward_model(const ConvArgs& a) {
  const cuda::DepthwiseParams p = depthwise_shape(a);
  const at::Tensor g = a.grad.to(at::kFloat).contiguous(a.format), x = a.input.to(at::kFloat).contiguous(a.format);
  const at::Tensor w = a.weight.to(at::kFloat).contiguous();
  const float *pg = g.data_ptr<float>(), *px = x.data_ptr<float>(), *pw = w.data_ptr<float>();
  EngineOut out;
  if (a.need[0]) {
    at::Tensor dx = at::empty(a.input.sizes(), x.options().memory_format(a.format));
    float* pdx = dx.data_ptr<float>();
    // As many channels per step as the vectorised path takes of the real dtype.
    lanes_switch(cuda::depthwise_lanes(p, static_cast<int>(a.input.element_size())), [&](auto lanes_tag) {
      constexpr int V = decltype(lanes_tag)::value;
      at::parallel_for(0, dx.numel() / V, 1024, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
          float acc[V];
          cuda::depthwise_input_grad<V>(
              p, cuda::depthwise_coord(p, i, p.h, p.w, V), acc,
              [&](int64_t k, float(&v)[V]) { std::copy(pg + k, pg + k + V, v); }, [&](int64_t k) { return pw[k]; });
          std::copy(acc, acc + V, pdx + i * V);
        }
      });
    });
    out[0] = dx.to(a.input.scalar_type());
  }
  if (a.need[1] || a.need[2]) {
    const cuda::WgradPlan plan = cuda::depthwise_wgrad_plan(p, kModelSms);
    const int64_t taps = int64_t(p.kh) * p.kw + 1;
    // partial[split][c][tap] as the GPU's blocks write it; each entry written once (checked).
    std::vector<float> partial(static_cast<size_t>(plan.splits * p.c * taps), 0.f);
    std::vector<int> writes(partial.size(), 0);
    cuda::depthwise_wgrad_size_switch(p.kh, p.kw, [&](auto size_tag) {
      constexpr int K = decltype(size_tag)::value;
      at::parallel_for(0, plan.channel_blocks * plan.splits, 1, [&](int64_t first, int64_t last) {
        for (int64_t block = first; block < last; ++block) {
          const cuda::WgradBlock b = cuda::depthwise_wgrad_block(plan, block);
          for (int cl = 0; cl < plan.cpb && b.c0 + cl < p.c; ++cl) {
            const int64_t c = b.c0 + cl;
            float sums[K * K + 1] = {};
            for (int s = 0; s < plan.streams; ++s) {  // a thread each
              float acc[K * K + 1] = {};
              for (int64_t pos = b.begin + s; pos < b.end; pos += plan.streams) {
                cuda::depthwise_wgrad_add<K, K>(p, c, pos, acc, [&](int64_t k) { return pg[k]; },
                                                [&](int64_t k) { return px[k]; });
              }
              for (int t = 0; t < K * K + 1; ++t) sums[t] += acc[t];
            }
            for (int t = 0; t < K * K + 1; ++t) {
              const size_t at = static_cast<size_t>((b.split * p.c + c) * taps + t);
              partial[at] = sums[t];
              ++writes[at];
            }
          }
        }
      });
    });
    for (size_t i = 0; i < writes.size(); ++i)
      TORCH_CHECK(writes[i] == 1, "depthwise backward model: partial sum ", i, " was written ", writes[i], " times");
    at::Tensor total = at::zeros({p.c, taps}, x.options());
    float* pt = total.data_ptr<float>();
    for (int64_t split = 0; split < plan.splits; ++split)  // the finalize kernel's order
      for (int64_t i = 0; i < p.c * taps; ++i) pt[i] += partial[static_cast<size_t>(split * p.c * taps + i)];
    total = total.to(a.input.scalar_type());
    depthwise_grads_from_sums(total, a, out);
  }
  return out;
}

[[maybe_unused]] const bool cpu_backward_engines = register_engines(
    c10::DeviceType::CPU, DeviceHooks{},
    {{"depthwise", depthwise_backward_args_why_not, nullptr, /*validated=*/false, depthwise_backward_model}},
    /*backward=*/true);

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
