// CUDA side of the fused convolution ops, one engine each (conv_tuner.h):
//   epilogue         cuDNN convolution without bias, then one fastpipe kernel for bias + residual + activation
//                    (two passes where eager makes three);
//   cudnn_fused      cuDNN's one-kernel conv + bias (+ add) + ReLU;
//   depthwise        a direct kernel with the epilogue inside (vectorised over channels in NHWC);
//   depthwise_tiled  its NCHW variant reading the input through shared-memory tiles;
//   gemm1x1          a 1x1 channels_last conv as one cuBLASLt GEMM with the epilogue in it;
// the backward engine depthwise (direct input- and weight-gradient kernels);
// and the fused backward prologue (activation gradient + bias-gradient reduction in one pass). None of them
// has run on a GPU yet: the engines are registered unvalidated, so only FASTPIPE_CONV_ENGINE runs them, and
// the prologue runs only under FASTPIPE_CONV_ACT_BACKWARD=kernel (ATen's ops otherwise; conv_act.h).
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/record_function.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <vector>

#include "cuda/depthwise_launch.h"
#include "cuda/epilogue.h"
#include "cuda/gemm1x1_launch.h"
#include "ops/activations.h"
#include "ops/conv_act.h"
#include "ops/conv_tuner.h"
#include "ops/kernel_params.h"

