// Per batch, on the submitter thread: the copies out of the host slot, the conversions and the image
// decodes queued on the copy stream and a decode lane, and what a failure leaves behind.
#include "core/error.h"
#include "core/pipeline_state.h"

namespace fastpipe {

using pipeline::Conversion;
using pipeline::Plan;

// Queues batch `lease`'s copies and conversions into `base`, then `ready`: on the copy stream, and a
// batch with images to decode also on a lane (its decode and resample; `ready` there, after the copies).
// An overflow batch's lane work is followed by the copy stream, whose order its memory's free follows.
void PipelineState::enqueue(const Lease& lease, char* base, Event* ready, bool overflow) {
  const int64_t n = lease.records();
  DecodeLanes::Lane* lane = nullptr;
  for (const Plan& p : plans)
    if (p.kind == Conversion::kDecodeImages && !lane) lane = &lanes->next();
  std::vector<images::DecodedLayout> layouts(plans.size(), images::DecodedLayout::kYccPlanar);  // per plan
  for (const Plan& p : plans) {
    const char* src = lease.data(p.host_output);
    const size_t bytes = static_cast<size_t>(n * p.host_record_bytes);
    if (p.kind == Conversion::kCopy) {
      if (bytes) device->copy_to_device(base + outputs[p.first_output].offset, src, bytes, copy);
      continue;
    }
    device->copy_to_device(base + p.staging, src, bytes, copy);
    if (p.kind == Conversion::kDecodeImages) layouts[&p - plans.data()] = enqueue_decode(p, lease, base, *lane);
  }
  if (index_offset >= 0)
    device->copy_to_device(base + index_offset, lease.indices(), static_cast<size_t>(n * 8), copy);
  // The copy stream's kernels, then the lane's (after everything on the copy stream).
  for (const bool on_lane : {false, true}) {
    if (on_lane && !lane) break;
    if (on_lane) {
      device->record(lane->copied, copy);
      device->wait(lane->stream, lane->copied);
    }
    for (const Plan& p : plans)
      if ((p.kind == Conversion::kDecodeImages) == on_lane) launch_kernel(p, lease, base, layouts, lane);
  }
  if (!lane) {
    device->record(ready, copy);
    fences->record(lease.slot(), copy);  // the host slot may be refilled once the copy out of it is done
    return;
  }
  // The lane has waited for the copies: its stream's position covers the whole batch (and the decode's
  // reads of the host slot).
  device->record(ready, lane->stream);
  fences->record(lease.slot(), lane->stream);
  if (overflow) lanes->follow(*lane, copy);
}

// Plan p's kernel for batch `lease` in `base`, if it has one: on the copy stream, the resample on `lane`.
void PipelineState::launch_kernel(const Plan& p, const Lease& lease, char* base, const std::vector<images::DecodedLayout>& layouts, DecodeLanes::Lane* lane) {
  const int64_t n = lease.records();
  DeviceKernel k{};
  Stream* on = copy;
  if (p.kind == Conversion::kWidenTokens) {
    k.kind = DeviceKernel::Kind::kWidenTokens;
    k.widen = WidenTokensKernel{base + p.staging, p.host_record_bytes, p.token_bytes, p.token_signed, n,
                                outputs[p.first_output].record_bytes / 8,
                                reinterpret_cast<int64_t*>(base + outputs[p.first_output].offset),
                                reinterpret_cast<int64_t*>(base + outputs[p.first_output + 1].offset)};
  } else if (p.kind == Conversion::kCropMirrorNormalize) {
    k.kind = DeviceKernel::Kind::kCropMirrorNormalize;
    k.cmn = CropMirrorNormalizeKernel{*p.cmn, reinterpret_cast<const uint8_t*>(base + p.staging),
                                      base + outputs[p.first_output].offset, n,
                                      reinterpret_cast<const int64_t*>(base + index_offset), lease.epoch()};
  } else if (p.kind == Conversion::kDecodeImages) {
    lanes->resample(p.image->transform, layouts[&p - plans.data()],
                    reinterpret_cast<const images::ImageDesc*>(base + p.staging), base + outputs[p.first_output].offset,
                    n, *lane);
    return;
  } else {
    return;
  }
  device->launch(k, on);
}

// A batch's images: those the reader left to the device decoded on `lane`, the others' outputs copied.
images::DecodedLayout PipelineState::enqueue_decode(const Plan& p, const Lease& lease, char* base, DecodeLanes::Lane& lane) {
  const int64_t out_bytes = outputs[p.first_output].record_bytes;
  return lanes->decode_batch(reinterpret_cast<const images::ImageDesc*>(lease.data(p.host_output)),
                             reinterpret_cast<const uint8_t*>(lease.data(p.host_output + 1)),
                             p.image->encoded_budget, lease.data(p.host_output + 2),
                             base + outputs[p.first_output].offset, out_bytes, lease.indices(), lease.records(),
                             copy, lane);
}

// A job's work on the copy stream and its lane (the submitter thread). A failure fences the host slot
// after whatever was queued from it (as issue() does for work it queues itself), frees the device
// slot, and is raised at the batch's turn.
void PipelineState::run(const pipeline::Job& job) {
  try {
    DeviceGuard guard(*device);
    try {
      enqueue(*job.lease, job.base, job.ready, job.slot < 0);
    } catch (const Error&) {
      try {
        if (lanes) lanes->follow_all(copy);
        fences->record(job.lease->slot(), copy);
      } catch (const Error&) {
      }
      throw;
    }
  } catch (...) {
    if (job.slot >= 0) {
      std::lock_guard<std::mutex> lk(mu);
      slots[job.slot].state = DeviceSlot::State::kFree;
    }
    throw;
  }
}

}  // namespace fastpipe
