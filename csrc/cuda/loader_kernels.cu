#include "cuda/loader_kernels.h"

#include <cstdint>

#include "kernels/augment_images.h"
#include "kernels/image_transform.h"
#include "kernels/transforms.h"

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
    const float v = p.pad > 0 ? transforms::cmn_value<true>(p, w, image, c, y, x)
                              : transforms::cmn_value<false>(p, w, image, c, y, x);
    transforms::store(p, k.out, i, v);
  }
}

// One thread per output element; each computes its taps (at most images::kDeviceTaps per axis: the
// host sends larger shrinks to its own decoder).
__global__ void resample_images_kernel(ResampleImagesKernel k) {
  const int64_t total = k.count * images::out_image_elements(k.params);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    images::resample_element(k.params, k.layout, k.descs, k.staging, k.image_stride, k.out, i, k.work,
                             k.work_stride);
}

// One block per image (augment_images.h): per op, the statistics its tables need gathered in shared
// memory (integers: the same as the serial sums), the tables made by one thread per channel, then a pass
// over the pixels between the two halves of the image's work area; then the outputs.
__global__ void augment_images_kernel(AugmentImagesKernel k) {
  const int64_t n = blockIdx.x;
  const images::ImageDesc& d = k.descs[n];
  if (d.on != static_cast<int32_t>(images::DecodeOn::kDevice)) return;
  const images::ImageTransformParams& p = k.params;
  const int h = p.out_height, w = p.out_width;
  const int64_t plane = static_cast<int64_t>(h) * w;
  uint8_t* img = k.work + n * k.work_stride;
  uint8_t* other = img + images::kChannels * plane;
  __shared__ images::ImageStats stats;
  __shared__ uint8_t tables[3 * 256];
  const images::SampleOps& ops = d.geometry.ops;
  for (int j = 0; j < ops.count; ++j) {
    const images::PlannedOp op = ops.op[j];
    if (op.kind == static_cast<int32_t>(images::OpKind::kCopy)) continue;
    if (op.kind == static_cast<int32_t>(images::OpKind::kMix)) {
      uint8_t* work = k.work + n * k.work_stride;
      float* mix = reinterpret_cast<float*>(work + images::mix_offset(plane));
      for (int64_t at = threadIdx.x; at < plane; at += blockDim.x)
        images::mix_pixel(op, img, work + 2 * images::kChannels * plane, mix, plane, at);
      __syncthreads();
      continue;
    }
    if (op.kind == static_cast<int32_t>(images::OpKind::kBlur)) {  // two 1-D passes, a channel at a time
      float* columns = reinterpret_cast<float*>(k.work + n * k.work_stride + images::blur_offset(p, plane));
      for (int c = 0; c < images::kChannels; ++c) {
        for (int64_t at = threadIdx.x; at < plane; at += blockDim.x)
          columns[at] = images::blur_column(op, ops.blur + images::kMaxBlurTaps, img + c * plane, h, w,
                                            static_cast<int>(at / w), static_cast<int>(at % w));
        __syncthreads();
        for (int64_t at = threadIdx.x; at < plane; at += blockDim.x)
          other[c * plane + at] = images::blur_row(op, ops.blur, columns, w, static_cast<int>(at / w), static_cast<int>(at % w));
        __syncthreads();
      }
      uint8_t* t = img;
      img = other;
      other = t;
      continue;
    }
    if (op.kind == static_cast<int32_t>(images::OpKind::kTable)) {
      for (int i = threadIdx.x; i < 3 * 256; i += blockDim.x) stats.hist[i / 256][i % 256] = 0;
      if (threadIdx.x == 0) stats.grey_sum = 0;
      __syncthreads();
      const bool hist = images::needs_histograms(op), grey = images::needs_grey_sum(op);
      unsigned long long sum = 0;
      for (int64_t at = threadIdx.x; at < plane; at += blockDim.x) {
        if (hist)
          for (int c = 0; c < 3; ++c) atomicAdd(&stats.hist[c][img[c * plane + at]], 1u);
        if (grey)
          sum += static_cast<unsigned long long>(images::floored_grey(img[at], img[plane + at], img[2 * plane + at]));
      }
      if (grey) atomicAdd(reinterpret_cast<unsigned long long*>(&stats.grey_sum), sum);
      __syncthreads();
      if (threadIdx.x < 3) images::op_table(op, stats, plane, threadIdx.x, tables + 256 * threadIdx.x);
      __syncthreads();
    }
    for (int64_t at = threadIdx.x; at < plane; at += blockDim.x)
      images::op_pixel(op, tables, p.augment.fill, img, h, w, static_cast<int>(at / w), static_cast<int>(at % w), other,
                       ops.blur);
    __syncthreads();
    uint8_t* t = img;
    img = other;
    other = t;
  }
  for (int64_t at = threadIdx.x; at < plane; at += blockDim.x)
    images::store_augmented_pixel(p, d.geometry.erase, img, k.out, n, at);
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

cudaError_t launch_augment_images(const AugmentImagesKernel& k, cudaStream_t stream) {
  if (k.count <= 0) return cudaSuccess;
  if (!k.descs || !k.work || !k.out || k.count > 2147483647) return cudaErrorInvalidValue;
  augment_images_kernel<<<static_cast<unsigned>(k.count), kThreads, 0, stream>>>(k);
  return cudaGetLastError();
}

}  // namespace fastpipe::cuda
