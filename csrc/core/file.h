// A read-only local file with the three access paths the reader uses: buffered pread, O_DIRECT pread and
// a shared read-only mapping whose faults (the file shrank) are caught instead of killing the process;
// the reader reads it as a RecordSource (record_source.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/io_mode.h"
#include "core/record_source.h"

namespace fastpipe {

// The size and modification time (ns) of `path`, without opening it; false when it cannot be stat'ed.
bool stat_path(const std::string& path, int64_t* bytes, int64_t* mtime_ns);

// Alignment of O_DIRECT offsets, lengths and buffers; 4096 satisfies every common logical block size.
constexpr int64_t kDirectAlign = 4096;

class File final : public RecordSource {
 public:
  // Opens `path` read-only with mode kMmap, kPread or kDirect. kDirect falls back to kPread when the
  // filesystem refuses O_DIRECT; fallback_reason() then says why. kMmap maps the whole file;
  // `random_access` turns off the mapping's read-ahead (for small records read in random order).
  File(const std::string& path, IoMode mode, bool random_access = false);
  ~File() override;
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  const std::string& path() const override { return path_; }
  IoMode mode() const override { return mode_; }
  const std::string& fallback_reason() const override { return fallback_reason_; }
  int64_t size_at_open() const override { return size_at_open_; }
  int64_t mtime_ns_at_open() const override { return mtime_ns_at_open_; }
  int64_t current_size() const override;

  // Asks the kernel to read [offset, offset + len) into the page cache, asynchronously (POSIX_FADV_WILLNEED;
  // the kernel reads at most about one read-ahead window per call, so callers step through a file).
  void will_need(int64_t offset, int64_t len) const override;

  // Maps the pages of [offset, offset + len) into the mapping now, reading them if needed (kMmap only;
  // a no-op on kernels without MADV_POPULATE_READ).
  void populate(int64_t offset, int64_t len) const override;

  // pread loop over partial reads and EINTR; returns the bytes read (< len only at end of file).
  int64_t read_at_most(void* dst, int64_t len, int64_t offset) const override;

  // Calls fn(ctx, k, src) for each mapped range [offsets[k], offsets[k] + len) (kMmap only). Returns
  // false if a page of a range faulted (SIGBUS: the file shrank under the mapping); `*done` is set to
  // the number of leading ranges visited.
  bool visit_mapped(const int64_t* offsets, int64_t count, int64_t len, MappedVisitor fn, void* ctx,
                    int64_t* done) const override;

 private:
  std::string path_;
  IoMode mode_;
  std::string fallback_reason_;
  int fd_ = -1;
  int64_t size_at_open_ = 0;
  int64_t mtime_ns_at_open_ = 0;
  const char* map_ = nullptr;
  size_t map_len_ = 0;
};

// Installs the handler that turns SIGBUS in File::visit_mapped into an error, if it is not installed
// (again: a handler installed after ours, such as faulthandler's, takes precedence until this runs).
void ensure_sigbus_handler();

// Page-aligned anonymous memory; freed on destruction.
class AlignedBuffer {
 public:
  explicit AlignedBuffer(size_t bytes);
  ~AlignedBuffer();
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  char* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  char* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace fastpipe
