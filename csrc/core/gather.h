// Reading records from files into batch slots: the read-mode and sizing policies, a column's open
// file, and the gather of one chunk of records (coalesced pread, O_DIRECT through a bounce buffer, or
// memcpy from a mapping; token windows widened and images transformed on the way). batch_reader.h
// schedules these reads.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/file.h"
#include "core/record_source.h"
#include "core/image_column.h"
#include "core/io_mode.h"
#include "kernels/transforms.h"

namespace fastpipe {

// One column of records in a file. Record i occupies bytes
// [data_offset + i * record_stride, + record_bytes) of the file.
struct ColumnSpec {
  std::string path;
  int64_t data_offset = 0;
  int64_t record_stride = 0;
  int64_t record_bytes = 0;
  int64_t num_records = 0;
  // Token windows: 0 copies records as they are (one output). Otherwise a record holds
  // record_bytes / token_bytes tokens that are widened to int64 into two outputs, x = tokens[:-1]
  // and y = tokens[1:].
  int token_bytes = 0;
  bool token_signed = false;
  // Images transformed on the way (fastpipe.transforms.CropMirrorNormalize on the CPU): records are
  // uint8 images and the output holds the transformed ones. Null: records are copied as they are.
  std::shared_ptr<const transforms::CropMirrorNormalizeParams> cmn;
  // Encoded JPEG images (core/image_column.h), decoded and transformed into fixed-size outputs: the
  // record fields above are unused (path names the source for messages).
  std::shared_ptr<const ImageColumnSpec> image;
};

// ---- policies, as pure functions (the reader applies them; tests check them on any figures) ----------
// How a column is read: as `io` says, or for kAuto a mapping, except records of 64 KiB or more whose
// data exceeds half the available memory, read with O_DIRECT.
IoMode choose_mode(IoMode io, int64_t record_bytes, int64_t total_data_bytes, int64_t mem_available);
// Reader threads when none are asked for: the cores, 2 to 8, or where records decode (images) every core
// but the training loop's (at least 2); at least 16 when a column is read with O_DIRECT (its threads
// mostly wait on the device).
int default_num_threads(long cores, bool any_direct, bool decodes);
// Batches read ahead when none are asked for: about 8 MiB of batches, 2 to 16 (small batches need a
// deeper queue to keep the readers busy between the training loop's requests).
int default_prefetch(int64_t batch_bytes);
// Records per work item (chunk) of a batch. Records that decode (images, milliseconds each): at most
// kImageChunk, small chunks that keep the threads evenly busy. Records that are copied: as few chunks as
// leave each reader thread, and next() reading beside them, two in the read-ahead window (`prefetch`
// batches), each at least share_records() and at most about 1 MiB: every hand-off of a chunk takes the
// loader's lock and often wakes a thread (issue 41, 2 cores, loader alone: CIFAR-like batches of 512 in
// chunks of 171 / 256 / 340 / 512 records read 0.98 / 1 / 1.03 / 1.09x as fast).
int64_t chunk_records(int64_t batch_size, int prefetch, int num_threads, int64_t record_bytes, bool decodes = false);
// The fewest records next() gives one of torch's threads when it reads a batch itself (at least
// kMinChunkBytes' worth of copied records, one image).
int64_t share_records(int64_t record_bytes, bool decodes);

int64_t mem_available_bytes();
long usable_cores();

// ---- a column being read ---------------------------------------------------------------------------
using WidenFn = void (*)(const char* src, int64_t block, int64_t* x, int64_t* y);
// Widens one window of block + 1 tokens of `bytes` each into x = tokens[:-1] and y = tokens[1:].
WidenFn widen_for(int bytes, bool is_signed);

struct Column {
  ColumnSpec spec;
  std::unique_ptr<RecordSource> source;  // null for an image folder (a file per record)
  int first_output = 0;  // index into the reader's outputs
  WidenFn widen = nullptr;
  bool raw = false;  // delivered as its records, without widening or transforming (a device does that)

  // Records are converted on the way into the slot (pread lands them in a scratch buffer first).
  // Images are always decoded here, also for a device.
  bool converts() const { return spec.image || (!raw && (widen || spec.cmn)); }
  // How the column is read, for stats: an io mode's name, or "files" for an image folder.
  std::string io_name() const;
  // Outputs in the slot (x and y for token windows) and the bytes of each per record.
  int num_outputs() const {
    if (spec.image) return spec.image->device_decode ? kDeviceDecodeOutputs : 1;
    return converts() && widen ? 2 : 1;
  }
  int64_t output_record_bytes(int output = 0) const;
};

// Opens a column for reading with `mode` (kMmap, kPread or kDirect) and checks that the file covers
// its records (and, for a transform, that records are images of its input shape). `raw`: deliver the
// records as they are. Throws Error(kValue) naming the file.
Column open_column(ColumnSpec spec, IoMode mode, bool raw);

// Per-thread buffers, allocated once per thread.
struct ThreadBuffers {
  std::unique_ptr<AlignedBuffer> bounce;   // O_DIRECT
  std::unique_ptr<AlignedBuffer> scratch;  // records read with pread before they are converted
  std::unique_ptr<ImageThreadState> image;  // the JPEG decoder and its buffers
  std::vector<int64_t> chunk_index;  // with images: the chunk's record numbers, after replacing bad ones
  std::vector<int64_t> offsets;
  std::vector<int64_t> order;
};

// The buffers a reader thread needs for `columns` when a chunk holds `chunk` records.
ThreadBuffers thread_buffers(const std::vector<Column>& columns, int64_t chunk);

// Where record k of a chunk lands in the slot: copied to dst + k * stride; or for token windows widened
// into x there and y at y_delta further; or for images transformed there (record k is sample idx[k] of
// `epoch`, whose random crop and flip it is).
struct Sink {
  const Column* col;
  char* dst;
  int64_t stride;
  int64_t y_delta;
  const int64_t* idx;
  uint64_t epoch;
  void put(int64_t k, const char* src) const;
};

// Reads records idx[0..count) of column c into `sink`. Throws Error(kIO) naming the file, the record
// and its offset when the file no longer covers it (it shrank while being read).
void read_records(const Column& c, const int64_t* idx, int64_t count, const Sink& sink, ThreadBuffers& tb);

// Queues a whole file for reading into the page cache, one read-ahead window per call, so that the
// first pass over data that was not cached reads sequentially instead of one page per random record;
// then (populate) maps every page of a mapped file, so that no record pays a page fault on first touch.
// Returns early when stopped() says so.
void warm_source(const RecordSource& f, const std::function<bool()>& stopped, bool populate = true);

}  // namespace fastpipe
