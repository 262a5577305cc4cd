#include "core/decode_lanes.h"

#include <stdexcept>
#include <string>

#include "core/error.h"
#include "kernels/augment_images.h"

namespace fastpipe {

DecodeLanes::DecodeLanes(Device& device, int lanes, int64_t stride, int64_t batch_size, int64_t work_stride)
    : device_(device), lanes_(static_cast<size_t>(lanes)), stride_(stride), batch_size_(batch_size),
      work_stride_(work_stride) {
  try {
    for (Lane& l : lanes_) {
      l.decoded = static_cast<uint8_t*>(device_.alloc(static_cast<size_t>(stride_ * batch_size_)));
      if (work_stride_ > 0)
        l.work = static_cast<uint8_t*>(device_.alloc(static_cast<size_t>(work_stride_ * batch_size_)));
      l.copied = device_.new_event();
      l.done = device_.new_event();
      l.stream = device_.new_stream();
    }
  } catch (...) {  // what the lanes before the failure got is freed: no destructor runs for a throwing constructor
    try {
      teardown();
    } catch (const std::exception& e) {
      report_teardown_failure("freeing the decode lanes after a failed allocation", e.what());
    }
    throw;
  }
}

void DecodeLanes::teardown() {
  if (refused_copied_) {
    device_.synchronize(refused_copied_);
    device_.delete_event(refused_copied_);
    device_.unpin(refused_planes_->data());
  }
  for (Lane& l : lanes_) {
    if (l.done && l.stream) {
      device_.record(l.done, l.stream);
      device_.synchronize(l.done);
    }
    if (l.done) device_.delete_event(l.done);
    if (l.copied) device_.delete_event(l.copied);
    if (l.decoded) device_.free(l.decoded);
    if (l.work) device_.free(l.work);
    if (l.stream) device_.delete_stream(l.stream);
  }
  lanes_.clear();
}

images::DecodedLayout DecodeLanes::decode_batch(const images::ImageDesc* descs, const uint8_t* encoded,
                                                int64_t encoded_budget, const char* host_out, char* out,
                                                int64_t out_bytes, const int64_t* samples, int64_t records,
                                                Stream* copy, Lane& lane) {
  JpegDecodeJob job;
  std::vector<int64_t> job_samples;
  for (int64_t k = 0; k < records; ++k) {
    const images::ImageDesc& d = descs[k];
    if (d.on == static_cast<int32_t>(images::DecodeOn::kDevice)) {
      job_samples.push_back(samples[k]);
      job.data.push_back(encoded + k * encoded_budget);
      job.sizes.push_back(static_cast<size_t>(d.encoded_bytes));
      job.out.push_back(lane.decoded + k * stride_);
      job.planes.push_back(d.planes);
    } else {
      device_.copy_to_device(out + k * out_bytes, host_out + k * out_bytes, static_cast<size_t>(out_bytes), copy);
    }
  }
  const images::DecodedLayout layout = decode(job, job_samples, lane);
  on_device_ += static_cast<int64_t>(job.data.size());
  on_host_ += records - static_cast<int64_t>(job.data.size());
  return layout;
}

void DecodeLanes::resample(const images::ImageTransformParams& transform, images::DecodedLayout layout,
                           const images::ImageDesc* descs, void* out, int64_t n, Lane& lane) {
  const bool augmented = images::augments(transform);
  DeviceKernel k{};
  k.kind = DeviceKernel::Kind::kResampleImages;
  k.resample = ResampleImagesKernel{transform, layout, descs, lane.decoded, stride_, out, n,
                                    augmented ? lane.work : nullptr, work_stride_};
  device_.launch(k, lane.stream);
  if (!augmented) return;
  k.kind = DeviceKernel::Kind::kAugmentImages;
  k.augment = AugmentImagesKernel{transform, descs, lane.work, work_stride_, out, n};
  device_.launch(k, lane.stream);
}

void DecodeLanes::follow(Lane& lane, Stream* copy) {
  device_.record(lane.done, lane.stream);
  device_.wait(copy, lane.done);
}

void DecodeLanes::follow_all(Stream* copy) {
  for (Lane& l : lanes_) follow(l, copy);
}

images::DecodedLayout DecodeLanes::decode(const JpegDecodeJob& job, const std::vector<int64_t>& samples, Lane& lane) {
  images::DecodedLayout layout = images::DecodedLayout::kYccPlanar;
  if (job.data.empty()) return layout;
  try {
    layout = device_.decode_jpegs(job, lane.stream);
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::kValue) throw;
    decode_refused(job, samples, e.what(), lane.stream);
    return layout;  // libjpeg's planes: counted in after_refusal, not as the device's planar decodes
  }
  if (layout == images::DecodedLayout::kYccPlanar) planar_ += static_cast<int64_t>(job.data.size());
  return layout;
}

void DecodeLanes::decode_refused(const JpegDecodeJob& job, const std::vector<int64_t>& samples, const char* why,
                                 Stream* on) {
  if (!refused_planes_) {
    refused_planes_ = std::make_unique<AlignedBuffer>(static_cast<size_t>(stride_ * batch_size_));
    device_.pin(refused_planes_->data(), refused_planes_->size());
    refused_copied_ = device_.new_event();
    refused_decoder_ = std::make_unique<JpegDecoder>();
  } else {
    device_.synchronize(refused_copied_);  // the last refusal's copies out of the planes are done
  }
  // Every image is decoded before any copy is queued: an image libjpeg refuses then leaves no copy in
  // flight out of the planes that refused_copied_ would not cover (the next refusal and teardown wait on it).
  auto planes = [&](size_t k) {
    return reinterpret_cast<uint8_t*>(refused_planes_->data()) + static_cast<int64_t>(k) * stride_;
  };
  for (size_t k = 0; k < job.data.size(); ++k) {
    try {
      refused_decoder_->decode_planes(job.data[k], job.sizes[k], job.planes[k], planes(k));
    } catch (const std::runtime_error& e) {
      throw Error(ErrorKind::kValue, "sample " + std::to_string(samples[k]) + " cannot be decoded: the device's "
                                     "decoder refused its batch (" + why + ") and libjpeg says: " + e.what());
    }
  }
  for (size_t k = 0; k < job.data.size(); ++k)
    device_.copy_to_device(job.out[k], planes(k), static_cast<size_t>(images::ycc_planes_bytes(job.planes[k])), on);
  device_.record(refused_copied_, on);
  after_refusal_ += static_cast<int64_t>(job.data.size());
}

}  // namespace fastpipe
