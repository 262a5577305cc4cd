// The direct depthwise kernel (see depthwise.h): one thread per output element, or per V channels of a
// pixel on the vectorised NHWC path (16-byte loads of input and residual, one 16-byte store); taps read
// straight from the input (neighbouring threads read neighbouring pixels or channels, which the caches
// share), the bias, residual and activation applied before the one write.
#include "cuda/depthwise_launch.h"

#include <algorithm>

#include "cuda/device_math.cuh"

namespace fastpipe::cuda {
namespace {

constexpr int kThreads = 256;

// V consecutive elements from `p` as float: one 16-byte load when V > 1 (p is then 16-byte aligned).
template <typename T, int V>
__device__ __forceinline__ void load_lanes(const T* p, float (&v)[V]) {
  if constexpr (V == 1) {
    v[0] = to_float(__ldg(p));
  } else {
    static_assert(sizeof(T) * V == 16, "the vectorised path moves 16 bytes");
    const uint4 raw = __ldg(reinterpret_cast<const uint4*>(p));
    Pack<T, V> pk;
    memcpy(&pk, &raw, 16);
    for (int l = 0; l < V; ++l) v[l] = to_float(pk.v[l]);
  }
}

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

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
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

}  // namespace fastpipe::cuda
