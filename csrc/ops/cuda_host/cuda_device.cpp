#include "ops/cuda_host/cuda_device.h"

#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <mutex>
#include <string>
#include <unordered_map>

#include "core/error.h"
#include "cuda/loader_kernels.h"
#include "ops/cuda_host/nvjpeg.h"

namespace fastpipe {
void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear it: the error is reported here, not by the next unrelated call
    throw Error(ErrorKind::kState, std::string("CUDA ") + what + " failed: " + cudaGetErrorString(err));
  }
}

namespace {

static_assert(int{cudaStreamCaptureModeGlobal} == kCaptureGlobal &&
                  int{cudaStreamCaptureModeThreadLocal} == kCaptureThreadLocal &&
                  int{cudaStreamCaptureModeRelaxed} == kCaptureRelaxed,
              "CaptureMode (core/device.h) passes cudaStreamCaptureMode's values through");

cudaStream_t raw(Stream* s) { return reinterpret_cast<cudaStream_t>(s); }
cudaEvent_t raw(Event* e) { return reinterpret_cast<cudaEvent_t>(e); }

class CudaDevice : public Device {
 public:
  CudaDevice(int index, std::string nvjpeg_path) : index_(index), nvjpeg_path_(std::move(nvjpeg_path)) {}

  int make_current() override {
    int previous = -1;
    check_cuda(cudaGetDevice(&previous), "cudaGetDevice");
    if (previous != index_) check_cuda(cudaSetDevice(index_), "cudaSetDevice");
    return previous;
  }
  void restore_current(int previous) noexcept override {
    if (previous >= 0 && previous != index_ && cudaSetDevice(previous) != cudaSuccess) cudaGetLastError();
  }

  void* alloc(size_t bytes) override {
    void* p = nullptr;
    check_cuda(cudaMalloc(&p, bytes), "cudaMalloc (the loader's device arena)");
    return p;
  }
  void free(void* p) override { check_cuda(cudaFree(p), "cudaFree"); }
  void pin(void* host, size_t bytes) override {
    check_cuda(cudaHostRegister(host, bytes, cudaHostRegisterDefault), "cudaHostRegister");
  }
  void unpin(void* host) override { check_cuda(cudaHostUnregister(host), "cudaHostUnregister"); }

  Stream* new_stream() override {
    cudaStream_t s;
    check_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
    return reinterpret_cast<Stream*>(s);
  }
  Stream* consumer_stream() override {
    return reinterpret_cast<Stream*>(c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(index_)).stream());
  }

  Event* new_event() override {
    cudaEvent_t e;
    // Blocking sync: a host thread waiting on it sleeps instead of spinning a core.
    check_cuda(cudaEventCreateWithFlags(&e, cudaEventBlockingSync | cudaEventDisableTiming), "cudaEventCreate");
    return reinterpret_cast<Event*>(e);
  }
  void delete_event(Event* e) override { check_cuda(cudaEventDestroy(raw(e)), "cudaEventDestroy"); }