namespace fastpipe::conv {
namespace {

#define FASTPIPE_CHECK_LAUNCH(expr, what)                                                   \
  do {                                                                                      \
    const cudaError_t err_ = (expr);                                                        \
    TORCH_CHECK(err_ == cudaSuccess, what, " failed: ", cudaGetErrorString(err_));          \
  } while (0)

// The kernels read and write 16 bytes at a time: a dense tensor in `fmt` starting 16-byte aligned.
at::Tensor aligned_dense(const at::Tensor& t, at::MemoryFormat fmt) {
  at::Tensor d = t.contiguous(fmt);
  return reinterpret_cast<uintptr_t>(d.data_ptr()) % 16 == 0 ? d : d.clone(fmt);
}

int num_sms() {
  return at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
}

const char* epilogue_why_not(const ConvArgs& a) {
  const int64_t numel = a.out_sizes[0] * a.out_sizes[1] * a.out_sizes[2] * a.out_sizes[3];
  if (!a.input.is_cuda()) return "not a CUDA tensor";
  if (!kernel_dtype_ok(a.input.scalar_type())) return "its kernels take float32, float16 and bfloat16 only";
  if (numel > cuda::kMaxElements) return "the output has more elements than its kernels index";
  return nullptr;
}

// The epilogue kernel's parameters for a pass in place over `y`, the conv output of `a`, with a's
// activation; the caller adds the bias and residual it needs applied.
cuda::EpilogueParams epilogue_params(const at::Tensor& y, const ConvArgs& a) {
  cuda::EpilogueParams p;
  p.out = y.data_ptr();
  p.y = p.out;
  p.batch = y.size(0);
  p.channels = y.size(1);
  p.spatial = y.size(2) * y.size(3);
  p.channels_last = a.format == at::MemoryFormat::ChannelsLast;
  p.dtype = kernel_dtype(y.scalar_type());
  p.act = a.act;
  return p;
}

at::Tensor epilogue_run(const ConvArgs& a) {
  // at::convolution picks cuDNN and honours cudnn.benchmark, deterministic and the TF32 settings.
  at::Tensor y = aligned_dense(
      at::convolution(a.input, a.weight, std::nullopt, a.stride, a.padding, a.dilation, false, {0, 0}, a.groups),
      a.format);
  const at::Tensor bias = a.bias ? a.bias->contiguous() : at::Tensor();
  const at::Tensor residual = a.residual ? aligned_dense(*a.residual, a.format) : at::Tensor();
  cuda::EpilogueParams p = epilogue_params(y, a);
  p.bias = bias.defined() ? bias.data_ptr() : nullptr;
  p.residual = residual.defined() ? residual.data_ptr() : nullptr;
  FASTPIPE_CHECK_LAUNCH(cuda::launch_epilogue(p, num_sms(), at::cuda::getCurrentCUDAStream()),
                        "fastpipe conv epilogue kernel");
  return y;
}

std::tuple<at::Tensor, at::Tensor> conv2d_act_backward_cuda(const at::Tensor& grad_out, const at::Tensor& saved,
                                                            c10::string_view activation,
                                                            at::ArrayRef<double> act_args, bool bias_grad) {
  const ActSpec act = check_backward_args(grad_out, saved, activation, act_args);
  const c10::cuda::CUDAGuard device_guard(saved.device());
  if (!act_backward_kernel_on() || !kernel_dtype_ok(saved.scalar_type()) || saved.numel() == 0 ||
      saved.numel() > cuda::kMaxElements) {
    return act_backward_aten(grad_out, saved, act, bias_grad);
  }
  RECORD_FUNCTION("fastpipe::conv_act_backward.kernel", std::vector<c10::IValue>());  // the tests look for it
  const auto fmt = saved.suggest_memory_format();
  const at::Tensor g = aligned_dense(grad_out, fmt);
  const at::Tensor s = aligned_dense(saved, fmt);
  at::Tensor grad_in = at::empty_like(s);
  cuda::ActBackwardParams p;
  p.grad_in = grad_in.data_ptr();
  p.grad_out = g.data_ptr();
  p.saved = s.data_ptr();
  p.batch = s.size(0);
  p.channels = s.size(1);
  p.spatial = s.size(2) * s.size(3);
  p.channels_last = fmt == at::MemoryFormat::ChannelsLast;
  p.dtype = kernel_dtype(s.scalar_type());
  p.act = act;
  p.splits = cuda::act_backward_splits(p.batch, p.channels, p.spatial, p.channels_last, num_sms());
  const at::Tensor partial =
      bias_grad ? at::empty({p.splits, p.channels}, s.options().dtype(at::kFloat)) : at::Tensor();
  p.bias_partial = bias_grad ? partial.data_ptr<float>() : nullptr;
  const auto stream = at::cuda::getCurrentCUDAStream();
  FASTPIPE_CHECK_LAUNCH(cuda::launch_act_backward(p, stream), "fastpipe conv activation-backward kernel");
  at::Tensor grad_bias = at::empty({bias_grad ? p.channels : 0}, s.options());
  if (bias_grad) {
    FASTPIPE_CHECK_LAUNCH(cuda::launch_bias_grad_finalize(grad_bias.data_ptr(), partial.data_ptr<float>(), p.splits,
                                                          p.channels, p.dtype, stream),
                          "fastpipe conv bias-gradient kernel");
  }
  return {grad_in, grad_bias};
}

// cuDNN's own single-kernel conv + bias + ReLU (+ the residual added before the ReLU), where its runtime
// fusion accepts the call: torch's cudnn_convolution_relu and cudnn_convolution_add_relu.
const char* cudnn_fused_why_not(const ConvArgs& a) {
  if (!a.input.is_cuda()) return "not a CUDA tensor";
  if (a.act.act != Act::Relu) return "cuDNN fuses ReLU only";
  if (!kernel_dtype_ok(a.input.scalar_type())) return "cuDNN's fused path takes float32, float16 and bfloat16 only";
  if (!at::globalContext().userEnabledCuDNN()) return "cuDNN is disabled (torch.backends.cudnn.enabled = False)";
  return nullptr;
}

at::Tensor cudnn_fused_run(const ConvArgs& a) {
  const at::Tensor input = a.input.contiguous(a.format), weight = a.weight.contiguous(a.format);
  if (a.residual) {
    return at::cudnn_convolution_add_relu(input, weight, a.residual->contiguous(a.format), at::Scalar(1.0), a.bias,
                                          a.stride, a.padding, a.dilation, a.groups);
  }
  return at::cudnn_convolution_relu(input, weight, a.bias, a.stride, a.padding, a.dilation, a.groups);
}

// The direct depthwise kernel with bias, residual and activation inside (csrc/kernels/depthwise.h).
const char* depthwise_why_not(const ConvArgs& a) {
  if (!a.input.is_cuda()) return "not a CUDA tensor";
  return depthwise_args_why_not(a);
}

// The depthwise kernels' parameters, and the dense operands and output they point to (kept alive by `keep`).
cuda::DepthwiseParams depthwise_params(const ConvArgs& a, std::vector<at::Tensor>& keep) {
  const at::Tensor input = a.input.contiguous(a.format), weight = a.weight.contiguous();
  const at::Tensor residual = a.residual ? a.residual->contiguous(a.format) : at::Tensor();
  const at::Tensor bias = a.bias ? a.bias->contiguous() : at::Tensor();
  at::Tensor out = at::empty(a.out_sizes, input.options().memory_format(a.format));
  cuda::DepthwiseParams p = depthwise_shape(a);
  p.out = out.data_ptr();
  p.input = input.data_ptr();
  p.weight = weight.data_ptr();
  p.bias = a.bias ? bias.data_ptr() : nullptr;
  p.residual = a.residual ? residual.data_ptr() : nullptr;
  keep = {out, input, weight, residual, bias};  // out first: the result
  return p;
}

at::Tensor depthwise_run(const ConvArgs& a) {
  std::vector<at::Tensor> keep;
  const cuda::DepthwiseParams p = depthwise_params(a, keep);
  FASTPIPE_CHECK_LAUNCH(cuda::launch_depthwise(p, num_sms(), at::cuda::getCurrentCUDAStream()),
                        "fastpipe depthwise convolution kernel");
  return keep[0];
}

// The NCHW shared-memory-tile variant of the depthwise kernel (csrc/kernels/depthwise.h).
const char* depthwise_tiled_why_not(const ConvArgs& a) {
  if (const char* why = depthwise_why_not(a)) return why;
  return cuda::depthwise_tiled_why_not(depthwise_shape(a));
}

at::Tensor depthwise_tiled_run(const ConvArgs& a) {
  std::vector<at::Tensor> keep;
  const cuda::DepthwiseParams p = depthwise_params(a, keep);
  FASTPIPE_CHECK_LAUNCH(cuda::launch_depthwise_tiled(p, at::cuda::getCurrentCUDAStream()),
                        "fastpipe tiled depthwise convolution kernel");
  return keep[0];
}

// The depthwise engine's backward: the input gradient by a direct kernel, the weight and bias gradients
// by per-block partial sums added per channel (csrc/kernels/depthwise.h).
const char* depthwise_backward_why_not(const ConvArgs& a) {
  if (!a.input.is_cuda()) return "not a CUDA tensor";
  return depthwise_backward_args_why_not(a);
}

EngineOut depthwise_backward_run(const ConvArgs& a) {
  const cuda::DepthwiseParams p = depthwise_shape(a);
  const at::Tensor g = aligned_dense(a.grad, a.format), x = a.input.contiguous(a.format);
  const at::Tensor w = a.weight.contiguous();
  const auto stream = at::cuda::getCurrentCUDAStream();
  EngineOut out;
  if (a.need[0]) {
    out[0] = at::empty(a.input.sizes(), x.options().memory_format(a.format));
    FASTPIPE_CHECK_LAUNCH(
        cuda::launch_depthwise_input_grad(p, g.data_ptr(), w.data_ptr(), out[0].data_ptr(), num_sms(), stream),
        "fastpipe depthwise input-gradient kernel");
  }
  if (a.need[1] || a.need[2]) {
    const cuda::WgradPlan plan = cuda::depthwise_wgrad_plan(p, num_sms());
    const int64_t taps = int64_t(p.kh) * p.kw + 1;
    at::Tensor total = plan.splits > 0 ? at::empty({p.c, taps}, x.options()) : at::zeros({p.c, taps}, x.options());
    if (plan.splits > 0) {
      const at::Tensor partial = at::empty({plan.splits, p.c, taps}, x.options().dtype(at::kFloat));
      FASTPIPE_CHECK_LAUNCH(
          cuda::launch_depthwise_wgrad(p, plan, g.data_ptr(), x.data_ptr(), partial.data_ptr<float>(), stream),
          "fastpipe depthwise weight-gradient kernel");
      FASTPIPE_CHECK_LAUNCH(cuda::launch_bias_grad_finalize(total.data_ptr(), partial.data_ptr<float>(),
                                                            static_cast<int>(plan.splits), p.c * taps,
                                                            kernel_dtype(x.scalar_type()), stream),
                            "fastpipe depthwise weight-gradient finalize kernel");
    }
    depthwise_grads_from_sums(total, a, out);
  }
  return out;
}

// A 1x1 convolution on channels_last tensors as one cuBLASLt GEMM with the residual, bias and ReLU or
// tanh-GELU in its epilogue (csrc/kernels/gemm1x1.h); other activations take one epilogue-kernel pass after it.
const char* gemm1x1_why_not(const ConvArgs& a) {
  if (const char* why = epilogue_why_not(a)) return why;  // its activation pass is the epilogue kernel
  if (a.weight.size(2) != 1 || a.weight.size(3) != 1 || a.groups != 1)
    return "it computes 1x1 convolutions of one group";
  if (a.stride[0] != 1 || a.stride[1] != 1 || a.padding[0] != 0 || a.padding[1] != 0)
    return "it computes stride 1 without padding only";
  if (a.format != at::MemoryFormat::ChannelsLast)
    return "NCHW: the GEMM's bias runs along the output's channels only in channels_last";
  static const std::string missing = cuda::cublaslt_missing();
  if (!missing.empty()) return missing.c_str();
  return nullptr;
}

at::Tensor gemm1x1_run(const ConvArgs& a) {
  const auto cl = at::MemoryFormat::ChannelsLast;
  // cuBLASLt's fast algorithms and the epilogue kernel want 16-byte aligned operands (views may not be).
  const at::Tensor input = aligned_dense(a.input, cl), weight = aligned_dense(a.weight, at::MemoryFormat::Contiguous);
  const at::Tensor residual = a.residual ? aligned_dense(*a.residual, cl) : at::Tensor();
  const at::Tensor bias = a.bias ? aligned_dense(*a.bias, at::MemoryFormat::Contiguous) : at::Tensor();
  at::Tensor out = at::empty(a.out_sizes, input.options().memory_format(cl));
  constexpr int64_t kWorkspace = 4 << 20;
  const at::Tensor workspace = at::empty({kWorkspace}, input.options().dtype(at::kByte));
  cuda::Gemm1x1Params p;
  p.plan = cuda::plan_conv1x1(input.size(0), input.size(2) * input.size(3), input.size(1), weight.size(0),
                              bias.defined(), residual.defined(), a.act.act);
  p.weight = weight.data_ptr();
  p.input = input.data_ptr();
  p.residual = residual.defined() ? residual.data_ptr() : nullptr;
  p.bias = bias.defined() ? bias.data_ptr() : nullptr;
  p.out = out.data_ptr();
  p.dtype = kernel_dtype(input.scalar_type());
  p.tf32 = at::globalContext().allowTF32CuDNN(at::Float32Op::CONV);  // a conv: the conv setting, as eager
  p.workspace = workspace.data_ptr();
  p.workspace_bytes = kWorkspace;
  const auto stream = at::cuda::getCurrentCUDAStream();
  const std::string err = cuda::run_gemm1x1(p, at::cuda::getCurrentCUDABlasLtHandle(), stream);
  TORCH_CHECK(err.empty(), "fastpipe gemm1x1 engine: ", err);
  if (p.plan.bias_after || p.plan.activation_after) {
    cuda::EpilogueParams e = epilogue_params(out, a);
    e.bias = p.plan.bias_after ? p.bias : nullptr;
    FASTPIPE_CHECK_LAUNCH(cuda::launch_epilogue(e, num_sms(), stream), "fastpipe conv epilogue kernel");
  }
  return out;
}

void synchronize(c10::DeviceIndex index) {
  c10::cuda::getCurrentCUDAStream(index).synchronize();
}

double elapsed_ms(c10::DeviceIndex index, c10::function_ref<void()> fn) {
  const auto stream = c10::cuda::getCurrentCUDAStream(index);
  at::cuda::CUDAEvent start(cudaEventDefault), stop(cudaEventDefault);  // the default flags time nothing
  start.record(stream);
  fn();
  stop.record(stream);
  stop.synchronize();
  return start.elapsed_time(stop);
}

bool capturing() {
  return c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None;
}

[[maybe_unused]] const bool cuda_engines = register_engines(c10::DeviceType::CUDA, DeviceHooks{synchronize, capturing, elapsed_ms},
                                                            {{"epilogue", epilogue_why_not, epilogue_run, /*validated=*/false},
                                                             {"cudnn_fused", cudnn_fused_why_not, cudnn_fused_run,
                                                              /*validated=*/false},
                                                             {"depthwise", depthwise_why_not, depthwise_run,
                                                              /*validated=*/false},
                                                             {"depthwise_tiled", depthwise_tiled_why_not,
                                                              depthwise_tiled_run, /*validated=*/false},
                                                             {"gemm1x1", gemm1x1_why_not, gemm1x1_run,
                                                              /*validated=*/false}});
[[maybe_unused]] const bool cuda_backward_engines =
    register_engines(c10::DeviceType::CUDA, DeviceHooks{synchronize, capturing, elapsed_ms},
                     {{"depthwise", depthwise_backward_why_not, nullptr, /*validated=*/false, depthwise_backward_run}},
                     /*backward=*/true);

}  // namespace
}  // namespace fastpipe::conv

TORCH_LIBRARY_FRAGMENT(fastpipe, m) {
  // Test hook: the gemm1x1 engine's cuBLASLt lookup in the library `soname` (why it declines, or "").
  m.def("_gemm1x1_cublaslt_lookup(str soname) -> str",
        [](c10::string_view soname) { return fastpipe::cuda::cublaslt_missing_from(std::string(soname)); });
}

TORCH_LIBRARY_IMPL(fastpipe, CUDA, m) {
  m.impl("conv2d_act", &fastpipe::conv::conv2d_act);
  m.impl("_conv2d_act_train", &fastpipe::conv::conv2d_act_train);
  m.impl("_conv2d_act_backward", &fastpipe::conv::conv2d_act_backward_cuda);
}
