#include "cuda/loader_kernels.h"

#include <cstdint>

#include "cuda/image_transform.h"
#include "cuda/transforms.h"

namespace fastpipe::cuda {
namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void widen_tokens_kernel(WidenTokensKernel k) {
  const int64_t total = k.records * k.block;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / k.block, t = i % k.block;
    const T* src = reinterpret_cast<const T*>(static_cast<const char*>(k.src) + r * k.src_stride);
    k.x[i] = static_cast<int64_t>(src[t]);
    k.y[i] = static_cast<int64_t>(src[t + 1]);
  }
}

// One thread per output element; the sample's window is recomputed per element (a few integer
// multiplies), which keeps the kernel a pure function of the element index.
__global__ void crop_mirror_normalize_kernel(CropMirrorNormalizeKernel k) {
  const transforms::CropMirrorNormalizeParams& p = k.params;
  const int64_t per_image = transforms::out_image_elements(p);
  const int64_t total = k.count * per_image;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t n = i / per_image, e = i % per_image;
    int c, y, x;
    if (p.out_nhwc) {
      c = static_cast<int>(e % p.channels);
      x = static_cast<int>(e / p.channels % p.out_width);
      y = static_cast<int>(e / p.channels / p.out_width);
    } else {
      x = static_cast<int>(e % p.out_width);
      y = static_cast<int>(e / p.out_width % p.out_height);
      c = static_cast<int>(e / p.out_width / p.out_height);
    }
    const transforms::SampleWindow w = transforms::sample_window(p, k.epoch, static_cast<uint64_t>(k.index[n]));
    const uint8_t* image = k.images + n * transforms::in_image_bytes(p);
    transforms::store(p, k.out, i, transforms::cmn_value(p, w, image, c, y, x));
  }
}

// One thread per output element; each computes its taps (at most images::kDeviceTaps per axis: the
// host sends larger shrinks to its own decoder).
__global__ void resample_images_kernel(ResampleImagesKernel k) {
  const int64_t total = k.count * images::out_image_elements(k.params);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    images::resample_element(k.params, k.layout, k.descs, k.staging, k.image_stride, k.out, i);
}

int blocks_for(int64_t total) {
  const int64_t b = (total + kThreads - 1) / kThreads;
  return static_cast<int>(b < 65535 ? (b > 0 ? b : 1) : 65535);
}

}  // namespace

cudaError_t launch_widen_tokens(const WidenTokensKernel& k, cudaStream_t stream) {
  if (k.records <= 0 || k.block <= 0) return cudaSuccess;
  if (!k.src || !k.x || !k.y) return cudaErrorInvalidValue;
  const int blocks = blocks_for(k.records * k.block);
  switch (k.token_bytes) {
    case 1:
      if (k.is_signed) widen_tokens_kernel<int8_t><<<blocks, kThreads, 0, stream>>>(k);
      else widen_tokens_kernel<uint8_t><<<blocks, kThreads, 0, stream>>>(k);
      break;
    case 2:
      if (k.is_signed) widen_tokens_kernel<int16_t><<<blocks, kThreads, 0, stream>>>(k);
      else widen_tokens_kernel<uint16_t><<<blocks, kThreads, 0, stream>>>(k);
      break;
    case 4:
      if (k.is_signed) widen_tokens_kernel<int32_t><<<blocks, kThreads, 0, stream>>>(k);
      else widen_tokens_kernel<uint32_t><<<blocks, kThreads, 0, stream>>>(k);
      break;
    case 8: widen_tokens_kernel<int64_t><<<blocks, kThreads, 0, stream>>>(k); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t launch_crop_mirror_normalize(const CropMirrorNormalizeKernel& k, cudaStream_t stream) {
  if (k.count <= 0) return cudaSuccess;
  if (!k.images || !k.out || !k.index) return cudaErrorInvalidValue;
  crop_mirror_normalize_kernel<<<blocks_for(k.count * transforms::out_image_elements(k.params)), kThreads, 0,
                                 stream>>>(k);
  return cudaGetLastError();
}

cudaError_t launch_resample_images(const ResampleImagesKernel& k, cudaStream_t stream) {
  if (k.count <= 0) return cudaSuccess;
  if (!k.descs || !k.staging || !k.out) return cudaErrorInvalidValue;
  resample_images_kernel<<<blocks_for(k.count * images::out_image_elements(k.params)), kThreads, 0, stream>>>(k);
  return cudaGetLastError();
}

}  // namespace fastpipe::cuda
