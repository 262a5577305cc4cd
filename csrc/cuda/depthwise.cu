// The direct depthwise kernel (see depthwise.h): one thread per output element, taps read straight from
// the input (neighbouring threads read neighbouring pixels or channels, which the caches share), the
// bias, residual and activation applied before the one write.
#include "cuda/depthwise_launch.h"

#include <algorithm>

#include "cuda/device_math.cuh"

namespace fastpipe::cuda {
namespace {

constexpr int kThreads = 256;

template <typename T, Act A>
__global__ void __launch_bounds__(kThreads) depthwise_kernel(DepthwiseParams p, int64_t total) {
  const T* in = static_cast<const T*>(p.input);
  const T* w = static_cast<const T*>(p.weight);
  const T* bias = static_cast<const T*>(p.bias);
  const T* res = static_cast<const T*>(p.residual);
  T* out = static_cast<T*>(p.out);
  const float alpha = static_cast<float>(p.act.alpha), beta = static_cast<float>(p.act.beta);
  for (int64_t i = blockIdx.x * int64_t(kThreads) + threadIdx.x; i < total; i += int64_t(gridDim.x) * kThreads) {
    const OutCoord o = depthwise_out_coord(p, i);
    const float z = depthwise_pre_activation(
        p, o, [&](int64_t k) { return to_float(__ldg(in + k)); }, [&](int64_t k) { return to_float(__ldg(w + k)); },
        [&](int64_t k) { return to_float(__ldg(bias + k)); }, [&](int64_t k) { return to_float(__ldg(res + k)); });
    out[i] = from_float<T>(act_forward<A>(z, alpha, beta));
  }
}

}  // namespace

cudaError_t launch_depthwise(const DepthwiseParams& p, int num_sms, cudaStream_t stream) {
  const int64_t total = p.n * p.c * p.oh * p.ow;
  if (total <= 0 || p.kh < 1 || p.kw < 1 || p.sh < 1 || p.sw < 1 || p.dh < 1 || p.dw < 1 || p.ph < 0 || p.pw < 0)
    return total == 0 ? cudaSuccess : cudaErrorInvalidValue;
  const int64_t blocks = std::min<int64_t>((total + kThreads - 1) / kThreads, int64_t(num_sms) * 32);
  dtype_switch(static_cast<DType>(p.dtype), [&](auto t) {
    using T = decltype(t);
    act_switch(p.act.act, [&](auto a) {
      depthwise_kernel<T, decltype(a)::value><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(p, total);
    });
  });
  return cudaGetLastError();
}

}  // namespace fastpipe::cuda
