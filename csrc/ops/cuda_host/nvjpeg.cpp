#include "ops/cuda_host/nvjpeg.h"

#include <dlfcn.h>

#include <atomic>
#include <mutex>
#include <vector>

#include "core/error.h"

#if __has_include(<nvjpeg.h>)
#include <nvjpeg.h>
#define FASTPIPE_HAVE_NVJPEG 1
#endif

namespace fastpipe::cuda {

#ifdef FASTPIPE_HAVE_NVJPEG

namespace {

const char* status_name(nvjpegStatus_t s) {
  switch (s) {
    case NVJPEG_STATUS_SUCCESS: return "success";
    case NVJPEG_STATUS_NOT_INITIALIZED: return "not initialized";
    case NVJPEG_STATUS_INVALID_PARAMETER: return "invalid parameter";
    case NVJPEG_STATUS_BAD_JPEG: return "bad JPEG";
    case NVJPEG_STATUS_JPEG_NOT_SUPPORTED: return "JPEG not supported";
    case NVJPEG_STATUS_ALLOCATOR_FAILURE: return "allocator failure";
    case NVJPEG_STATUS_EXECUTION_FAILED: return "execution failed";
    case NVJPEG_STATUS_ARCH_MISMATCH: return "architecture mismatch";
    case NVJPEG_STATUS_INTERNAL_ERROR: return "internal error";
    case NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED: return "implementation not supported";
    case NVJPEG_STATUS_INCOMPLETE_BITSTREAM: return "incomplete bitstream";
  }
  return "unknown status";
}

std::string failed(const char* call, nvjpegStatus_t s) {
  return std::string(call) + " failed: " + status_name(s) + " (status " + std::to_string(static_cast<int>(s)) + ")";
}

// The entry points used, resolved from the library loaded at run time.
struct Api {
  decltype(&nvjpegCreateEx) create_ex = nullptr;
  decltype(&nvjpegDestroy) destroy = nullptr;
  decltype(&nvjpegGetHardwareDecoderInfo) hardware_info = nullptr;
  decltype(&nvjpegJpegStateCreate) state_create = nullptr;
  decltype(&nvjpegJpegStateDestroy) state_destroy = nullptr;
  decltype(&nvjpegDecodeBatchedInitialize) batched_initialize = nullptr;
  decltype(&nvjpegDecodeBatched) batched = nullptr;
};

template <typename F>
bool resolve(void* lib, const char* name, F* fn, std::string* why_not) {
  *fn = reinterpret_cast<F>(dlsym(lib, name));
  if (!*fn) *why_not = std::string("the loaded nvJPEG has no ") + name;
  return *fn != nullptr;
}

// The library stays loaded for the process: decoders may be destroyed at interpreter exit, after which
// unloading it under live CUDA state is not worth the risk.
void* load_library(const std::string& path, std::string* why_not) {
  const std::vector<std::string> names = path.empty() ? std::vector<std::string>{"libnvjpeg.so.13", "libnvjpeg.so"}
                                                      : std::vector<std::string>{path};
  std::string errors;
  for (const std::string& n : names) {
    if (void* lib = dlopen(n.c_str(), RTLD_NOW | RTLD_LOCAL)) return lib;
    const char* e = dlerror();
    errors += (errors.empty() ? "" : "; ") + std::string(e ? e : n);
  }
  *why_not = "nvJPEG could not be loaded (" + errors + "); `pip install nvidia-nvjpeg` provides it";
  return nullptr;
}

// Planar YCbCr (NVJPEG_OUTPUT_YUV, each component at its own resolution) is asked for first, so that the
// resample kernel upsamples and converts the colour as libjpeg does (kernels/jpeg_color.h); where nvJPEG
// refuses it, interleaved RGB (its own upsampling) from then on, the refusal kept in backend().
class NvjpegDecoder final : public JpegBatchDecoder {
 public:
  NvjpegDecoder(const Api& api, nvjpegHandle_t handle, nvjpegJpegState_t state, std::string backend)
      : api_(api), handle_(handle), state_(state), backend_(std::move(backend)), described_(backend_ + " (planar YCbCr)") {}
  ~NvjpegDecoder() override {
    // Destructors never throw: a failure here leaks the handle, which the process end reclaims.
    api_.state_destroy(state_);
    api_.destroy(handle_);
  }

