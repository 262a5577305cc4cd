// Forward epilogue and backward prologue of the fused convolution (see epilogue.h). Memory-bound
// passes: 16-byte loads and stores, math in float, one rounding to the storage type at the end.
#include "cuda/epilogue.h"

#include <algorithm>
#include <cstdint>

#include "cuda/device_math.cuh"

namespace fastpipe::cuda {
namespace {

constexpr int kThreads = 256;

// ---- forward epilogue -------------------------------------------------------------------------
template <typename T, Act A, bool kBias, bool kResidual>
__global__ void __launch_bounds__(kThreads) epilogue_kernel(EpilogueParams p) {
  constexpr int V = 16 / sizeof(T);
  using Vec = Pack<T, V>;
  T* out = static_cast<T*>(p.out);  // not __restrict__: out may be y (in place)
  const T* y = static_cast<const T*>(p.y);
  const T* __restrict__ bias = static_cast<const T*>(p.bias);
  const T* __restrict__ residual = static_cast<const T*>(p.residual);
  const uint32_t C = static_cast<uint32_t>(p.channels);
  const uint32_t inner = p.channels_last ? 1u : static_cast<uint32_t>(p.spatial);
  const uint32_t numel = static_cast<uint32_t>(p.batch * p.channels * p.spatial);
  const uint32_t nvec = numel / V;
  const float alpha = static_cast<float>(p.act.alpha), beta = static_cast<float>(p.act.beta);

  // One element at flat index i whose channel is c.
  auto compute = [&](float x, float r, uint32_t c) {
    if constexpr (kBias) x += to_float(bias[c]);
    if constexpr (kResidual) x += r;
    return from_float<T>(act_forward<A>(x, alpha, beta));
  };

  const uint32_t stride = gridDim.x * blockDim.x;
  const uint32_t tid = blockIdx.x * blockDim.x + threadIdx.x;
  for (uint32_t v = tid; v < nvec; v += stride) {
    const uint32_t i = v * V;
    const Vec yv = reinterpret_cast<const Vec*>(y)[v];
    Vec rv;
    if constexpr (kResidual) rv = reinterpret_cast<const Vec*>(residual)[v];
    // Walk the channel along the vector instead of dividing per element.
    const uint32_t q = i / inner;
    uint32_t within = i - q * inner;
    uint32_t c = q % C;
    Vec ov;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      ov.v[k] = compute(to_float(yv.v[k]), kResidual ? to_float(rv.v[k]) : 0.f, c);
      if (++within == inner) {
        within = 0;
        if (++c == C) c = 0;
      }
    }
    reinterpret_cast<Vec*>(out)[v] = ov;
  }
  // The last numel % V elements.
  const uint32_t i = nvec * V + tid;
  if (i < numel) {
    out[i] = compute(to_float(y[i]), kResidual ? to_float(residual[i]) : 0.f, (i / inner) % C);
  }
}

// ---- backward: activation gradient + bias-gradient partial sums --------------------------------
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// Sum over a 1-D block of kThreads; the result is valid in thread 0.
__device__ __forceinline__ float block_sum(float x) {
  __shared__ float warp_sums[kThreads / 32];
  x = warp_sum(x);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = x;
  __syncthreads();
  x = threadIdx.x < kThreads / 32 ? warp_sums[threadIdx.x] : 0.f;
  return threadIdx.x < 32 ? warp_sum(x) : 0.f;
}

// The activation gradient of vector v: stores it to grad_in and hands each lane's value back in d
// (for the bias-gradient sums).
template <typename T, Act A, int V>
__device__ __forceinline__ void act_backward_vec(const Pack<T, V>* g, const Pack<T, V>* saved, Pack<T, V>* gi,
                                                 uint32_t v, float alpha, float beta, float (&d)[V]) {
  const Pack<T, V> gv = g[v], sv = saved[v];
  Pack<T, V> ov;
#pragma unroll
  for (int k = 0; k < V; ++k) {
    d[k] = act_backward<A>(to_float(gv.v[k]), to_float(sv.v[k]), alpha, beta);
    ov.v[k] = from_float<T>(d[k]);
  }
  gi[v] = ov;
}

// NCHW: block (c, s) handles split s of the N*H*W elements of channel c. Returns this thread's sum.
template <typename T, Act A, int V>
__device__ __forceinline__ float nchw_pass(const ActBackwardParams& p, uint32_t c, uint32_t s) {
  using Vec = Pack<T, V>;
  const uint32_t C = static_cast<uint32_t>(p.channels);
  const uint32_t per_plane = static_cast<uint32_t>(p.spatial) / V;   // vectors per (n, c) plane
  const uint64_t total = static_cast<uint64_t>(p.batch) * per_plane;
  const uint32_t j0 = static_cast<uint32_t>(total * s / p.splits);
  const uint32_t j1 = static_cast<uint32_t>(total * (s + 1) / p.splits);
  const Vec* g = static_cast<const Vec*>(p.grad_out);
  const Vec* saved = static_cast<const Vec*>(p.saved);
  Vec* gi = static_cast<Vec*>(p.grad_in);
  const float alpha = static_cast<float>(p.act.alpha), beta = static_cast<float>(p.act.beta);
  float sum = 0.f;
  for (uint32_t j = j0 + threadIdx.x; j < j1; j += blockDim.x) {
    const uint32_t n = j / per_plane;
    const uint32_t v = (n * C + c) * per_plane + (j - n * per_plane);
    float d[V];
    act_backward_vec<T, A, V>(g, saved, gi, v, alpha, beta, d);
#pragma unroll
    for (int k = 0; k < V; ++k) sum += d[k];
  }
  return sum;
}

template <typename T, Act A>
__global__ void __launch_bounds__(kThreads) act_backward_nchw_kernel(ActBackwardParams p) {
  constexpr int V = 16 / sizeof(T);
  const uint32_t c = blockIdx.x, s = blockIdx.y;
  const float sum = p.spatial % V == 0 ? nchw_pass<T, A, V>(p, c, s) : nchw_pass<T, A, 1>(p, c, s);
  if (p.bias_partial != nullptr) {
    const float total = block_sum(sum);
    if (threadIdx.x == 0) p.bias_partial[static_cast<size_t>(s) * p.channels + c] = total;
  }
}

// NHWC: a (kCols x kRows) block covers kCols column groups of V channels; grid.y splits the rows.
constexpr int kCols = 32, kRows = 8;

template <typename T, Act A, int V>
__device__ __forceinline__ void nhwc_pass(const ActBackwardParams& p, float* shared) {
  using Vec = Pack<T, V>;
  const uint32_t groups = static_cast<uint32_t>(p.channels) / V;
  const uint32_t rows = static_cast<uint32_t>(p.batch * p.spatial);
  const uint32_t col = blockIdx.x * kCols + threadIdx.x;
  const Vec* g = static_cast<const Vec*>(p.grad_out);
  const Vec* saved = static_cast<const Vec*>(p.saved);
  Vec* gi = static_cast<Vec*>(p.grad_in);
  const float alpha = static_cast<float>(p.act.alpha), beta = static_cast<float>(p.act.beta);
  float acc[V] = {};
  if (col < groups) {
    for (uint32_t r = blockIdx.y * kRows + threadIdx.y; r < rows; r += gridDim.y * kRows) {
      const uint32_t v = r * groups + col;
      float d[V];
      act_backward_vec<T, A, V>(g, saved, gi, v, alpha, beta, d);
#pragma unroll
      for (int k = 0; k < V; ++k) acc[k] += d[k];
    }
  }
  if (p.bias_partial == nullptr) return;
#pragma unroll
  for (int k = 0; k < V; ++k) shared[(threadIdx.y * kCols + threadIdx.x) * V + k] = acc[k];
  __syncthreads();
  if (threadIdx.y == 0 && col < groups) {
#pragma unroll
    for (int k = 0; k < V; ++k) {
      float total = 0.f;
      for (int y = 0; y < kRows; ++y) total += shared[(y * kCols + threadIdx.x) * V + k];
      p.bias_partial[static_cast<size_t>(blockIdx.y) * p.channels + col * V + k] = total;
    }
  }
}

template <typename T, Act A>
__global__ void __launch_bounds__(kCols* kRows) act_backward_nhwc_kernel(ActBackwardParams p) {
  constexpr int V = 16 / sizeof(T);
  __shared__ float shared[kRows * kCols * V];
  if (p.channels % V == 0) {
    nhwc_pass<T, A, V>(p, shared);
  } else {
    nhwc_pass<T, A, 1>(p, shared);
  }
}

template <typename T>
__global__ void bias_grad_finalize_kernel(T* grad_bias, const float* partial, int splits, uint32_t channels) {
  const uint32_t c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= channels) return;
  float total = 0.f;
  for (int s = 0; s < splits; ++s) total += partial[static_cast<size_t>(s) * channels + c];
  grad_bias[c] = from_float<T>(total);
}

