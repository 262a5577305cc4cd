// The loader's device kernels: token windows widened to int64, CropMirrorNormalize, and the JPEG
// transforms' resample and augmentations of images decoded on the device, one launch each per batch, on
// the pipeline's copy stream or a decode lane. Parameter structs in core/device.h; the per-element code is transforms.h's and
// image_transform.h's, which the CPU path and the simulation also run.
#pragma once

#include <cuda_runtime_api.h>

#include "core/device.h"

namespace fastpipe::cuda {

// Each returns cudaErrorInvalidValue for bad arguments, else the launch's cudaGetLastError().
cudaError_t launch_widen_tokens(const WidenTokensKernel& k, cudaStream_t stream);
cudaError_t launch_crop_mirror_normalize(const CropMirrorNormalizeKernel& k, cudaStream_t stream);
cudaError_t launch_resample_images(const ResampleImagesKernel& k, cudaStream_t stream);
cudaError_t launch_augment_images(const AugmentImagesKernel& k, cudaStream_t stream);

}  // namespace fastpipe::cuda
