// The CUDA kernels' parameter structs (csrc/kernels) filled from checked arguments: shared by the CUDA glue
// (cuda/) and the kernels' host models (cpu/), so that both see the same shapes.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>

#include "kernels/depthwise.h"
#include "kernels/dtype.h"
#include "ops/conv_act.h"

namespace fastpipe::conv {

inline bool kernel_dtype_ok(at::ScalarType t) {
  return t == at::kFloat || t == at::kHalf || t == at::kBFloat16;
}

inline cuda::DType kernel_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return cuda::DType::Float;
    case at::kHalf: return cuda::DType::Half;
    case at::kBFloat16: return cuda::DType::BFloat16;
    default: TORCH_CHECK(false, "fastpipe's CUDA kernels take float32, float16 or bfloat16, got ", t);
  }
}

// Why the depthwise kernels cannot compute `a` on any device (null when they can).
inline const char* depthwise_args_why_not(const ConvArgs& a) {
  if (!kernel_dtype_ok(a.input.scalar_type())) return "its kernels take float32, float16 and bfloat16 only";
  if (a.groups != a.input.size(1) || a.weight.size(0) != a.groups)
    return "it computes depthwise convolutions only (groups = in_channels = out_channels)";
  return nullptr;
}

// The depthwise kernels' shape, dtype and activation fields for `a` (no tensor pointers).
inline cuda::DepthwiseParams depthwise_shape(const ConvArgs& a) {
  cuda::DepthwiseParams p;
  p.n = a.input.size(0), p.c = a.input.size(1), p.h = a.input.size(2), p.w = a.input.size(3);
  p.oh = a.out_sizes[2], p.ow = a.out_sizes[3];
  p.kh = static_cast<int>(a.weight.size(2)), p.kw = static_cast<int>(a.weight.size(3));
  p.sh = static_cast<int>(a.stride[0]), p.sw = static_cast<int>(a.stride[1]);
  p.ph = static_cast<int>(a.padding[0]), p.pw = static_cast<int>(a.padding[1]);
  p.dh = static_cast<int>(a.dilation[0]), p.dw = static_cast<int>(a.dilation[1]);
  p.channels_last = a.format == at::MemoryFormat::ChannelsLast;
  p.dtype = static_cast<int>(kernel_dtype(a.input.scalar_type()));
  p.act = a.act;
  return p;
}

// Why the depthwise backward kernels cannot compute the backward call `a` on any device (null when they can).
inline const char* depthwise_backward_args_why_not(const ConvArgs& a) {
  if (const char* why = depthwise_args_why_not(a)) return why;
  return cuda::depthwise_backward_why_not(depthwise_shape(a));
}

// The weight and bias gradients `a` asks for, into out[1] and out[2], from the weight-gradient kernels'
// per-channel sums [c, kh * kw + 1] (the bias's last) in the input's dtype.
inline void depthwise_grads_from_sums(const at::Tensor& sums, const ConvArgs& a, std::array<at::Tensor, 3>& out) {
  const int64_t taps = sums.size(1);
  if (a.need[1]) out[1] = sums.narrow(1, 0, taps - 1).reshape(a.weight.sizes());
  if (a.need[2]) out[2] = sums.select(1, taps - 1).contiguous();
}

}  // namespace fastpipe::conv