  void copy_to_device(void* dst, const void* src, size_t bytes, Stream* s) override {
    check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, raw(s)), "cudaMemcpyAsync");
  }
  void launch(const DeviceKernel& k, Stream* s) override {
    switch (k.kind) {
      case DeviceKernel::Kind::kWidenTokens:
        check_cuda(cuda::launch_widen_tokens(k.widen, raw(s)), "token widening kernel");
        return;
      case DeviceKernel::Kind::kCropMirrorNormalize:
        check_cuda(cuda::launch_crop_mirror_normalize(k.cmn, raw(s)), "CropMirrorNormalize kernel");
        return;
      case DeviceKernel::Kind::kResampleImages:
        check_cuda(cuda::launch_resample_images(k.resample, raw(s)), "JPEG resample kernel");
        return;
      case DeviceKernel::Kind::kAugmentImages:
        check_cuda(cuda::launch_augment_images(k.augment, raw(s)), "image augmentation kernel");
        return;
    }
  }
  // A decoder per stream: nvJPEG's state holds a batch's buffers until its stream has decoded it, so the
  // pipeline's lanes each need their own.
  images::DecodedLayout decode_jpegs(const JpegDecodeJob& job, Stream* s) override {
    cuda::JpegBatchDecoder* decoder = nullptr;
    {
      std::lock_guard<std::mutex> lk(decoder_mu_);
      std::unique_ptr<cuda::JpegBatchDecoder>& d = decoders_[s];
      if (!d) d = spare_decoder_ ? std::move(spare_decoder_) : open_locked();
      decoder = d.get();
    }
    const images::DecodedLayout layout = decoder->decode(job, raw(s));
    if (!decoder->planar()) {  // refused planes: every lane's decoder goes interleaved, decided once
      std::lock_guard<std::mutex> lk(decoder_mu_);
      if (planar_refused_.empty()) {
        planar_refused_ = decoder->backend();
        for (auto& [stream, d] : decoders_)
          if (d->planar()) d->refuse_planar("another lane's decoder was refused them: " + planar_refused_);
      }
    }
    return layout;
  }
  std::string jpeg_decoder() const override {
    std::lock_guard<std::mutex> lk(decoder_mu_);
    if (!planar_refused_.empty()) return planar_refused_;
    for (const auto& [stream, d] : decoders_) return d->backend();
    return spare_decoder_ ? spare_decoder_->backend() : "";
  }
  void open_jpeg_decoder() override {
    std::lock_guard<std::mutex> lk(decoder_mu_);
    if (decoders_.empty() && !spare_decoder_) spare_decoder_ = open_locked();
  }
  void delete_stream(Stream* s) override {
    {
      std::lock_guard<std::mutex> lk(decoder_mu_);
      decoders_.erase(s);
    }
    check_cuda(cudaStreamDestroy(raw(s)), "cudaStreamDestroy");
  }
  void record(Event* e, Stream* s) override { check_cuda(cudaEventRecord(raw(e), raw(s)), "cudaEventRecord"); }
  void wait(Stream* s, Event* e) override { check_cuda(cudaStreamWaitEvent(raw(s), raw(e), 0), "cudaStreamWaitEvent"); }
  void synchronize(Event* e) override { check_cuda(cudaEventSynchronize(raw(e)), "cudaEventSynchronize"); }
  bool query(Event* e) override {
    const cudaError_t err = cudaEventQuery(raw(e));
    if (err == cudaErrorNotReady) {
      cudaGetLastError();  // not an error: do not leave it pending
      return false;
    }
    check_cuda(err, "cudaEventQuery");
    return true;
  }
  bool capturing(Stream* s) override {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    check_cuda(cudaStreamIsCapturing(raw(s), &status), "cudaStreamIsCapturing");
    return status != cudaStreamCaptureStatusNone;  // an invalidated capture has not ended either
  }
  int exchange_capture_mode(int mode) noexcept override {
    auto m = static_cast<cudaStreamCaptureMode>(mode);
    if (cudaThreadExchangeStreamCaptureMode(&m) != cudaSuccess) {
      cudaGetLastError();
      return mode;  // unchanged: restoring it later is a no-op
    }
    return static_cast<int>(m);
  }

 private:
  int index_;
  std::string nvjpeg_path_;
  // A new nvJPEG decoder (with decoder_mu_ held), or Error(kState) saying why there can be none.
  std::unique_ptr<cuda::JpegBatchDecoder> open_locked() {
    std::string why;
    if (why_no_decoder_.empty()) {
      if (auto d = cuda::make_jpeg_decoder(nvjpeg_path_, &why)) {
        if (!planar_refused_.empty() && d->planar())
          d->refuse_planar("another lane's decoder was refused them: " + planar_refused_);
        return d;
      }
    }
    if (why_no_decoder_.empty()) why_no_decoder_ = why;
    throw Error(ErrorKind::kState, "image_decode='device': GPU JPEG decoding is unavailable here: " + why_no_decoder_ +
                                       "; image_decode='host' decodes on the CPU");
  }

  mutable std::mutex decoder_mu_;
  std::unordered_map<Stream*, std::unique_ptr<cuda::JpegBatchDecoder>> decoders_;
  std::unique_ptr<cuda::JpegBatchDecoder> spare_decoder_;  // opened by open_jpeg_decoder, the first stream's
  std::string why_no_decoder_;  // the first failure to open one: later ones are not tried
  std::string planar_refused_;  // the first decoder's backend() once it was refused planes: all follow
};

}  // namespace

std::shared_ptr<Device> make_cuda_device(int index, const std::string& nvjpeg_path) {
  int count = 0;
  check_cuda(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  if (index < 0 || index >= count)
    throw Error(ErrorKind::kValue, "device cuda:" + std::to_string(index) + " does not exist (this machine has " +
                                       std::to_string(count) + " CUDA device(s))");
  return std::make_shared<CudaDevice>(index, nvjpeg_path);
}

}  // namespace fastpipe
