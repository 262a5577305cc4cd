// Autocast of the fused convolution ops: they run in the autocast dtype, like F.conv2d.
#include <ATen/autocast_mode.h>
#include <torch/library.h>

#include "ops/conv_act.h"

namespace fastpipe::conv {
namespace {

template <c10::DeviceType D, typename Ret, const char* Name>
Ret autocast_conv(FASTPIPE_CONV_ACT_PARAMS) {
  static const auto op = op_handle<ConvActFn<Ret>>(Name);
  c10::impl::ExcludeDispatchKeyGuard no_autocast(at::autocast::get_autocast_dispatch_key_from_device_type(D));
  const at::ScalarType dt = at::autocast::get_lower_precision_fp_from_device_type(D);
  using at::autocast::cached_cast;
  return op.call(cached_cast(dt, input, D), cached_cast(dt, weight, D), cached_cast(dt, bias, D), stride, padding,
                 dilation, groups, activation, act_args, cached_cast(dt, residual, D));
}

template <c10::DeviceType D>
void register_autocast(torch::Library& m) {
  m.impl("conv2d_act", &autocast_conv<D, at::Tensor, kConv2dAct>);
  m.impl("_conv2d_act_train", &autocast_conv<D, ConvActTrainRet, kConv2dActTrain>);
}

}  // namespace
}  // namespace fastpipe::conv

TORCH_LIBRARY_IMPL(fastpipe, AutocastCPU, m) {
  fastpipe::conv::register_autocast<c10::DeviceType::CPU>(m);
}

TORCH_LIBRARY_IMPL(fastpipe, AutocastCUDA, m) {
  fastpipe::conv::register_autocast<c10::DeviceType::CUDA>(m);
}
