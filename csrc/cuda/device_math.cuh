// Device-side math the CUDA kernels share (epilogue.cu, depthwise.cu): storage type <-> float, the
// activations' forward and backward formulas, and the compile-time switches that instantiate a kernel
// per dtype, activation and flag. nvcc only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "kernels/activation.h"
#include "cuda/epilogue.h"

namespace fastpipe::cuda {

// ---- storage type <-> float -------------------------------------------------------------------
__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

// The vectorised paths move 16 bytes at a time: their pointers must be 16-byte aligned.
inline bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

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

// ---- activation math --------------------------------------------------------------------------
constexpr float kSqrtHalf = 0.70710678118654752f;     // 1/sqrt(2)
constexpr float kInvSqrt2Pi = 0.39894228040143268f;   // 1/sqrt(2*pi)
constexpr float kGeluBeta = 0.79788456080286536f;     // sqrt(2/pi)
constexpr float kGeluKappa = 0.044715f;

// tanh from expf: the build uses --use_fast_math, under which tanhf may become a 2^-11-accurate
// hardware approximation, too coarse for float32 outputs. Small |x| uses the series to avoid the
// cancellation in 1 - 2/(1+e^2x).
__device__ __forceinline__ float tanh_f(float x) {
  const float ax = fabsf(x);
  if (ax < 0.0625f) {
    const float x2 = x * x;
    return x * (1.f + x2 * (-1.f / 3.f + x2 * (2.f / 15.f)));
  }
  const float t = 1.f - 2.f / (1.f + expf(2.f * ax));
  return copysignf(t, x);
}

__device__ __forceinline__ float sigmoid_f(float x) { return 1.f / (1.f + expf(-x)); }

// Comparisons are written so that NaN propagates like in torch's kernels.
template <Act A>
__device__ __forceinline__ float act_forward(float x, float alpha, float beta) {
  if constexpr (A == Act::Identity) {
    return x;
  } else if constexpr (A == Act::Relu) {
    return x < 0.f ? 0.f : x;
  } else if constexpr (A == Act::Hardtanh) {
    return x < alpha ? alpha : (x > beta ? beta : x);
  } else if constexpr (A == Act::LeakyRelu) {
    return x > 0.f ? x : x * alpha;
  } else if constexpr (A == Act::Silu) {
    return x * sigmoid_f(x);
  } else if constexpr (A == Act::Gelu) {
    return 0.5f * x * (1.f + erff(x * kSqrtHalf));
  } else if constexpr (A == Act::GeluTanh) {
    return 0.5f * x * (1.f + tanh_f(kGeluBeta * (x + kGeluKappa * x * x * x)));
  } else if constexpr (A == Act::Sigmoid) {
    return sigmoid_f(x);
  } else if constexpr (A == Act::Tanh) {
    return tanh_f(x);
  } else {
    static_assert(A == Act::Hardswish, "unhandled activation");
    return x * fminf(fmaxf(x + 3.f, 0.f), 6.f) * (1.f / 6.f);
  }
}

// d act / d z times g, from `s` = the saved output or pre-activation (see activation.h).
// Same formulas as torch's backward kernels.
template <Act A>
__device__ __forceinline__ float act_backward(float g, float s, float alpha, float beta) {
  if constexpr (A == Act::Identity) {
    return g;
  } else if constexpr (A == Act::Relu) {
    return s > 0.f ? g : 0.f;
  } else if constexpr (A == Act::Hardtanh) {
    return (s > alpha && s < beta) ? g : 0.f;
  } else if constexpr (A == Act::LeakyRelu) {
    return s > 0.f ? g : g * alpha;
  } else if constexpr (A == Act::Silu) {
    const float sig = sigmoid_f(s);
    return g * sig * (1.f + s * (1.f - sig));
  } else if constexpr (A == Act::Gelu) {
    const float cdf = 0.5f * (1.f + erff(s * kSqrtHalf));
    const float pdf = expf(-0.5f * s * s) * kInvSqrt2Pi;
    return g * (cdf + s * pdf);
  } else if constexpr (A == Act::GeluTanh) {
    const float s2 = s * s;
    const float t = tanh_f(kGeluBeta * (s + kGeluKappa * s2 * s));
    const float right_derivative = 0.5f * s * (1.f - t * t) * kGeluBeta * (1.f + 3.f * kGeluKappa * s2);
    return g * (0.5f * (1.f + t) + right_derivative);
  } else if constexpr (A == Act::Sigmoid) {
    return g * s * (1.f - s);
  } else if constexpr (A == Act::Tanh) {
    return g * (1.f - s * s);
  } else {
    static_assert(A == Act::Hardswish, "unhandled activation");
    // torch's CUDA kernel takes the flat sides at exactly -3 and 3 (its CPU kernel the slope): in half
    // precision many inputs are exactly +-3, and the H200 run saw gradients off by g/2 there.
    return s <= -3.f ? 0.f : (s < 3.f ? g * (s / 3.f + 0.5f) : g);
  }
}

// ---- compile-time switches --------------------------------------------------------------------
template <typename F>
void dtype_switch(DType d, F&& f) {
  switch (d) {
    case DType::Float: f(float{}); break;
    case DType::Half: f(__half{}); break;
    case DType::BFloat16: f(__nv_bfloat16{}); break;
  }
}

template <Act A>
using ActTag = std::integral_constant<Act, A>;

template <typename F>
void act_switch(Act a, F&& f) {
  switch (a) {
    case Act::Identity: f(ActTag<Act::Identity>{}); break;
    case Act::Relu: f(ActTag<Act::Relu>{}); break;
    case Act::Hardtanh: f(ActTag<Act::Hardtanh>{}); break;
    case Act::LeakyRelu: f(ActTag<Act::LeakyRelu>{}); break;
    case Act::Silu: f(ActTag<Act::Silu>{}); break;
    case Act::Gelu: f(ActTag<Act::Gelu>{}); break;
    case Act::GeluTanh: f(ActTag<Act::GeluTanh>{}); break;
    case Act::Sigmoid: f(ActTag<Act::Sigmoid>{}); break;
    case Act::Tanh: f(ActTag<Act::Tanh>{}); break;
    case Act::Hardswish: f(ActTag<Act::Hardswish>{}); break;
  }
}

template <typename F>
void bool_switch(bool b, F&& f) {
  if (b) {
    f(std::true_type{});
  } else {
    f(std::false_type{});
  }
}

}  // namespace fastpipe::cuda
