// The direct depthwise kernels (see depthwise.h). Forward: one thread per output element, or per V
// channels of a pixel on the vectorised NHWC path (16-byte loads of input and residual, one 16-byte
// store); taps read straight from the input (neighbouring threads read neighbouring pixels or channels,
// which the caches share), the bias, residual and activation applied before the one write; or the NCHW
// variant through shared-memory tiles. Backward: the input gradient like the forward (a thread per input
// element or V channels), the weight and bias gradients as per-block partial sums (depthwise_wgrad_plan)
// added per channel by the bias-gradient finalize kernel (epilogue.cu).
#include "cuda/depthwise_launch.h"

#include <algorithm>

#include "cuda/device_math.cuh"

namespace fastpipe::cuda {
namespace {

constexpr int kThreads = 256;

template <typename T, Act A, int V>
__global__ void __launch_bounds__(kThreads) depthwise_kernel(DepthwiseParams p, int64_t groups) {
  const T* in = static_cast<const T*>(p.input);
  const T* w = static_cast<const T*>(p.weight);
  const T* bias = static_cast<const T*>(p.bias);
  const T* res = static_cast<const T*>(p.residual);
  T* out = static_cast<T*>(p.out);
  const float alpha = static_cast<float>(p.act.alpha), beta = static_cast<float>(p.act.beta);
  for (int64_t i = blockIdx.x * int64_t(kThreads) + threadIdx.x; i < groups; i += int64_t(gridDim.x) * kThreads) {
    const OutCoord o = depthwise_out_coord(p, i, V);
    float z[V];
    depthwise_pre_activation<V>(
        p, o, z, [&](int64_t k, float(&v)[V]) { load_lanes<T, V>(in + k, v); },
        [&](int64_t k) { return to_float(__ldg(w + k)); }, [&](int64_t k) { return to_float(__ldg(bias + k)); },
        [&](int64_t k, float(&v)[V]) { load_lanes<T, V>(res + k, v); });
    Pack<T, V> pk;
    for (int l = 0; l < V; ++l) pk.v[l] = from_float<T>(act_forward<A>(z[l], alpha, beta));
    *reinterpret_cast<Pack<T, V>*>(out + i * V) = pk;  // element i * V: groups are consecutive in NHWC
  }
}

// One block per tile of one NCHW plane (depthwise.h): the patch into shared memory, then a thread per output.
template <typename T, Act A>
__global__ void __launch_bounds__(kTileH * kTileW) depthwise_tiled_kernel(DepthwiseParams p) {
  extern __shared__ float patch[];
  const T* in = static_cast<const T*>(p.input);
  const T* w = static_cast<const T*>(p.weight);
  const T* bias = static_cast<const T*>(p.bias);
  const T* res = static_cast<const T*>(p.residual);
  T* out = static_cast<T*>(p.out);
  const DepthwiseTile t = depthwise_tile(p, blockIdx.x);
  const int tid = threadIdx.x;
  for (int64_t k = tid; k < t.patch_h * t.patch_w; k += kTileH * kTileW) {
    const int64_t src = depthwise_patch_source(p, t, k);
    patch[k] = src < 0 ? 0.f : to_float(__ldg(in + src));
  }
  __syncthreads();
  const int a = tid / kTileW, b = tid % kTileW;
  if (t.oy0 + a >= p.oh || t.ox0 + b >= p.ow) return;
  const float z = depthwise_tile_pre_activation(
      p, t, a, b, [&](int64_t k) { return patch[k]; }, [&](int64_t k) { return to_float(__ldg(w + k)); },
      [&](int64_t k) { return to_float(__ldg(bias + k)); }, [&](int64_t k) { return to_float(__ldg(res + k)); });
  out[depthwise_offset(p, t.n, t.c, t.oy0 + a, t.ox0 + b, p.oh, p.ow)] =
      from_float<T>(act_forward<A>(z, static_cast<float>(p.act.alpha), static_cast<float>(p.act.beta)));
}


// dx, a thread per input element or per V channels of a pixel (as the forward kernel).
template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    depthwise_input_grad_kernel(DepthwiseParams p, const T* g, const T* w, T* dx, int64_t groups) {
  for (int64_t i = blockIdx.x * int64_t(kThreads) + threadIdx.x; i < groups; i += int64_t(gridDim.x) * kThreads) {
    float acc[V];
    depthwise_input_grad<V>(
        p, depthwise_coord(p, i, p.h, p.w, V), acc, [&](int64_t k, float(&v)[V]) { load_lanes<T, V>(g + k, v); },
        [&](int64_t k) { return to_float(__ldg(w + k)); });
    Pack<T, V> pk;
    for (int l = 0; l < V; ++l) pk.v[l] = from_float<T>(acc[l]);
    *reinterpret_cast<Pack<T, V>*>(dx + i * V) = pk;
  }
}

// One block of the weight-gradient plan: each thread sums its positions' products for every tap (and g)
// in registers, then the block adds them over its streams in shared memory ([stream][channel][tap], a
// tree over the streams) and writes partial[split][c][tap]. Up to 7 x 7 + 1 sums per thread: the
// minimum of one block per SM lets ptxas keep them in registers (without it, it spills some).
template <typename T, int K>
__global__ void __launch_bounds__(kWgradThreads, 1)
    depthwise_wgrad_kernel(DepthwiseParams p, WgradPlan plan, const T* g, const T* x, float* partial) {
  constexpr int kTaps = K * K + 1;
  __shared__ float sums[kWgradThreads * kTaps];
  const WgradBlock b = depthwise_wgrad_block(plan, blockIdx.x);
  const int cl = threadIdx.x % plan.cpb, s = threadIdx.x / plan.cpb;
  float acc[kTaps];
  FASTPIPE_UNROLL
  for (int t = 0; t < kTaps; ++t) acc[t] = 0.f;
  if (b.c0 + cl < p.c) {
    for (int64_t pos = b.begin + s; pos < b.end; pos += plan.streams) {
      depthwise_wgrad_add<K, K>(
          p, b.c0 + cl, pos, acc, [&](int64_t k) { return to_float(__ldg(g + k)); },
          [&](int64_t k) { return to_float(__ldg(x + k)); });
    }
  }
  FASTPIPE_UNROLL
  for (int t = 0; t < kTaps; ++t) sums[threadIdx.x * kTaps + t] = acc[t];
  __syncthreads();
  const int row = plan.cpb * kTaps;  // one stream's sums
  for (int half = plan.streams / 2; half > 0; half /= 2) {
    for (int e = threadIdx.x; e < half * row; e += kWgradThreads) sums[e] += sums[e + half * row];
    __syncthreads();
  }
  for (int e = threadIdx.x; e < row; e += kWgradThreads) {
    const int64_t c = b.c0 + e / kTaps;
    if (c < p.c) partial[(b.split * p.c + c) * kTaps + e % kTaps] = sums[e];
  }
}
}  // namespace

cudaError_t launch_depthwise(const DepthwiseParams& p, int num_sms, cudaStream_t stream) {
  const int64_t total = p.n * p.c * p.oh * p.ow;
  if (total <= 0 || p.kh < 1 || p.kw < 1 || p.sh < 1 || p.sw < 1 || p.dh < 1 || p.dw < 1 || p.ph < 0 || p.pw < 0)
    return total == 0 ? cudaSuccess : cudaErrorInvalidValue;
  dtype_switch(static_cast<DType>(p.dtype), [&](auto t) {
    using T = decltype(t);
    const bool vector = depthwise_lanes(p, sizeof(T)) > 1 && aligned16(p.input) && aligned16(p.out) &&
                        (!p.residual || aligned16(p.residual));
    act_switch(p.act.act, [&](auto a) {
      auto launch = [&](auto kernel, int lanes) {
        const int64_t groups = total / lanes;
        const int64_t blocks = std::min<int64_t>((groups + kThreads - 1) / kThreads, int64_t(num_sms) * 32);
        kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(p, groups);
      };
      constexpr int kLanes = 16 / sizeof(T);
      if (vector) {
        launch(depthwise_kernel<T, decltype(a)::value, kLanes>, kLanes);
      } else {
        launch(depthwise_kernel<T, decltype(a)::value, 1>, 1);
      }
    });
  });
  return cudaGetLastError();
}

cudaError_t launch_depthwise_tiled(const DepthwiseParams& p, cudaStream_t stream) {
  const int64_t total = p.n * p.c * p.oh * p.ow;
  if (total == 0) return cudaSuccess;
  if (total < 0 || depthwise_tiled_why_not(p)) return cudaErrorInvalidValue;
  const int64_t blocks = p.n * p.c * depthwise_tiles_per_plane(p);
  const size_t smem = static_cast<size_t>(depthwise_patch_elements(p)) * sizeof(float);
  dtype_switch(static_cast<DType>(p.dtype), [&](auto t) {
    using T = decltype(t);
    act_switch(p.act.act, [&](auto a) {
      depthwise_tiled_kernel<T, decltype(a)::value>
          <<<static_cast<unsigned>(blocks), kTileH * kTileW, smem, stream>>>(p);
    });
  });
  return cudaGetLastError();
}


cudaError_t launch_depthwise_input_grad(const DepthwiseParams& p, const void* grad, const void* weight,
                                        void* grad_input, int num_sms, cudaStream_t stream) {
  const int64_t total = p.n * p.c * p.h * p.w;
  if (total == 0) return cudaSuccess;
  if (total < 0 || num_sms <= 0 || depthwise_backward_why_not(p)) return cudaErrorInvalidValue;
  dtype_switch(static_cast<DType>(p.dtype), [&](auto t) {
    using T = decltype(t);
    const T *g = static_cast<const T*>(grad), *w = static_cast<const T*>(weight);
    T* dx = static_cast<T*>(grad_input);
    auto launch = [&](auto kernel, int lanes) {
      const int64_t groups = total / lanes;
      const int64_t blocks = std::min<int64_t>((groups + kThreads - 1) / kThreads, int64_t(num_sms) * 32);
      kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(p, g, w, dx, groups);
    };
    constexpr int kLanes = 16 / sizeof(T);
    if (depthwise_lanes(p, sizeof(T)) > 1 && aligned16(grad) && aligned16(grad_input)) {
      launch(depthwise_input_grad_kernel<T, kLanes>, kLanes);
    } else {
      launch(depthwise_input_grad_kernel<T, 1>, 1);
    }
  });
  return cudaGetLastError();
}

cudaError_t launch_depthwise_wgrad(const DepthwiseParams& p, const WgradPlan& plan, const void* grad,
                                   const void* input, float* partial, cudaStream_t stream) {
  const int64_t blocks = plan.channel_blocks * plan.splits;
  if (blocks == 0) return cudaSuccess;
  if (blocks < 0 || blocks > INT32_MAX || plan.cpb * plan.streams != kWgradThreads) return cudaErrorInvalidValue;
  bool built = false;
  dtype_switch(static_cast<DType>(p.dtype), [&](auto t) {
    using T = decltype(t);
    built = depthwise_wgrad_size_switch(p.kh, p.kw, [&](auto size) {
      depthwise_wgrad_kernel<T, decltype(size)::value><<<static_cast<unsigned>(blocks), kWgradThreads, 0, stream>>>(
          p, plan, static_cast<const T*>(grad), static_cast<const T*>(input), partial);
    });
  });
  return built ? cudaGetLastError() : cudaErrorInvalidValue;
}

}  // namespace fastpipe::cuda
