// Where a column's bytes come from: the one interface through which the reader, its gather and the image
// columns read records. A local file (file.h) is today's kind, in three modes (buffered pread, O_DIRECT
// pread, a SIGBUS-guarded mapping); a remote shard staged in a local cache is written against this
// interface alone, without edits to the reader, the gather or the device pipeline.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/function_ref.h"
#include "core/io_mode.h"

namespace fastpipe {

class RecordSource {
 public:
  virtual ~RecordSource() = default;

  // What messages call it: its path (a remote source: its URL).
  virtual const std::string& path() const = 0;
  // How the gather reads it: kMmap (records visited in place, visit_mapped), kDirect (reads aligned to
  // kDirectAlign through a bounce buffer) or kPread (any range, runs coalesced).
  virtual IoMode mode() const = 0;
  // Why it is read in another mode than asked for (O_DIRECT refused by the filesystem), or "".
  virtual const std::string& fallback_reason() const = 0;
  virtual int64_t size_at_open() const = 0;
  virtual int64_t mtime_ns_at_open() const = 0;
  // Its size now: after reading, the gather checks that the source still covers what it read (a file
  // truncated or replaced under the reader is an error naming the record, never garbage).
  virtual int64_t current_size() const = 0;

  // Copies up to len bytes at `offset` into dst; returns the bytes read (< len only at the end).
  virtual int64_t read_at_most(void* dst, int64_t len, int64_t offset) const = 0;

  // kMmap only: calls fn(ctx, k, src) for each range [offsets[k], offsets[k] + len) in place. Returns
  // false if a range could not be read (a fault); `*done` is the number of leading ranges visited.
  using MappedVisitor = void (*)(void* ctx, int64_t k, const char* src);
  virtual bool visit_mapped(const int64_t* offsets, int64_t count, int64_t len, MappedVisitor fn, void* ctx,
                            int64_t* done) const = 0;

  // Hints, free to ignore: [offset, offset + len) is read soon (start fetching it); and, kMmap, map
  // its pages now so that no record pays a fault on first touch.
  virtual void will_need(int64_t offset, int64_t len) const = 0;
  virtual void populate(int64_t offset, int64_t len) const = 0;
};

// Opens `path` read-only in `mode` (kMmap, kPread or kDirect; kDirect may fall back to kPread, saying
// why). `random_access`: records are small and read in random order (no read-ahead of a mapping).
std::unique_ptr<RecordSource> open_record_source(const std::string& path, IoMode mode, bool random_access = false);

// The shards of a sharded source opened by index, when they are not plain local files (remote shards
// streaming through a cache: core/shard_stream.h). open() may wait for the shard to arrive; a reader
// thread ends such waits by installing a SourceWaitCancel.
class ShardOpener {
 public:
  virtual ~ShardOpener() = default;
  virtual size_t num_shards() const = 0;
  virtual std::unique_ptr<RecordSource> open(int32_t shard) = 0;
};

// The calling thread's stop flag for waits inside a ShardOpener, while this lives: a wait that sees it
// set ends with an Error (a Loader closed while a shard is on its way).
class SourceWaitCancel {
 public:
  explicit SourceWaitCancel(FunctionRef<bool()> stopped);
  ~SourceWaitCancel();
  SourceWaitCancel(const SourceWaitCancel&) = delete;
  SourceWaitCancel& operator=(const SourceWaitCancel&) = delete;

 private:
  const FunctionRef<bool()>* previous_;
  FunctionRef<bool()> stopped_;
};

// Whether the calling thread's SourceWaitCancel, if any, says stop.
bool source_wait_cancelled();

}  // namespace fastpipe
