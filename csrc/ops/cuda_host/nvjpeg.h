// nvJPEG, loaded at run time (dlopen of libnvjpeg.so.13: the nvidia-nvjpeg wheel's, or the system's) so
// that the extension imports without it: batched decode of whole images into planar YCbCr (else
// interleaved RGB) on a stream, on the GPU's hardware JPEG engines where nvjpegGetHardwareDecoderInfo reports some (A100,
// H100, H200), else nvJPEG's default (hybrid) backend, whose Huffman stage runs in the calling thread.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <string>

#include "core/device.h"

namespace fastpipe::cuda {

class JpegBatchDecoder {
 public:
  virtual ~JpegBatchDecoder() = default;
  // Throws Error(kState) naming the nvJPEG call and its status; returns the layout written.
  virtual images::DecodedLayout decode(const JpegDecodeJob& job, cudaStream_t stream) = 0;
  // "hardware" or "default", then the layout: "(planar YCbCr)", or "(interleaved RGB, ...: why)".
  virtual std::string backend() const = 0;
  // Whether it still decodes into planes; refuse_planar turns them off (another decoder of the same
  // loader was refused them: every lane writes the same layout).
  virtual bool planar() const = 0;
  virtual void refuse_planar(const std::string& why) = 0;
};

// A decoder for the current CUDA device, from the library at `path` ("" : the usual names); null with
// *why_not set when nvJPEG cannot be loaded or initialised, or this build has no nvjpeg.h.
std::unique_ptr<JpegBatchDecoder> make_jpeg_decoder(const std::string& path, std::string* why_not);

}  // namespace fastpipe::cuda