int nhwc_column_blocks(int64_t channels, DType dtype) {
  const int v = dtype == DType::Float ? 4 : 8;
  const int64_t groups = channels % v == 0 ? channels / v : channels;
  return static_cast<int>((groups + kCols - 1) / kCols);
}

}  // namespace

cudaError_t launch_epilogue(const EpilogueParams& p, int num_sms, cudaStream_t stream) {
  const int64_t numel = p.batch * p.channels * p.spatial;
  if (numel > kMaxElements || p.channels <= 0 || p.out == nullptr || p.y == nullptr || !aligned16(p.out) ||
      !aligned16(p.y) || (p.residual != nullptr && !aligned16(p.residual)) || num_sms <= 0) {
    return cudaErrorInvalidValue;
  }
  if (numel == 0) return cudaSuccess;
  const int64_t work = std::max<int64_t>(numel / (p.dtype == DType::Float ? 4 : 8), 1);
  const int blocks = static_cast<int>(std::min<int64_t>((work + kThreads - 1) / kThreads, int64_t(num_sms) * 8));
  dtype_switch(p.dtype, [&](auto t) {
    using T = decltype(t);
    act_switch(p.act.act, [&](auto a) {
      bool_switch(p.bias != nullptr, [&](auto has_bias) {
        bool_switch(p.residual != nullptr, [&](auto has_residual) {
          epilogue_kernel<T, decltype(a)::value, decltype(has_bias)::value, decltype(has_residual)::value>
              <<<blocks, kThreads, 0, stream>>>(p);
        });
      });
    });
  });
  return cudaGetLastError();
}