  images::DecodedLayout decode(const JpegDecodeJob& job, cudaStream_t stream) override {
    const int n = static_cast<int>(job.data.size());
    if (n == 0) return images::DecodedLayout::kYccPlanar;
    std::lock_guard<std::mutex> lk(mu_);  // one decode state: batches decode one at a time
    if (planar_) {
      const nvjpegStatus_t s = run(job, NVJPEG_OUTPUT_YUV, stream);
      if (s == NVJPEG_STATUS_SUCCESS) return images::DecodedLayout::kYccPlanar;
      // An image it does not take in planes (this batch goes as RGB, planes stay for the next), planes
      // refused altogether (RGB from now on), or else the data or the device.
      if (refuses_format(s)) {
        refuse_planar_locked(message_);
      } else if (s != NVJPEG_STATUS_JPEG_NOT_SUPPORTED) {
        throw Error(rejects_data(s) ? ErrorKind::kValue : ErrorKind::kState,
                    message_ + " for a batch of " + std::to_string(n) + " images on the " + backend_ + " backend");
      }
    }
    if (const nvjpegStatus_t s = run(job, NVJPEG_OUTPUT_RGBI, stream); s != NVJPEG_STATUS_SUCCESS)
      throw Error(rejects_data(s) ? ErrorKind::kValue : ErrorKind::kState,
                  message_ + " for a batch of " + std::to_string(n) + " images on the " + backend_ + " backend");
    return images::DecodedLayout::kRgbInterleaved;
  }

  // Asks nvJPEG whether it decodes batches into planes (at creation: nvjpeg_status reports the answer).
  void probe_planar() {
    const nvjpegStatus_t s = api_.batched_initialize(handle_, state_, 1, 1, NVJPEG_OUTPUT_YUV);
    if (s != NVJPEG_STATUS_SUCCESS) {
      refuse_planar_locked(failed("nvjpegDecodeBatchedInitialize(NVJPEG_OUTPUT_YUV)", s));
    } else {
      initialized_n_ = 1;
    }
  }

  std::string backend() const override {
    std::lock_guard<std::mutex> lk(mu_);
    return described_;
  }
  bool planar() const override { return planar_.load(); }
  void refuse_planar(const std::string& why) override {
    std::lock_guard<std::mutex> lk(mu_);
    refuse_planar_locked(why);
  }

 private:
  // A status that says the output format, not the data or the device, is the problem.
  static bool refuses_format(nvjpegStatus_t s) {
    return s == NVJPEG_STATUS_INVALID_PARAMETER || s == NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED;
  }
  // A status that says an image's data is the problem: the pipeline decodes the batch on the host.
  static bool rejects_data(nvjpegStatus_t s) {
    return s == NVJPEG_STATUS_BAD_JPEG || s == NVJPEG_STATUS_JPEG_NOT_SUPPORTED ||
           s == NVJPEG_STATUS_INCOMPLETE_BITSTREAM;
  }

  void refuse_planar_locked(const std::string& why) {
    planar_ = false;
    described_ = backend_ + " (interleaved RGB, nvJPEG's own chroma upsampling: " + why + ")";
  }

