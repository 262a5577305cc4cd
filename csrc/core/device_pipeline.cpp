#include "core/device_pipeline.h"

#include <unistd.h>

#include <algorithm>
#include <exception>
#include <mutex>

#include "core/error.h"
#include "core/pinned_arena.h"
#include "core/pipeline_state.h"
#include "core/process.h"

namespace fastpipe {
namespace {

constexpr int64_t kDeviceAlign = 256;
// Batches issued to the device ahead of the one handed out: the copy of the next one overlaps the
// consumer's work on this one.
constexpr size_t kIssueAhead = 2;
// Batches whose images decode at once: a lane each (a stream, a decoder state, a buffer of decoded
// images), so that the JPEG engines decode one batch while the SMs resample the other.
constexpr int kDecodeLanes = 2;

}  // namespace

using pipeline::Conversion;
using pipeline::Issued;
using pipeline::Job;
using pipeline::Plan;

DeviceBatch::DeviceBatch(std::shared_ptr<PipelineState> state, int slot, char* base, int64_t records,
                         Stream* consumer, std::shared_ptr<void> overflow)
    : state_(std::move(state)), slot_(slot), base_(base), records_(records), streams_{consumer},
      overflow_(std::move(overflow)) {}

DeviceBatch::~DeviceBatch() {
  PipelineState& st = *state_;
  if (current_pid() != st.owner_pid) return;  // a forked child never reuses the parent's slots
  if (slot_ < 0) return;                 // overflow: its allocator frees it, stream-ordered
  try {
    DeviceGuard guard(*st.device);
    std::lock_guard<std::mutex> lk(st.mu);
    st.release_slot(st.slots[slot_], streams_);
    --st.leased;
  } catch (const std::exception& e) {
    // The release cannot be fenced: the slot stays taken (never reused) rather than raced.
    report_teardown_failure("releasing a device batch", e.what());
  }
}

char* DeviceBatch::data(int output) const { return base_ + state_->outputs[output].offset; }

void DeviceBatch::used_on(Stream* s) {
  if (std::find(streams_.begin(), streams_.end(), s) == streams_.end()) streams_.push_back(s);
}

DevicePipeline::DevicePipeline(std::shared_ptr<Device> device, std::vector<ColumnSpec> columns,
                               ReaderOptions options, OverflowFn overflow)
    : device_(std::move(device)), state_(std::make_shared<PipelineState>()) {
  options.check();  // batch_size sizes the device slots before the BatchReader would check it
  PipelineState& st = *state_;
  st.device = device_;
  st.owner_pid = current_pid();
  st.overflow = std::move(overflow);
  st.batch_size = options.batch_size;
  DeviceGuard guard(*device_);
  st.fences = std::make_shared<HostFences>(device_);

  // One plan per column, from its spec: token windows widened, images transformed or decoded, the rest
  // copied (images the reader decodes arrive as their outputs).
  std::vector<Plan> plans(columns.size());
  bool needs_index = false;
  int host_output = 0;
  int64_t pixel_budget = 0, augment_work = 0;
  for (size_t k = 0; k < columns.size(); ++k) {
    Plan& p = plans[k];
    p.host_output = host_output;
    p.token_bytes = columns[k].token_bytes;
    p.token_signed = columns[k].token_signed;
    p.cmn = columns[k].cmn;
    p.kind = p.cmn ? Conversion::kCropMirrorNormalize : p.token_bytes ? Conversion::kWidenTokens : Conversion::kCopy;
    if (columns[k].image && columns[k].image->device_decode) {
      p.kind = Conversion::kDecodeImages;
      p.image = columns[k].image;
      pixel_budget = std::max(pixel_budget, p.image->pixel_budget);
      if (images::augments(p.image->transform))
        augment_work = std::max(augment_work, images::augment_work_bytes(p.image->transform));
    }
    host_output += p.kind == Conversion::kDecodeImages ? kDeviceDecodeOutputs : 1;
    needs_index |= p.kind == Conversion::kCropMirrorNormalize;
  }

  // Only the reader threads substitute a bad image (they read and decode the substitute); an image the
  // device's decoder and then libjpeg refuse is found on the submitter thread, with no reader to ask.
  if (pixel_budget > 0 && options.on_error == OnError::kReplace)
    throw Error(ErrorKind::kValue,
                "on_error='replace' is not available with image_decode='device': only the reader threads "
                "substitute a bad image, and an image the device's decoder refuses is found after they have "
                "passed it; use image_decode='host' (the reader threads decode and replace), or on_error='raise'");
  if (pixel_budget > 0) device_->open_jpeg_decoder();
  auto fences = st.fences;
  options.raw_outputs = true;
  options.index_output = needs_index || pixel_budget > 0;  // a refused batch names its samples
  pin_reader_arena(options, device_, [fences] { fences->wait_all(); }, "unpinning the loader's host arena");
  options.before_slot_fill = [fences](int slot) { fences->wait(slot); };
  reader_ = std::make_unique<BatchReader>(std::move(columns), std::move(options));

  // The device slot: per column its outputs (and the raw records it converts), then the sample indices.
  const std::vector<OutputLayout>& host = reader_->outputs();
  int64_t offset = 0;
  for (Plan& p : plans) {
    p.host_record_bytes = host[p.host_output].record_bytes;
    p.first_output = static_cast<int>(st.outputs.size());
    auto add_output = [&](int64_t record_bytes) {
      st.outputs.push_back({offset, record_bytes});
      offset = place_output(offset, record_bytes, st.batch_size, kDeviceAlign);
    };
    switch (p.kind) {
      case Conversion::kCopy: add_output(p.host_record_bytes); break;
      case Conversion::kWidenTokens: {
        const int64_t block = p.host_record_bytes / p.token_bytes - 1;
        add_output(block * 8);
        add_output(block * 8);
        break;
      }
      case Conversion::kCropMirrorNormalize:
        add_output(transforms::out_image_elements(*p.cmn) * transforms::out_dtype_bytes(p.cmn->out_dtype));
        break;
      case Conversion::kDecodeImages:
        add_output(host[p.host_output + 2].record_bytes);  // the output image, as the host makes it
        break;
    }
    if (p.kind != Conversion::kCopy) {
      p.staging = offset;
      offset = place_output(offset, p.host_record_bytes, st.batch_size, kDeviceAlign);
    }
  }
  if (needs_index) {
    st.index_offset = offset;
    offset = place_output(offset, 8, st.batch_size, kDeviceAlign);
  }
  st.plans = std::move(plans);
  st.slot_bytes = std::max<int64_t>(offset, kDeviceAlign);
  const int num_slots = reader_->stats().num_slots;  // a device slot per host slot
  st.arena = static_cast<char*>(device_->alloc(static_cast<size_t>(st.slot_bytes * num_slots)));
  if (pixel_budget > 0) {
    st.lanes = std::make_unique<DecodeLanes>(*device_, kDecodeLanes, place_output(0, pixel_budget, 3, kDeviceAlign),
                                             st.batch_size, place_output(0, augment_work, 1, kDeviceAlign));
  }
  st.slots.resize(static_cast<size_t>(num_slots));
  for (DeviceSlot& s : st.slots) s.ready = device_->new_event();
  st.overflow_ready = device_->new_event();
  st.overflow_alloc = device_->new_event();
  st.copy = device_->new_stream();
  // Pipelines that decode images queue each batch's device work in a thread of their own: nvJPEG parses
  // every bitstream on the host inside its call, which next() on the training thread would otherwise pay.
  if (pixel_budget > 0) submitter_ = std::make_unique<SerialWorker>();
}

DevicePipeline::~DevicePipeline() { close(SerialWorker::kTeardownSeconds, nullptr); }

void DevicePipeline::wait_for_submitter(const std::function<void()>& wait) {
  try {
    wait();
  } catch (...) {
    submitter_missed_ = true;  // close() then gives it kStuckGraceSeconds only
    throw;
  }
}

void DevicePipeline::start(std::vector<int64_t> indices, bool drop_last, uint64_t epoch, double timeout_s,
                           const std::function<void()>& poll) {
  {
    // Batches issued for the abandoned pass are dropped (once their work is queued): their slots are
    // free again once the copy stream passes them (the next copy into a slot is queued behind them anyway).
    if (submitter_)
      wait_for_submitter([&] { submitter_->wait_idle(timeout_s, poll, "queuing the last pass's device work"); });
    std::lock_guard<std::mutex> lk(state_->mu);
    for (const Issued& i : state_->issued)
      if (i.slot >= 0) state_->slots[i.slot].state = DeviceSlot::State::kFree;
    state_->issued.clear();
  }
  reader_->start(std::move(indices), drop_last, epoch);
}

bool DevicePipeline::issue(bool block, double timeout_s, const std::function<void()>& poll) {
  PipelineState& st = *state_;
  int slot = -1;
  {
    std::lock_guard<std::mutex> lk(st.mu);
    st.finish_releases();
    for (size_t s = 0; s < st.slots.size() && slot < 0; ++s)
      if (st.slots[s].state == DeviceSlot::State::kFree) slot = static_cast<int>(s);
  }
  if (slot < 0 && !block) return false;  // look-ahead waits for a slot the consumer gives back
  std::shared_ptr<Lease> lease;
  if (block) {
    lease = reader_->next(timeout_s, poll);
  } else {
    bool end = false;
    lease = reader_->try_next(&end);
  }
  if (!lease) return false;
  Issued item{slot, nullptr, lease->records(), nullptr, nullptr, nullptr};
  std::unique_lock<std::mutex> lk(st.mu);
  if (slot >= 0 && st.slots[slot].state != DeviceSlot::State::kFree) slot = -1;  // taken meanwhile: none is
  if (slot < 0) {
    for (size_t s = 0; s < st.slots.size() && slot < 0; ++s)
      if (st.slots[s].state == DeviceSlot::State::kFree) slot = static_cast<int>(s);
  }
  if (slot >= 0) {
    DeviceSlot& s = st.slots[slot];
    s.state = DeviceSlot::State::kIssued;
    for (size_t k = 0; k < s.released; ++k) device_->wait(st.copy, s.release[k]);  // the consumer's last use
    // A batch never handed out (a pass abandoned) may still be resampled into the slot on a lane.
    if (st.lanes) device_->wait(st.copy, s.ready);
    s.released = 0;
    item.slot = slot;
    item.base = st.arena + static_cast<int64_t>(slot) * st.slot_bytes;
    item.ready = s.ready;
  } else {
    if (!st.overflow)
      throw Error(ErrorKind::kTimeout,
                  "all " + std::to_string(st.slots.size()) +
                      " device slots are held by batches you still reference, so the next batch has nowhere to "
                      "go (when_full='error'). A slot is reused only after every tensor of its batch is freed: "
                      "drop references to earlier batches, copy the ones you keep (batch.clone()), create the "
                      "Loader with a larger prefetch (slots = prefetch + 2), or use when_full='allocate'.");
    lk.unlock();
    OverflowBuffer buf = st.overflow(st.slot_bytes, st.copy);
    // The allocator may hand back memory that work already queued on the consumer's stream still reads
    // (a caching allocator reuses a block at once for the stream it is allocated on): the copy into it
    // waits for that work.
    Stream* consumer = device_->consumer_stream();
    device_->record(st.overflow_alloc, consumer);
    device_->wait(st.copy, st.overflow_alloc);
    lk.lock();
    item.base = buf.data;
    item.overflow = std::move(buf.keep);
    item.ready = st.overflow_ready;
    ++st.overflow_batches;
  }
  if (submitter_) {
    item.submission = submitter_->post([state = state_, job = Job{std::move(lease), item.base, item.ready, item.slot}] {
      state->run(job);
    });
    st.issued.push_back(std::move(item));
    return true;
  }
  try {
    st.enqueue(*lease, item.base, item.ready, item.slot < 0);
  } catch (const Error&) {
    // A copy or kernel the device refused. The batch fails at its own turn, after the batches issued
    // before it (never silently: the reader has moved past it), and its slot is free again (work queued
    // into it before the failure runs before any later copy into it: the copy stream is in order). The
    // copies queued before the failure still read the host slot: it is fenced as after a whole batch
    // (unless the device refuses that too; then nothing can order them).
    try {
      st.fences->record(lease->slot(), st.copy);
    } catch (const Error&) {
    }
    if (item.slot >= 0) st.slots[item.slot].state = DeviceSlot::State::kFree;
    item.slot = -1;
    item.overflow.reset();
    item.error = std::current_exception();
  }
  st.issued.push_back(std::move(item));
  return true;
}

std::shared_ptr<DeviceBatch> DevicePipeline::next(double timeout_s, const std::function<void()>& poll) {
  PipelineState& st = *state_;
  DeviceGuard guard(*device_);
  Stream* consumer = device_->consumer_stream();
  // The wait for the batch's copy would become a node of the graph and its slot be read at every replay,
  // long after it was reused.
  if (device_->capturing(consumer))
    throw Error(ErrorKind::kState,
                "next() was called while the current CUDA stream is capturing a graph: take batches from the "
                "Loader outside the capture and copy them into the graph's static inputs "
                "(static_x.copy_(batch['x']) before graph.replay())");
  bool have;
  {
    std::lock_guard<std::mutex> lk(st.mu);
    have = !st.issued.empty();
  }
  if (!have && !issue(true, timeout_s, poll)) return nullptr;  // the pass is over
  std::shared_ptr<SerialWorker::Ticket> submission;
  {
    std::lock_guard<std::mutex> lk(st.mu);
    submission = st.issued.front().submission;
  }
  std::exception_ptr submit_error;
  if (submission)
    wait_for_submitter(
        [&] { submit_error = submitter_->wait(*submission, timeout_s, poll, "queuing the next batch's device work"); });
  Issued item;
  {
    std::lock_guard<std::mutex> lk(st.mu);
    item = std::move(st.issued.front());
    if (submit_error) {
      item.slot = -1;  // freed by the submitter
      item.error = submit_error;
    }
    st.issued.pop_front();
    if (item.error) std::rethrow_exception(item.error);
    if (item.slot >= 0) {
      st.slots[item.slot].state = DeviceSlot::State::kLeased;
      ++st.leased;
    }
  }
  device_->wait(consumer, item.ready);
  auto batch =
      std::make_shared<DeviceBatch>(state_, item.slot, item.base, item.records, consumer, std::move(item.overflow));
  // Issue the next batches now, so that their copies overlap the consumer's work on this one. A read
  // error is sticky in the reader: it surfaces at its own batch, from the blocking issue above; a
  // device error is kept in its batch's Issued.
  try {
    for (;;) {
      {
        std::lock_guard<std::mutex> lk(st.mu);
        if (st.issued.size() >= kIssueAhead) break;
      }
      if (!issue(false, timeout_s, poll)) break;
    }
  } catch (const Error&) {
  }
  return batch;
}

void DevicePipeline::close(double timeout_s, const std::function<void()>& poll) {
  if (!reader_) return;
  reader_->close();
  if (current_pid() != state_->owner_pid) return;
  // The submitter queues what was issued, then ends. One stuck in a device call (a wait for it already
  // ran out, or is cut short here) is left running: its task holds what it touches.
  if (submitter_ && !submitter_->stop(submitter_missed_ ? kStuckGraceSeconds : timeout_s, poll))
    report_teardown_failure("waiting for the loader's submitter thread at close()",
                            "a device call it made has not returned; the thread is left running");
  try {  // a device that failed (a sticky error) cannot be waited for: reported, and close() goes on
    DeviceGuard guard(*device_);
    refuse_teardown_in_capture(*device_);
    state_->fences->wait_all();
  } catch (const std::exception& e) {
    report_teardown_failure("waiting for the loader's copies at close()", e.what());
  }
}

const std::vector<OutputLayout>& DevicePipeline::outputs() const { return state_->outputs; }

int64_t DevicePipeline::slot_bytes() const { return state_->slot_bytes; }

DeviceStats DevicePipeline::stats() const {
  std::lock_guard<std::mutex> lk(state_->mu);
  DeviceStats s;
  s.device_arena_bytes = state_->slot_bytes * static_cast<int64_t>(state_->slots.size());
  s.device_slots = static_cast<int>(state_->slots.size());
  s.device_slots_leased = state_->leased;
  s.overflow_batches = state_->overflow_batches;
  s.images_decoded_on_device = state_->lanes ? state_->lanes->on_device() : 0;
  s.images_decoded_on_host = state_->lanes ? state_->lanes->on_host() : 0;
  s.images_decoded_planar = state_->lanes ? state_->lanes->planar() : 0;
  s.images_decoded_after_refusal = state_->lanes ? state_->lanes->after_refusal() : 0;
  if (state_->lanes) s.jpeg_decoder = device_->jpeg_decoder();
  return s;
}

void DevicePipeline::set_skip_release_fence(bool on) { state_->skip_release_fence = on; }

}  // namespace fastpipe