int act_backward_splits(int64_t batch, int64_t channels, int64_t spatial, bool channels_last, int num_sms) {
  // Aim for about four blocks per SM while giving each block at least a few thousand elements.
  const int64_t target_blocks = int64_t(std::max(num_sms, 1)) * 4;
  const int64_t per_channel = batch * spatial;
  int64_t column_blocks = channels;  // NCHW: one block column per channel
  int64_t max_splits = std::max<int64_t>(per_channel / 2048, 1);
  if (channels_last) {
    column_blocks = (channels + kCols * 8 - 1) / (kCols * 8);  // a lower bound; rows per split >= kRows
    max_splits = std::max<int64_t>(per_channel / (kRows * 16), 1);
  }
  const int64_t splits = (target_blocks + column_blocks - 1) / std::max<int64_t>(column_blocks, 1);
  return static_cast<int>(std::clamp<int64_t>(splits, 1, std::min<int64_t>(max_splits, 65535)));
}

cudaError_t launch_act_backward(const ActBackwardParams& p, cudaStream_t stream) {
  const int64_t numel = p.batch * p.channels * p.spatial;
  if (numel > kMaxElements || p.channels <= 0 || p.splits < 1 || p.splits > 65535 || !aligned16(p.grad_in) ||
      !aligned16(p.grad_out) || !aligned16(p.saved)) {
    return cudaErrorInvalidValue;
  }
  if (numel == 0) return cudaSuccess;
  dtype_switch(p.dtype, [&](auto t) {
    using T = decltype(t);
    act_switch(p.act.act, [&](auto a) {
      constexpr Act A = decltype(a)::value;
      if (p.channels_last) {
        const dim3 grid(nhwc_column_blocks(p.channels, p.dtype), p.splits);
        act_backward_nhwc_kernel<T, A><<<grid, dim3(kCols, kRows), 0, stream>>>(p);
      } else {
        const dim3 grid(static_cast<unsigned>(p.channels), p.splits);
        act_backward_nchw_kernel<T, A><<<grid, kThreads, 0, stream>>>(p);
      }
    });
  });
  return cudaGetLastError();
}

cudaError_t launch_bias_grad_finalize(void* grad_bias, const float* partial, int splits, int64_t channels,
                                      DType dtype, cudaStream_t stream) {
  if (grad_bias == nullptr || partial == nullptr || splits < 1 || channels <= 0 || channels > kMaxElements) {
    return cudaErrorInvalidValue;
  }
  const int blocks = static_cast<int>((channels + kThreads - 1) / kThreads);
  dtype_switch(dtype, [&](auto t) {
    using T = decltype(t);
    bias_grad_finalize_kernel<T><<<blocks, kThreads, 0, stream>>>(static_cast<T*>(grad_bias), partial, splits,
                                                                  static_cast<uint32_t>(channels));
  });
  return cudaGetLastError();
}

}  // namespace fastpipe::cuda