  // One batched decode in `format`; on failure message_ names the call and its status.
  nvjpegStatus_t run(const JpegDecodeJob& job, nvjpegOutputFormat_t format, cudaStream_t stream) {
    const size_t n = job.data.size();
    std::vector<nvjpegImage_t> out(n);
    for (size_t k = 0; k < n; ++k) {
      const images::YccPlanes& p = job.planes[k];
      out[k] = nvjpegImage_t{};
      out[k].channel[0] = job.out[k];
      if (format == NVJPEG_OUTPUT_YUV) {
        out[k].pitch[0] = static_cast<size_t>(p.width);
        out[k].channel[1] = job.out[k] + p.cb_offset;
        out[k].channel[2] = job.out[k] + p.cr_offset;
        out[k].pitch[1] = out[k].pitch[2] = static_cast<size_t>(p.c_width);
      } else {
        out[k].pitch[0] = static_cast<size_t>(p.width) * 3;
      }
    }
    // nvjpeg.h: initialised once per batch size and format, and again to reset a failed batch.
    nvjpegStatus_t s = NVJPEG_STATUS_SUCCESS;
    if (static_cast<int>(n) != initialized_n_ || format != initialized_format_) {
      initialized_n_ = 0;
      s = api_.batched_initialize(handle_, state_, static_cast<int>(n), 1, format);
      if (s != NVJPEG_STATUS_SUCCESS) {
        message_ = failed("nvjpegDecodeBatchedInitialize", s);
        return s;
      }
      initialized_n_ = static_cast<int>(n);
      initialized_format_ = format;
    }
    s = api_.batched(handle_, state_, job.data.data(), job.sizes.data(), out.data(), stream);
    if (s != NVJPEG_STATUS_SUCCESS) {
      message_ = failed("nvjpegDecodeBatched", s);
      initialized_n_ = 0;
    }
    return s;
  }

  Api api_;
  nvjpegHandle_t handle_;
  nvjpegJpegState_t state_;
  std::string backend_;
  std::string described_;  // backend_ and the layout
  mutable std::mutex mu_;
  std::atomic<bool> planar_{true};
  std::string message_;
  int initialized_n_ = 0;  // the batch size and format the state was initialised for (0: none)
  nvjpegOutputFormat_t initialized_format_ = NVJPEG_OUTPUT_YUV;
};

}  // namespace

std::unique_ptr<JpegBatchDecoder> make_jpeg_decoder(const std::string& path, std::string* why_not) {
  void* lib = load_library(path, why_not);
  if (!lib) return nullptr;
  Api api;
  if (!resolve(lib, "nvjpegCreateEx", &api.create_ex, why_not) || !resolve(lib, "nvjpegDestroy", &api.destroy, why_not) ||
      !resolve(lib, "nvjpegGetHardwareDecoderInfo", &api.hardware_info, why_not) ||
      !resolve(lib, "nvjpegJpegStateCreate", &api.state_create, why_not) ||
      !resolve(lib, "nvjpegJpegStateDestroy", &api.state_destroy, why_not) ||
      !resolve(lib, "nvjpegDecodeBatchedInitialize", &api.batched_initialize, why_not) ||
      !resolve(lib, "nvjpegDecodeBatched", &api.batched, why_not))
    return nullptr;
  nvjpegHandle_t handle = nullptr;
  nvjpegStatus_t s = api.create_ex(NVJPEG_BACKEND_DEFAULT, nullptr, nullptr, NVJPEG_FLAGS_DEFAULT, &handle);
  if (s != NVJPEG_STATUS_SUCCESS) {
    *why_not = failed("nvjpegCreateEx", s);
    return nullptr;
  }
  unsigned engines = 0, cores = 0;
  std::string backend = "default";
  if (api.hardware_info(handle, &engines, &cores) == NVJPEG_STATUS_SUCCESS && engines > 0) {
    nvjpegHandle_t hw = nullptr;
    if (api.create_ex(NVJPEG_BACKEND_HARDWARE, nullptr, nullptr, NVJPEG_FLAGS_DEFAULT, &hw) == NVJPEG_STATUS_SUCCESS) {
      api.destroy(handle);
      handle = hw;
      backend = "hardware";
    }
  }
  nvjpegJpegState_t state = nullptr;
  s = api.state_create(handle, &state);
  if (s != NVJPEG_STATUS_SUCCESS) {
    api.destroy(handle);
    *why_not = failed("nvjpegJpegStateCreate", s);
    return nullptr;
  }
  auto decoder = std::make_unique<NvjpegDecoder>(api, handle, state, backend);
  decoder->probe_planar();
  return decoder;
}

#else  // built without nvjpeg.h

std::unique_ptr<JpegBatchDecoder> make_jpeg_decoder(const std::string&, std::string* why_not) {
  *why_not = "fastpipe was built without nvjpeg.h (the nvidia-nvjpeg wheel, in requirements/cuda.txt, provides it)";
  return nullptr;
}

#endif

}  // namespace fastpipe::cuda
