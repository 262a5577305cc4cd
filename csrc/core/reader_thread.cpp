#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/gather_policy.h"
#include "core/reader_placement.h"
#include "core/reader_state.h"
#include "core/trace.h"

namespace fastpipe {
namespace {

// The record that stands in for bad image `index` at try `attempt` of `epoch`: a pure function, so a
// run with on_error="replace" reproduces and resumes exactly.
int64_t substitute(uint64_t seed, uint64_t epoch, int64_t index, int attempt, int64_t n) {
  const uint64_t bits = transforms::sample_bits(seed ^ 0x5ca1ab1eULL, epoch, static_cast<uint64_t>(index),
                                                0x100 + static_cast<uint64_t>(attempt));
  return static_cast<int64_t>(bits % static_cast<uint64_t>(n));
}

// Every image column of the slot's record `pos`, from `record` (its random crop and flip are those of
// sample `draw`). Returns the bytes read.
int64_t read_images_of(ReaderState& st, int64_t record, int64_t draw, int64_t pos, char* base, uint64_t epoch,
                       ThreadBuffers& tb) {
  int64_t bytes = 0;
  for (const Column& c : st.columns) {
    if (!c.spec.image) continue;
    auto at = [&](int k) {
      const OutputLayout& out = st.outputs[c.first_output + k];
      return base + out.offset + pos * out.record_bytes;
    };
    if (c.spec.image->device_decode) {
      bytes += read_image_for_device(*c.spec.image, c.source.get(), record, draw, epoch,
                                     reinterpret_cast<images::ImageDesc*>(at(0)), reinterpret_cast<uint8_t*>(at(1)),
                                     at(2), *tb.image);
    } else {
      bytes += read_image(*c.spec.image, c.source.get(), record, draw, epoch, at(0), *tb.image);
    }
  }
  return bytes;
}

// The images of chunk record k (the slot's record pos); a bad one is replaced
// (OnError::kReplace) by substitutes drawn until one reads, and idx[k] becomes that record.
int64_t read_images_or_replace(ReaderState& st, int64_t* idx, int64_t k, int64_t pos, char* base, uint64_t epoch,
                               ThreadBuffers& tb) {
  const int64_t original = idx[k];
  try {
    return read_images_of(st, original, original, pos, base, epoch, tb);
  } catch (const Error& e) {
    if (st.opt.on_error != OnError::kReplace) throw;
    const std::string why = e.what();
    for (int attempt = 0; attempt < kMaxSubstitutes; ++attempt) {
      const int64_t j = substitute(st.opt.seed, epoch, original, attempt, st.num_records);
      try {
        const int64_t bytes = read_images_of(st, j, original, pos, base, epoch, tb);
        idx[k] = j;
        std::lock_guard<std::mutex> lk(st.mu);
        ++st.images_replaced;
        if (st.replace_log.size() < kReplaceLogSize)
          st.replace_log.push_back(why + " (sample " + std::to_string(original) + " of epoch " + std::to_string(epoch) +
                                   " replaced by record " + std::to_string(j) + ")");
        return bytes;
      } catch (const Error&) {
      }
    }
    throw Error(ErrorKind::kValue, why + "; on_error='replace' drew " + std::to_string(kMaxSubstitutes) +
                                       " other records for it and none could be read either");
  }
}

// Reader thread t warms the files t, t + threads, ... (gather.h: warm_file).
void warm_files(ReaderState& st, int thread_index) {
  auto stopped = [&] {
    std::lock_guard<std::mutex> lk(st.mu);
    return st.stop;
  };
  for (size_t k = thread_index; k < st.columns.size(); k += st.opt.num_threads)
    if (st.columns[k].source) warm_source(*st.columns[k].source, stopped);
}

}  // namespace

void read_chunk(ReaderState& st, const WorkItem& w, ThreadBuffers& tb, int64_t* bytes) {
  char* base = st.slot_data(w.slot);
  if (st.opt.before_slot_fill) st.opt.before_slot_fill(w.slot);
  if (st.poison.load(std::memory_order_relaxed))
    for (const OutputLayout& out : st.outputs)
      std::memset(base + out.offset + w.first * out.record_bytes, 0xA5, static_cast<size_t>(w.count * out.record_bytes));
  *bytes = fill_records(st, w.indices->data() + w.batch * st.opt.batch_size + w.first, w.count, base, w.first, w.epoch,
                        tb);
}

int64_t fill_records(ReaderState& st, const int64_t* records, int64_t count, char* base, int64_t first, uint64_t epoch,
                     ThreadBuffers& tb) {
  const int64_t n = st.num_records;
  for (int64_t k = 0; k < count; ++k) {
    if (records[k] < 0 || records[k] >= n)
      throw Error(ErrorKind::kValue, "record index " + std::to_string(records[k]) + " is out of range for a dataset of " +
                                         std::to_string(n) + " records");
  }
  const int64_t* idx = records;
  int64_t bytes = 0;
  if (tb.image) {
    // A bad image may be replaced by another record: the other columns then read that one.
    tb.chunk_index.assign(records, records + count);
    int64_t* chunk = tb.chunk_index.data();
    for (const Column& c : st.columns)
      if (c.spec.image) will_need_images(*c.spec.image, c.source.get(), chunk, count);
    for (int64_t k = 0; k < count; ++k) bytes += read_images_or_replace(st, chunk, k, first + k, base, epoch, tb);
    idx = chunk;
  }
  for (const Column& c : st.columns) {
    if (c.spec.image) continue;
    const OutputLayout& out = st.outputs[c.first_output];
    const int64_t y_delta = c.num_outputs() == 2 ? st.outputs[c.first_output + 1].offset - out.offset : 0;
    read_records(c, idx, count,
                 Sink{&c, base + out.offset + first * out.record_bytes, out.record_bytes, y_delta, idx, epoch}, tb);
    bytes += count * c.spec.record_bytes;
  }
  if (st.opt.index_output) std::memcpy(base + st.index_offset + first * 8, idx, static_cast<size_t>(count * 8));
  return bytes;
}

void reader_loop(std::shared_ptr<ReaderState> sp, int thread_index) {
  ReaderState& st = *sp;
  const LoaderThreadScope not_the_step;  // GatherIn::kAuto measures the step's CPU without the readers'
  CoreAvoider placement;
  ThreadBuffers tb = thread_buffers(st.columns, st.chunk_records);
  if (st.warm_page_cache) warm_files(st, thread_index);
  auto stopped = [&] {
    std::lock_guard<std::mutex> lk(st.mu);
    return st.stop;
  };
  const SourceWaitCancel cancel(stopped);  // a closed loader ends a wait for a remote shard

  std::unique_lock<std::mutex> lk(st.mu);
  for (;;) {
    st.wait_for_work(lk, thread_index);
    if (st.stop) return;
    if (st.parked(thread_index)) {
      st.park(lk, thread_index);
      continue;
    }
    if (st.copying_readers && st.consumers_reading > 0 &&
        st.readers_reading + st.consumers_reading + 1 > st.cores) {  // see cores
      ++st.stepped_back;
      st.work_cv.wait_for(lk, kPollInterval);
      continue;
    }
    const WorkItem w = take_chunk_locked(st, thread_index);
    const bool more = st.has_work();  // hand the rest to a sleeping reader, whoever is polling
    const int spare_cpu = st.spare_cpu;
    if (st.hold_reads.load(std::memory_order_relaxed)) {  // test hook: a stalled read, until released
      ++st.held_reads;
      st.gate_cv.wait(lk, [&] { return st.stop || !st.hold_reads; });
      --st.held_reads;
      if (st.stop) return;
    }
    ++st.readers_reading;
    lk.unlock();
    if (more) st.work_cv.notify_one();
    placement.keep_off(spare_cpu);

    const std::exception_ptr err = read_chunk_counted(st, w, tb);
    lk.lock();
    --st.readers_reading;
    if (finish_chunk_locked(st, w, err)) {
      lk.unlock();
      st.ready_cv.notify_one();
      lk.lock();
    }
  }
}

std::exception_ptr read_chunk_counted(ReaderState& st, const WorkItem& w, ThreadBuffers& tb) {
  std::exception_ptr err;
  const auto t0 = Clock::now();
  int64_t bytes = 0;
  try {
    trace::Range range("fastpipe::loader.read");
    read_chunk(st, w, tb, &bytes);
  } catch (...) {
    err = std::current_exception();
  }
  st.read_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
  if (!err) st.bytes_read += bytes;
  return err;
}

WorkItem take_chunk_locked(ReaderState& st, int filler) {
  WorkItem w;
  w.gen = st.gen;
  w.batch = st.next_batch;
  w.indices = st.indices;
  w.epoch = st.epoch;
  const int64_t nchunks = st.batch_chunks(w.batch);
  if (st.next_chunk == 0) st.claim_slot_locked(w.batch, filler);
  w.slot = st.ring[w.batch % st.opt.prefetch];
  w = chunk_of(st, w, st.next_chunk);
  if (++st.next_chunk == nchunks) {
    st.next_chunk = 0;
    ++st.next_batch;
  }
  return w;
}

bool finish_chunk_locked(ReaderState& st, const WorkItem& w, std::exception_ptr err) {
  Slot& slot = st.slots[w.slot];
  if (err && !slot.error) slot.error = err;
  if (--slot.pending > 0) return false;
  if (slot.gen != st.gen) {
    st.release_slot_locked(w.slot);  // the pass it belonged to was abandoned; next() may wait for a free slot
  } else {
    slot.state = SlotState::kReady;
  }
  return true;
}

}  // namespace fastpipe
